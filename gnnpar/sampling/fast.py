"""The host samplers' hot loops compiled by numba: a few flat passes per layer and block.

The vectorised numpy path (:func:`~gnnpar.sampling.neighbor.sample_entries_numpy`,
:func:`~gnnpar.sampling.blocks.assemble_block_numpy`) stays the reference; these kernels give
the same arrays bit for bit (tested). Where the time goes on ``rmat:scale=17,ef=16``
(fanouts 15,10,5, batch 1024, one thread) is random reads and unpredictable branches, not
arithmetic, so the kernels are shaped around both:

- :func:`sample_rows` — (1) the rows' CSR offsets, independent random reads with many misses
  in flight; (2) the kept positions from sequential data only: Floyd's subset (or the
  with-replacement draws) per row, its "already kept?" test settled by a 64-bit mask of the
  picks' low bits for most draws; (3) a flat gather whose addresses are all known, reading
  a packed (int32 column, float32 value) record as one uint64; (4) the d_i/k_i scaling, a
  sequential pass. A fused per-row loop (choose, then read) is no faster than numpy: its
  branches wait on the misses of the row's own offsets (``docs/performance.md``).
- :func:`relabel_assemble` — the block-local numbering (destinations first, new ids
  ascending) and the block's CSR in one call: the n-entry slot table marks new ids as the
  edges are read, then a scan of the table (blocks touching a good share of the graph) or a
  sort of the new ids only (small blocks of a huge graph) numbers them, and each edge's
  local id is written in place (after its row's self entry, if any). Marking and the scan
  store unconditionally and count with the flag: whether an id is new is a coin flip to a
  branch predictor.

Same numbers: positions and scaled values follow the numpy expressions operation for
operation in float64/float32 (a float32 product computed in float64 and rounded is the
float32 product: 48 significant bits fit in a double), with no fast-math.

Every kernel is ``nogil``: sampler worker threads run them in parallel. They are plain
module-level functions compiled on first use (:func:`gnnpar.kernels.jit.compile_module`:
importing numba takes most of a second) and cached on disk; without numba, or with
``GNNPAR_SAMPLER_KERNELS=numpy``, the numpy path runs (:func:`available`).

Shapes: see each function.
"""
from __future__ import annotations

import numpy as np

from gnnpar.kernels.jit import SAMPLER_ENV, compile_module, sampler_kernels_on

#: ``GNNPAR_SAMPLER_KERNELS=numpy`` runs the numpy reference instead (A/B measurements)
ENV = SAMPLER_ENV
#: ``available()``: the kernels run (numba importable and not switched off through
#: :data:`ENV`); asked on every layer
available = sampler_kernels_on

NAMES = ("positions", "gather_packed", "gather", "scale", "assemble")
# the compiled kernels, set by _compiled()
positions = gather_packed = gather = scale = assemble = None


def _positions(indptr, rows, fanout, replace, u):  # pragma: no cover
    # Two passes, so that no branch waits on a cache miss: the rows' offsets
    # (independent random reads, many in flight), then the kept positions (sequential
    # data only). The gather that follows knows all its addresses up front.
    r = rows.shape[0]
    base = np.empty(r, np.int64)
    deg = np.empty(r, np.int64)
    for i in range(r):
        base[i] = indptr[rows[i]]
        deg[i] = indptr[rows[i] + 1]
    k = np.empty(r, np.int64)
    total = 0
    draws = 0
    for i in range(r):
        d = deg[i] - base[i]
        deg[i] = d
        ki = d if fanout < 0 else (fanout if (replace and d > 0) else min(d, fanout))
        k[i] = ki
        total += ki
        draws += (d > 0) if replace else (d > fanout)
    if fanout > 0 and (u.shape[0] != draws or u.shape[1] != fanout):
        return k, deg, np.empty(0, np.int64), draws  # the caller raises
    pos = np.empty(total, np.int64)
    one = np.uint64(1)
    e = 0
    drawn = 0
    for i in range(r):
        b, d = base[i], deg[i]
        if fanout < 0 or (not replace and d <= fanout):
            for p in range(d):
                pos[e + p] = b + p
            e += d
        elif d > 0:
            if replace:
                for s in range(fanout):
                    pos[e + s] = b + min(np.int64(u[drawn, s] * d), d - 1)
            else:
                # Floyd: for j = d-k … d-1 keep t = ⌊u·(j+1)⌋ unless kept already, else j.
                # A 64-bit mask of the kept picks' low bits settles "already kept?" for
                # most draws; only a draw whose bit is set scans the earlier picks.
                mask = np.uint64(0)
                for s in range(fanout):
                    j = d - fanout + s
                    t = min(np.int64(u[drawn, s] * (j + 1.0)), j)
                    bit = one << np.uint64(t & 63)
                    if mask & bit:
                        for q in range(e, e + s):
                            if pos[q] == b + t:
                                t = j
                                bit = one << np.uint64(t & 63)
                                break
                    mask |= bit
                    pos[e + s] = b + t
            e += fanout
            drawn += 1
    return k, deg, pos, draws

def _gather_packed(records, pos):  # pragma: no cover
    # records: (col int32, value float32) packed in one little-endian uint64 each
    total = pos.shape[0]
    cols = np.empty(total, np.int32)
    vals = np.empty(total, np.float32)
    bits = vals.view(np.uint32)
    for q in range(total):
        rec = records[pos[q]]
        cols[q] = np.int32(rec & np.uint64(0xFFFFFFFF))
        bits[q] = np.uint32(rec >> np.uint64(32))
    return cols, vals

def _gather(col, val, pos):  # pragma: no cover
    total = pos.shape[0]
    cols = np.empty(total, col.dtype)
    vals = np.empty(total, np.float32)
    for q in range(total):
        p = pos[q]
        cols[q] = col[p]
        vals[q] = val[p]
    return cols, vals

def _scale(vals, k, deg):  # pragma: no cover
    e = 0
    for i in range(k.shape[0]):
        if k[i] != deg[i] and k[i] > 0:  # d/k = 1 leaves the value as it is
            f = np.float32(deg[i] / k[i])
            for q in range(e, e + k[i]):
                vals[q] = vals[q] * f
        e += k[i]

def _assemble(slot, dst, k, cols, self_vals, vals, with_self):  # pragma: no cover
    # branch-free marking and numbering: whether an id is new is a coin flip to the
    # branch predictor, so every step stores unconditionally and counts with the flag
    r = dst.shape[0]
    n_edges = cols.shape[0]
    n = slot.shape[0]
    for i in range(r):
        slot[dst[i]] = i
    fresh = np.empty(n_edges + 1, np.int64)
    nf = 0
    for e in range(n_edges):
        c = cols[e]
        was = slot[c]
        new = was == -1
        fresh[nf] = c
        nf += new
        slot[c] = was - new  # -1 (unseen) becomes -2 (new), a local id stays
    src = np.empty(r + nf + 1, np.int64)
    src[:r] = dst
    if n <= 16 * nf:  # a scan of the table costs less than sorting the new ids
        j = r
        for v in range(n):
            was = slot[v]
            new = was == -2
            src[j] = v
            slot[v] = j if new else was
            j += new
    else:
        ids = np.sort(fresh[:nf])
        for q in range(nf):
            slot[ids[q]] = r + q
            src[r + q] = ids[q]
    src = src[:r + nf]
    indptr = np.empty(r + 1, np.int64)
    indptr[0] = 0
    if not with_self:
        for i in range(r):
            indptr[i + 1] = indptr[i] + k[i]
        indices = np.empty(n_edges, np.int64)
        for e in range(n_edges):
            indices[e] = slot[cols[e]]
        values = np.empty(0, np.float32)
    else:
        for i in range(r):
            indptr[i + 1] = indptr[i] + k[i] + (self_vals[i] != 0)
        indices = np.empty(indptr[r], np.int64)
        values = np.empty(indptr[r], np.float32)
        e = 0
        for i in range(r):
            o = indptr[i]
            if self_vals[i] != 0:
                indices[o] = i
                values[o] = self_vals[i]
                o += 1
            for q in range(k[i]):
                indices[o + q] = slot[cols[e + q]]
                values[o + q] = vals[e + q]
            e += k[i]
    for i in range(r + nf):
        slot[src[i]] = -1
    return src, indptr, indices, values


def _compiled():
    """This module with its kernels compiled (numba imported on the first call)."""
    return compile_module(__name__, NAMES, cache=True, nogil=True)


def sample_rows(indptr: np.ndarray, entries: np.ndarray, kind: str, rows: np.ndarray,
                fanout: int, replace: bool, u):
    """``(k (R,) int64, cols (E,) the column field's dtype, vals (E,) float32)``: the kept
    entries of ``rows`` (R,) int64 of the CSR ``indptr`` (n+1,) int64 over the topology's
    records ``entries`` (e,), values of field ``kind`` scaled by d_i/k_i when ``fanout >= 0``.
    ``u``: (drawn rows, fanout) float64, as :func:`~gnnpar.sampling.choose.choose_entries`
    (ValueError otherwise, before any is read).

    Records of exactly (int32 column, float32 value) — one normalisation kept, under 2³¹
    nodes — are read as one uint64 each (a miss per entry, no strided field access)."""
    if u is not None and np.ndim(u) != 2:
        raise ValueError(f"u must be (drawn rows, fanout), got shape {np.shape(u)}")
    kernels = _compiled()
    given = np.zeros((0, max(int(fanout), 1))) if u is None else u
    k, deg, pos, draws = kernels.positions(indptr, rows, int(fanout), bool(replace), given)
    if fanout > 0 and (u is None or u.shape != (draws, fanout)):
        raise ValueError(f"u must have shape {(draws, fanout)}, "
                         f"got {None if u is None else u.shape}")
    fields = entries.dtype.fields
    if (entries.dtype.itemsize == 8 and fields["col"] == (np.dtype("<i4"), 0)
            and fields[kind] == (np.dtype("<f4"), 4)):
        cols, vals = kernels.gather_packed(entries.view(np.uint64), pos)
    else:
        cols, vals = kernels.gather(entries["col"], entries[kind], pos)
    if fanout >= 0:
        kernels.scale(vals, k, deg)
    return k, cols, vals


def relabel_assemble(slot: np.ndarray, dst: np.ndarray, k: np.ndarray, cols: np.ndarray,
                     vals: np.ndarray, self_vals: np.ndarray):
    """``(src_ids, indptr, indices, values)`` of one block (see
    :func:`~gnnpar.sampling.blocks.assemble_block`); ``slot`` (n,) all −1, left all −1.
    Without self entries ``values`` is ``vals`` itself (nothing to interleave)."""
    with_self = bool(np.any(self_vals))
    src, indptr, indices, values = _compiled().assemble(slot, dst, k, cols, self_vals, vals,
                                                     with_self)
    return src, indptr, indices, (values if with_self else np.asarray(vals, np.float32))
