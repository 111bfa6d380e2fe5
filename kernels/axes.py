"""How one grid axis moves rows in and partial sums out of a block product.

A block product gathers the input rows it reads along one axis and, in 2D, reduces the partial
output rows along another. Two strategies, chosen once when an operator is built (``--variant``):

- :class:`DenseAxis` (``bcast``): all-gather every member's rows in, reduce-scatter out; a
  position on the axis is the member's offset plus its local row;
- :class:`HaloAxis` (``halo``): only the rows some non-zero touches move — a compacted plan
  (:class:`~gnnpar.kernels.halo.HaloPlan`), own rows first, then the touched remote rows.

Each gives what the overlapped product (:mod:`kernels.overlap`) asks of an axis: its ``cut``
(which positions this rank holds), ``start_gather``, ``start_reduce`` and ``finish_reduce``;
and, for the edge-valued operations (:mod:`kernels.edge_block`), the same moves whole and
blocking between owned rows and the axis's positions (:class:`Positions`), and a reduction
by maximum.
"""
from __future__ import annotations

import numpy as np
import torch

from .blocks import compact_plan
from .comm import Comm
from .overlap import Cut


class Positions:
    """Owned rows ↔ an axis's positions, each move blocking (``t`` 2-D, rows first):
    :meth:`gather` gives every position's row (each from its owner), :meth:`reduce` sums each
    position's partial rows into their owners' rows — adjoints of each other."""

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        rest = self.start_gather(t).wait().to(t.dtype)
        return rest if self.cut.offset == 0 else torch.cat([t, rest])

    def reduce(self, full: torch.Tensor) -> torch.Tensor:
        lo, hi, offset = self.cut
        if offset == 0:  # every position travels; the own ones as zeros
            send = full.clone()
            send[lo:hi] = 0
        else:
            send = full[hi:].contiguous()
        return self.finish_reduce(full[lo:hi].clone(), self.start_reduce(send).wait())


class DenseAxis(Positions):
    """Variant ``bcast`` on one axis (module docstring); ``sizes``: every member's rows."""

    def __init__(self, comm: Comm, axis, sizes):
        self.comm, self.axis, self.sizes = comm, axis, [int(s) for s in sizes]
        self.width = sum(self.sizes)
        me = comm.grid.ranks_of(axis).index(comm.grid.rank)
        lo = sum(self.sizes[:me])
        # own rows [lo, lo + n_me); the rest keep their full positions (own ones empty)
        self.cut = Cut(lo, lo + self.sizes[me], 0)

    @classmethod
    def build(cls, comm: Comm, axis, member, local, sizes, n_own, device=None):
        """(positions of the non-zeros on the axis, the strategy)."""
        return np.concatenate([[0], np.cumsum(sizes)])[member] + local, cls(comm, axis, sizes)

    def start_gather(self, h):
        return _Stacked(self.comm.start_all_gather(h, self.axis, self.sizes))

    def start_reduce(self, y_send):
        """Partial sums of every member's rows (own rows zero): the others' sums come back."""
        return self.comm.start_reduce_scatter(y_send, self.axis, self.sizes)

    def finish_reduce(self, y_own, received):
        return y_own.add_(received)

    def reduce_max(self, full: torch.Tensor) -> torch.Tensor:
        """Each owned row's largest value over the members' partial rows (``full``: every
        position), by one all-to-all of the bytes of a reduce-scatter, values as they are."""
        g, me = len(self.sizes), self.comm.grid.ranks_of(self.axis).index(self.comm.grid.rank)
        got = self.comm.start_all_to_all(full.contiguous(), self.sizes, [self.sizes[me]] * g,
                                         self.axis, exact=True).wait()
        return got.view(g, self.sizes[me], *full.shape[1:]).amax(dim=0)


class HaloAxis(Positions):
    """Variant ``halo`` on one axis (module docstring)."""

    def __init__(self, comm: Comm, axis, plan, n_own: int):
        self.comm, self.axis, self.plan, self.n_own = comm, axis, plan, int(n_own)
        self.width = self.n_own + plan.num_halo
        self.cut = Cut(0, self.n_own, self.n_own)  # the rest: exactly the halo positions

    @classmethod
    def build(cls, comm: Comm, axis, member, local, sizes, n_own, device=None):
        pos, plan = compact_plan(comm, axis, member, local, n_own, device)
        return pos, cls(comm, axis, plan, n_own)

    def start_gather(self, h):
        return self.plan.start_gather(self.comm, h, self.axis)

    def start_reduce(self, y_send):
        """The halo rows' partial sums, sent back to their owners."""
        return self.plan.start_return(self.comm, y_send, self.axis)

    def finish_reduce(self, y_own, received):
        return self.plan.add_returned(y_own, received)

    def reduce_max(self, full: torch.Tensor) -> torch.Tensor:
        """Each owned row's largest value: the halo rows' go back to their owners (the
        plan's return all-to-all, values as they are) and are folded in by maximum."""
        plan = self.plan
        back = self.comm.start_all_to_all(full[self.n_own:].contiguous(), plan.recv_counts,
                                          plan.send_counts, self.axis, exact=True).wait()
        index = plan.send_local.view(-1, *([1] * (full.dim() - 1))).expand_as(back)
        return full[:self.n_own].clone().scatter_reduce_(0, index, back, reduce="amax")


class _Stacked:
    """A pending all-gather whose ``wait()`` gives the members' rows stacked."""

    def __init__(self, pending):
        self.pending = pending

    def wait(self):
        return torch.cat(self.pending.wait(), dim=0)
