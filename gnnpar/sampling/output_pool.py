"""Per-thread pools of host output buffers for the sampler's row gathers
(:mod:`gnnpar.sampling.row_gather`): a fresh output of a few MB per minibatch page-faults on
first write, and the allocator maps new pages for most of them when several sampler workers
allocate; a pooled buffer is lent again only once nothing outside the pool can reach it."""
from __future__ import annotations

import threading
import weakref
from typing import List, Optional

import torch


def new_rows(like: torch.Tensor, n: int) -> torch.Tensor:
    """An uninitialised (n, f) tensor like ``like``'s rows, pooled on the CPU."""
    return pooled_outputs(like, [int(n)])[0]


def pooled_outputs(src: torch.Tensor, sizes) -> List[torch.Tensor]:
    """One (n, f) output per size, from this thread's :class:`OutputPool`. Host tensors
    only: a device buffer may still be read by queued kernels when its last Python holder
    goes."""
    if src.device.type != "cpu":
        return [src.new_empty((n, src.shape[1])) for n in sizes]
    pool = getattr(_pools, "pool", None)
    if pool is None:
        pool = _pools.pool = OutputPool()
    return pool.take(src, sizes)


class OutputPool:
    """Output buffers of one thread, each lent again only once nothing outside the pool can
    reach its memory.

    A fresh output of a few MB per minibatch page-faults on first write; a kept buffer's
    pages are already mapped. A buffer is lent as a tensor whose storage is made for that
    loan (``torch.from_numpy`` over a numpy view of the buffer's bytes, the view made for
    that loan only). That storage holds the view, and the pool keeps only a weak reference
    to it: the view lives exactly as long as the storage does. Whatever can still reach the
    memory reaches it through that storage: the tensor lent, its views and ``_base``,
    the ``UntypedStorage`` or ``TypedStorage`` object, numpy arrays and DLPack capsules over
    it, another tensor ``set_`` onto that storage. While any of them is alive the storage
    is, so the view is, and the buffer is busy. Nothing private of torch is asked.

    At most ``limit`` buffers are kept; a buffer serves a need of at least half its bytes
    (any dtype: a buffer is bytes), so small needs do not pin big buffers.
    """

    def __init__(self, limit: int = 32):
        self.limit = int(limit)
        self.buffers: List[_Buffer] = []

    def take(self, like: torch.Tensor, sizes) -> List[torch.Tensor]:
        """One (n, f) tensor like ``like``'s rows per size, none sharing memory with
        another or with anything still held. Kept buffers nothing reaches serve the needs
        they fit first; only the needs left over replace a free buffer or get a fresh one
        (so a free buffer is not evicted for a need that another one could serve). An empty
        need gets an empty tensor, not a buffer."""
        f, taken = like.shape[1], set()
        needs = [_nbytes(like, n) for n in sizes]
        slots = []
        for need in needs:
            i = self._free(need, taken) if need else None
            if i is not None:
                taken.add(i)
            slots.append(i)
        out = []
        for n, need, i in zip(sizes, needs, slots):
            if i is None and need:
                i = self._slot(taken)
                if i is not None:
                    # an eighth more for the next needs
                    buf = _Buffer(like, _nbytes(like, n + n // 8))
                    if i == len(self.buffers):
                        self.buffers.append(buf)
                    else:
                        self.buffers[i] = buf
                    taken.add(i)
            if i is None:  # empty, or every kept buffer is held: a fresh one, not kept
                out.append(like.new_empty((n, f)))
            else:
                out.append(self.buffers[i].lend(like.dtype, n, f))
        return out

    def _free(self, need: int, taken):
        """A kept buffer nothing reaches with ``need`` to twice ``need`` bytes, or None."""
        for i, b in enumerate(self.buffers):
            if i not in taken and need <= b.nbytes <= 2 * max(need, 1) and b.free():
                return i
        return None

    def _slot(self, taken):
        """Where a new buffer goes: a new slot below the limit, else the place of a kept
        buffer nothing reaches; None when all are held."""
        if len(self.buffers) < self.limit:
            return len(self.buffers)
        for i, b in enumerate(self.buffers):
            if i not in taken and b.free():
                return i
        return None


class _Buffer:
    """The bytes of one pooled output (allocated by torch: 64-byte aligned) and a weak
    reference to the numpy view its current loan's storage holds."""

    __slots__ = ("memory", "loan")

    def __init__(self, like: torch.Tensor, nbytes: int):
        self.memory = like.new_empty((nbytes,), dtype=torch.uint8).numpy()
        self.loan: Optional[weakref.ref] = None

    @property
    def nbytes(self) -> int:
        return int(self.memory.shape[0])

    def free(self) -> bool:
        """Whether no storage made by :meth:`lend` is alive (so nothing outside the pool can
        reach these bytes)."""
        return self.loan is None or self.loan() is None

    def lend(self, dtype: torch.dtype, n: int, f: int) -> torch.Tensor:
        """An (n, f) ``dtype`` tensor over the first bytes, on a storage made for this loan."""
        view = self.memory[:n * f * dtype.itemsize]
        self.loan = weakref.ref(view)
        return torch.from_numpy(view).view(dtype).view(n, f)


def _nbytes(like: torch.Tensor, n: int) -> int:
    """Bytes of n rows of ``like``."""
    return int(n) * int(like.shape[1]) * like.element_size()


_pools = threading.local()
