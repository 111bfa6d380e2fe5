"""Feature rows of a macrobatch's minibatches copied by compiled passes.

Minibatch b's input features are ``out_b[i] = src[index[ids_b[i]]]`` (``index``: global id
→ row of this rank's table). With 128 float32 a row is only 8 cache lines, the rows sit at
scattered places of a table much larger than the caches, and the K minibatches of a
macrobatch share many of them (``rmat:scale=17,ef=16``, fanouts 15,10,5, batch 1024, K=4:
131k rows asked for, 56k distinct). torch's ``index_select`` per minibatch waits on each
row's first miss and reads a shared row from memory once per minibatch. So:

- :func:`gather_groups` (the service's path, :meth:`MacroFeatures.gather_all
  <gnnpar.sampling.features.MacroFeatures.gather_all>`): the entries of all K lists are
  counting-sorted by row, then copied in that order: the table is read front to back, a
  shared row is read from memory once and then from the cache;
- the copy asks for the row ``DISTANCE`` entries ahead (one prefetch per 64 bytes) while it
  copies the current one, so several rows' misses are in flight;
- rows are written with non-temporal 64-byte stores (whole 64-byte pieces into 64-byte
  aligned outputs, else plain stores): the outputs are far larger than the caches, and a
  plain store first reads the line it overwrites;
- with ``drop`` each row goes out under its minibatch's input-dropout mask (a row buffer of
  the kept values, one hash per four elements): the model's pass over the whole input, and
  the fresh tensor it writes, are saved for that.

Outputs come from a per-thread pool (:mod:`gnnpar.sampling.output_pool`): a fresh output of
a few MB per minibatch page-faults on first write.

Each step (grouping, prefetching, non-temporal stores) is timed inside the sampling loop
with cold caches, as the service sees them; a repeated micro-benchmark's hot cache ranks
them otherwise (``docs/performance.md``).

One thread per call, ``nogil``: the sampler workers are the parallelism, and a
multi-threaded gather inside each of W workers would put 2W threads on the cores (the
OpenMP teams of torch's ``index_select`` spin while they wait for each other). Without
numba, or with ``GNNPAR_SAMPLER_KERNELS=numpy`` (:func:`~gnnpar.sampling.fast.available`),
or for tables other than contiguous float32 on the CPU, every function here is
``index_select`` (the reference; the rows are the same bit for bit, tested).

:func:`gather_groups` is compiled once per number of lists K (a fraction of a second, then
cached on disk).

Shapes: ``src`` (m, f); ``index`` (n,) integer or None; ``ids`` (k,) int64; ``out`` (N, f)
with N ≥ k, or rows ``at`` (k,) of it; :func:`gather_groups` returns one (k_b, f) tensor per
list.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Sequence

import numpy as np
import torch

from gnnpar.nn.dropout import mask_units
from gnnpar.kernels import cpu_dropout
from gnnpar.kernels.jit import compile_module

from gnnpar.sampling import fast
from gnnpar.sampling.output_pool import OutputPool, new_rows, pooled_outputs  # noqa: F401 - re-exported

#: rows prefetched ahead of the one being copied
DISTANCE = 4


def compiled_for(src: torch.Tensor) -> bool:
    """Whether :func:`gather_rows` runs the compiled pass for the table ``src``."""
    return (fast.available() and src.device.type == "cpu" and src.dtype == torch.float32
            and src.dim() == 2 and src.is_contiguous() and not src.requires_grad
            and _kernel() is not None)


def gather_rows(src: torch.Tensor, ids: np.ndarray, index: Optional[np.ndarray] = None,
                out: Optional[torch.Tensor] = None, at: Optional[np.ndarray] = None
                ) -> torch.Tensor:
    """``out[at[i]] = src[index[ids[i]]]`` for every i (``index`` None: ``src[ids[i]]``;
    ``at`` None: row i); ``out`` made (k, f) when None. Returns ``out``."""
    ids = np.asarray(ids, np.int64)
    rows = index[ids] if index is not None else ids
    if not compiled_for(src) or out is not None and not (
            out.device.type == "cpu" and out.dtype == src.dtype and out.is_contiguous()):
        picked = src.index_select(0, torch.from_numpy(np.asarray(rows, np.int64)).to(src.device))
        if out is None and at is None:
            return picked
        out = src.new_empty((ids.shape[0], src.shape[1])) if out is None else out
        where = slice(0, ids.shape[0]) if at is None else torch.from_numpy(
            np.asarray(at, np.int64)).to(out.device)
        out[where] = picked
        return out
    if out is None:
        out = new_rows(src, ids.shape[0])
    dest = np.zeros(0, np.int64) if at is None else np.asarray(at, np.int64)
    if out.dim() != 2 or out.shape[1] != src.shape[1]:
        raise ValueError(f"output of shape {tuple(out.shape)} for rows of {src.shape[1]}")
    if ids.size:
        _check_rows(rows, src.shape[0])
        if at is None and ids.shape[0] > out.shape[0] or at is not None and (
                dest.shape != ids.shape or int(dest.min()) < 0
                or int(dest.max()) >= out.shape[0]):
            raise IndexError(f"{ids.shape[0]} rows do not fit an output of {out.shape[0]} "
                             f"rows at {'rows 0..' if at is None else 'the rows given'}")
        _kernel().copy(src.numpy(), np.asarray(rows), out.numpy(), dest, DISTANCE,
                       _streams(src, [out]))
    return out


def gather_groups(src: torch.Tensor, id_lists: Sequence[np.ndarray],
                  index: Optional[np.ndarray] = None, drop=None) -> List[torch.Tensor]:
    """``[gather_rows(src, ids, index) for ids in id_lists]``, copied in one pass in row
    order: the entries of all lists are counting-sorted by row (buckets of ``2**shift`` rows,
    at most about four buckets per entry), so a row that several lists hold is read from
    memory once and then from the cache, and the table is read front to back.

    ``drop``: ``(seeds, p)``, one seed per list: each output under inverted dropout with
    the hash mask of its seed (:func:`gnnpar.nn.dropout.dropout`'s mask and select for that
    seed, bit for bit), applied as the rows are copied — no pass of its own. Only where
    the compiled copy runs (:func:`compiled_for`); ValueError elsewhere."""
    if drop is not None:
        if not compiled_for(src):
            raise ValueError("dropout on the way needs the compiled copy (numba, a "
                             "contiguous float32 CPU table)")
        if len(drop[0]) != len(id_lists):
            raise ValueError(f"{len(drop[0])} dropout seeds for {len(id_lists)} lists")
    elif len(id_lists) < 2 or not compiled_for(src):
        return [gather_rows(src, ids, index) for ids in id_lists]
    flat = np.concatenate([np.asarray(ids, np.int64) for ids in id_lists])
    rows = index[flat] if index is not None else flat
    outs = pooled_outputs(src, [int(np.shape(ids)[0]) for ids in id_lists])
    if not flat.size:
        return outs
    _check_rows(rows, src.shape[0])
    cut = np.zeros(len(id_lists) + 1, np.int64)
    np.cumsum([o.shape[0] for o in outs], out=cut[1:])
    m = int(src.shape[0])
    shift = max(0, (m - 1).bit_length() - (4 * flat.shape[0]).bit_length())
    kernels = _kernel()
    order = kernels.order(rows, shift, (m - 1 >> shift) + 1)
    args = (src.numpy(), rows, tuple(o.numpy() for o in outs), cut, order, DISTANCE,
            _streams(src, outs))
    if drop is None:
        kernels.copy_groups(*args)
    else:
        units, scale = mask_units(drop[1])
        kernels.copy_groups_dropped(*args, np.asarray(drop[0], np.uint64), np.uint64(units),
                                    np.float32(scale))
    return outs


def _streams(src: torch.Tensor, outs) -> bool:
    """Rows go out by non-temporal 64-byte stores: whole 64-byte pieces, aligned outputs."""
    return src.shape[1] % 16 == 0 and all(o.data_ptr() % 64 == 0 for o in outs)


def _check_rows(rows: np.ndarray, m: int) -> None:
    """The compiled passes read unchecked: every row number is checked here."""
    lo, hi = int(rows.min()), int(rows.max())
    if lo < 0 or hi >= m:
        raise IndexError(f"row {lo if lo < 0 else hi} of a table of {m} rows")


# the compiled passes and the intrinsics they use, set by _kernel()
prefetch = stream16 = store_fence = copy_row = prefetch_row = copy = order = copy_groups = None
masked_row = lists_of = copy_groups_dropped = None


@functools.lru_cache(maxsize=None)
def _kernel():
    """This module with its passes compiled (on first use, cached on disk), or None without
    numba or where they cannot be built (then everything runs ``index_select``). The passes,
    their inlined helpers and the intrinsics are module-level functions
    (:func:`gnnpar.kernels.jit.compile_module`): numba's disk cache finds only those again."""
    try:
        from numba.core.extending import intrinsic
    except ImportError:
        return None
    compile_module(__name__, ("prefetch", "stream16", "store_fence"), wrap=intrinsic)
    cpu_dropout.compile_hash()
    compile_module(__name__, ("copy_row", "prefetch_row", "masked_row", "lists_of"),
                   inline="always", nogil=True, boundscheck=False)
    kernels = compile_module(__name__, ("copy", "order", "copy_groups", "copy_groups_dropped"),
                             cache=True, nogil=True, boundscheck=False)
    try:  # an LLVM that names an intrinsic otherwise: index_select instead
        probe = np.zeros((2, 16), np.float32)
        kernels.copy(probe, np.zeros(1, np.int64), probe, np.zeros(0, np.int64), 1, False)
    except Exception:  # noqa: BLE001 - numba's lowering errors have many types
        return None
    return kernels


def _pointer(context, builder, aty, array, i, ity, j, jty):
    """LLVM pointer to ``array[i, j]`` (``i``, ``j`` of numba types ``ity``, ``jty``)."""
    from numba import types
    from numba.core import cgutils
    a = context.make_array(aty)(context, builder, array)
    at = [context.cast(builder, i, ity, types.intp), context.cast(builder, j, jty, types.intp)]
    return cgutils.get_item_pointer(context, builder, aty, a, at)


def _prefetch(typingctx, arr, i, j):  # pragma: no cover - compiled
    """Ask for the cache line of ``arr[i, j]`` (read, keep in every cache level)."""
    from numba import types
    from numba.core import cgutils
    from numba.core.cgutils import ir  # llvmlite's IR builder, as numba's lowering uses

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1],
                       args[2], sig.args[2])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return types.void(arr, i, j), codegen


def _stream16(typingctx, out, o, j, src, r):  # pragma: no cover - compiled
    """``out[o, j:j+16] = src[r, j:j+16]`` by one non-temporal 64-byte store (the
    address must be 64-byte aligned: checked by the caller)."""
    from numba import types
    from numba.core.cgutils import ir

    def codegen(context, builder, sig, args):
        vt = ir.VectorType(ir.FloatType(), 16)
        dst = _pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1],
                       args[2], sig.args[2])
        got = _pointer(context, builder, sig.args[3], args[3], args[4], sig.args[4],
                       args[2], sig.args[2])
        v = builder.load(builder.bitcast(got, vt.as_pointer()), align=4)
        st = builder.store(v, builder.bitcast(dst, vt.as_pointer()), align=64)
        st.set_metadata("nontemporal", builder.module.add_metadata(
            [ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()
    return types.void(out, o, j, src, r), codegen


def _store_fence(typingctx):  # pragma: no cover - compiled
    """Order the non-temporal stores before whatever follows (another thread reads)."""
    from numba import types

    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


def _copy_row(out, o, src, r, stream):  # pragma: no cover - compiled
    if stream:
        for j in range(0, src.shape[1], 16):
            stream16(out, o, j, src, r)
    else:
        for j in range(src.shape[1]):
            out[o, j] = src[r, j]


def _prefetch_row(src, r):  # pragma: no cover - compiled
    for j in range(0, src.shape[1], 16):  # one prefetch per 64-byte line
        prefetch(src, r, j)


def _copy(src, rows, out, at, distance, stream):  # pragma: no cover - compiled
    k = rows.shape[0]
    scatter = at.shape[0] > 0
    for i in range(k):
        if i + distance < k:
            prefetch_row(src, rows[i + distance])
        copy_row(out, at[i] if scatter else i, src, rows[i], stream)
    if stream:
        store_fence()


def _order(rows, shift, buckets):  # pragma: no cover - compiled
    # positions of ``rows`` stably counting-sorted by ``rows >> shift``
    n = rows.shape[0]
    start = np.zeros(buckets + 1, np.int64)
    for e in range(n):
        start[(rows[e] >> shift) + 1] += 1
    for b in range(buckets):
        start[b + 1] += start[b]
    order = np.empty(n, np.int64)
    for e in range(n):
        b = rows[e] >> shift
        order[start[b]] = e
        start[b] += 1
    return order


def _masked_row(buf, lanes, words, src, r, o, seed, drop_units, scale):  # pragma: no cover
    # buf[0] = output row o of src[r] under inverted dropout: element j of it is flat
    # element o·f + j of its minibatch's input, kept by the lanes of the flat pass of
    # gnnpar.kernels.cpu_dropout (lane k of hash g is flat element 4g + k), the same select
    f = src.shape[1]
    lo = o * f
    g0 = lo // 4
    for g in range((lo + f - 4 * g0 + 3) // 4):
        words[g] = cpu_dropout.splitmix(seed, g0 + g)
    off = lo - 4 * g0
    du = np.uint16(drop_units)
    zero = np.float32(0.0)
    for j in range(f):
        buf[0, j] = src[r, j] * scale if lanes[off + j] >= du else zero


def _lists_of(cut, n):  # pragma: no cover - compiled
    # which[e] = b for the entries e of list b (cut[b] <= e < cut[b+1])
    which = np.empty(n, np.int32)
    for b in range(cut.shape[0] - 1):
        for e in range(cut[b], cut[b + 1]):
            which[e] = b
    return which


def _copy_groups(src, rows, outs, cut, order, distance, stream):  # pragma: no cover
    # entry e (of list b: cut[b] <= e < cut[b+1]) goes to row e - cut[b] of outs[b]
    n = rows.shape[0]
    which = lists_of(cut, n)
    for p in range(n):
        if p + distance < n:
            prefetch_row(src, rows[order[p + distance]])
        e = order[p]
        b = which[e]
        copy_row(outs[b], e - cut[b], src, rows[e], stream)
    if stream:
        store_fence()


def _copy_groups_dropped(src, rows, outs, cut, order, distance, stream, seeds, drop_units,
                         scale):  # pragma: no cover - compiled
    # _copy_groups, each row under list b's dropout mask (seed seeds[b]) on its way out
    n = rows.shape[0]
    which = lists_of(cut, n)
    f = src.shape[1]
    buf = np.empty((1, f), np.float32)
    lanes = np.empty(4 * (f // 4 + 2), np.uint16)
    words = lanes.view(np.uint64)
    for p in range(n):
        if p + distance < n:
            prefetch_row(src, rows[order[p + distance]])
        e = order[p]
        b = which[e]
        masked_row(buf, lanes, words, src, rows[e], e - cut[b], seeds[b], drop_units, scale)
        copy_row(outs[b], e - cut[b], buf, 0, stream)
    if stream:
        store_fence()
