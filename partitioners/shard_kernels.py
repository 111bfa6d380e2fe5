"""Compiled row passes over a CSR graph that build shards without a global copy of S = A' + I.

Every pass reads the graph's CSR (``indptr``, ``indices``, optional ``weight``; memory-mapped
arrays are fine) row by row and makes each row of S on the fly (:func:`s_row`): the row's
columns without its self loops, duplicates merged, plus the diagonal, sorted; raw weights as
``datasets/normalize.union_structure`` defines them (1.0 or the edge weight, duplicates summed
in file order; the diagonal holds the row's loop weights summed, 0.0 without a loop). So S is
never materialised: only O(n) vectors and one part's rows exist at once.

The passes and what they give:

- :func:`degree_pass` (:func:`degree_pass_unit` without weights): per vertex the sums
  ``datasets/normalize.values_for`` divides by (GCN row and column sums of S with unit
  diagonal; the raw row sums), in the same order of additions as its ``np.bincount`` calls
  (row-major S order, one addition at a time), so the values are the same bits; whether a
  vertex had a self loop; the first negative weight of each kind;
- :func:`halo_pass`: one part's halo (distinct columns owned elsewhere), its cut entries and
  its non-zeros; for a canonical CSR with a symmetric pattern, :func:`halo_bits_pass` and
  :func:`halo_lists` give every part's at once from one sequential pass;
- :func:`rows_pass`: one part's rows with local column ids (owned ``[0, n_local)``, then the
  halo in its order), sorted inside each row, and each entry's raw weight, ``orig_edge`` flag
  and normalised values.

The passes are plain top-level functions compiled by numba on the first :func:`kernels` call
(:func:`gnnpar.kernels.jit.compile_module`) and cached on disk (numba's cache holds only for
module-level functions); numba is imported then, not with this module, so a run that only
loads finished shards never pays for it. None runs threads of its own, so several processes
(``gnnpar-partition --jobs``) can each run them.
"""
from __future__ import annotations

import numpy as np

from gnnpar.kernels.jit import compile_module

GROUP_SHIFT = 40  # rows_pass table: a local id takes the bits below, its group those above
NAMES = ("mix", "s_row", "degree_pass", "degree_pass_unit", "halo_pass", "halo_bits_pass",
         "halo_lists", "rows_pass", "symmetric_pass")
mix = s_row = degree_pass = degree_pass_unit = halo_pass = halo_bits_pass = halo_lists = None
rows_pass = symmetric_pass = None  # the compiled passes, set by kernels()


def kernels():
    """This module with its passes compiled (``kernels().rows_pass(...)``); compiled once per
    process (loaded from numba's cache after the first time)."""
    return compile_module(__name__, NAMES, cache=True, nogil=True)


def _s_row(indptr, indices, weight, weighted, canonical, v, cols, raw, tmp_c, tmp_w):
    """Row ``v`` of S into ``cols``/``raw``; returns (entries, diagonal slot, had a loop)."""
    lo, hi = indptr[v], indptr[v + 1]
    loop_w = 0.0
    has_loop = False
    k = 0
    diag = -1
    if canonical:  # columns strictly increasing: insert the diagonal in passing
        for e in range(lo, hi):
            c = indices[e]
            w = weight[e] if weighted else 1.0
            if c == v:
                loop_w += w
                has_loop = True
                continue
            if diag < 0 and c > v:
                diag = k
                cols[k] = v
                k += 1
            cols[k] = c
            raw[k] = w
            k += 1
    else:  # any order, repeats allowed: stable sort, then sum each column's copies in order
        t = 0
        for e in range(lo, hi):
            c = indices[e]
            w = weight[e] if weighted else 1.0
            if c == v:
                loop_w += w
                has_loop = True
                continue
            tmp_c[t] = c
            tmp_w[t] = w
            t += 1
        order = np.argsort(tmp_c[:t], kind="mergesort")
        last = -1
        for j in range(t):
            c = tmp_c[order[j]]
            w = tmp_w[order[j]]
            if c == last:
                raw[k - 1] += w
                continue
            if diag < 0 and c > v:
                diag = k
                cols[k] = v
                k += 1
            cols[k] = c
            raw[k] = w
            k += 1
            last = c
    if diag < 0:
        diag = k
        cols[k] = v
        k += 1
    raw[diag] = loop_w
    return k, diag, has_loop

def _degree_pass(indptr, indices, weight, weighted, canonical, scratch, rowsum_gcn, colsum_gcn,
                rowsum_raw, first_neg):
    """Fills the sums; ``first_neg`` (2, 4) float64 gets, for the GCN weight
    (row 0) and the raw weight (row 1): count, row, column, value of the first negative.
    Returns S's non-zero count."""
    n = indptr.shape[0] - 1
    cols, raw, tmp_c, tmp_w = scratch
    nnz = 0
    for v in range(n):
        k, diag, hl = s_row(indptr, indices, weight, weighted, canonical, v, cols, raw,
                            tmp_c, tmp_w)
        rs = 0.0
        rr = 0.0
        for j in range(k):
            c = cols[j]
            r = raw[j]
            wg = 1.0 if j == diag else r
            rs += wg
            rr += r
            colsum_gcn[c] += wg
            if wg < 0:
                if first_neg[0, 0] == 0:
                    first_neg[0, 1] = v
                    first_neg[0, 2] = c
                    first_neg[0, 3] = wg
                first_neg[0, 0] += 1
            if r < 0:
                if first_neg[1, 0] == 0:
                    first_neg[1, 1] = v
                    first_neg[1, 2] = c
                    first_neg[1, 3] = r
                first_neg[1, 0] += 1
        rowsum_gcn[v] = rs
        rowsum_raw[v] = rr
        nnz += k
    return nnz

def _degree_pass_unit(indptr, indices, symmetric, rowsum_gcn, colsum_gcn, rowsum_raw):
    """:func:`degree_pass` for a canonical CSR without weights (at most one loop a row): every
    weight is 1.0, so each sum counts entries and holds an integer, which float64 adds exactly
    in any order: the same bits without making the rows of S. A ``symmetric`` pattern gives S
    symmetric too, so each column's count is its row's: the row sums are copied and a row is
    only searched (binary, its columns being sorted) for its loop, with no scattered adds.
    Returns S's non-zero count."""
    n = indptr.shape[0] - 1
    nnz = 0
    for v in range(n):
        lo, hi = indptr[v], indptr[v + 1]
        loops = 0
        if symmetric:
            a, b = lo, hi
            while a < b:
                mid = (a + b) // 2
                if indices[mid] < v:
                    a = mid + 1
                else:
                    b = mid
            if a < hi and indices[a] == v:
                loops = 1
        else:
            for e in range(lo, hi):
                c = indices[e]
                if c == v:
                    loops += 1
                else:
                    colsum_gcn[c] += 1.0
            colsum_gcn[v] += 1.0  # the unit diagonal
        off = hi - lo - loops
        rowsum_gcn[v] = off + 1.0
        rowsum_raw[v] = off + (1.0 if loops else 0.0)
        nnz += off + 1
    if symmetric:
        colsum_gcn[:] = rowsum_gcn
    return nnz

def _halo_pass(indptr, indices, weight, weighted, canonical, scratch, owned, owner, part,
              seen, halo):
    """Part ``part``'s halo into ``halo`` (in first-seen order); ``seen`` (n,) int32 must not
    hold ``part`` anywhere on entry. Returns (halo size, cut entries, non-zeros). A canonical
    CSR's columns are S's without the diagonal, which is owned: they are read as they are."""
    cols, raw, tmp_c, tmp_w = scratch
    h = 0
    cut = 0
    nnz = 0
    for i in range(owned.shape[0]):
        v = owned[i]
        if canonical:
            lo, hi = indptr[v], indptr[v + 1]
            nnz += hi - lo + 1
            for e in range(lo, hi):
                c = indices[e]
                if c == v:
                    nnz -= 1
                elif owner[c] != part:
                    cut += 1
                    if seen[c] != part:
                        seen[c] = part
                        halo[h] = c
                        h += 1
            continue
        k, diag, hl = s_row(indptr, indices, weight, weighted, canonical, v, cols, raw,
                            tmp_c, tmp_w)
        nnz += k
        for j in range(k):
            c = cols[j]
            if owner[c] != part:
                cut += 1
                if seen[c] != part:
                    seen[c] = part
                    halo[h] = c
                    h += 1
    return h, cut, nnz

def _halo_bits_pass(indptr, indices, owner, bits, cut, part_nnz):
    """Every part's halo membership in one pass, for a canonical CSR whose pattern is
    symmetric (so S's is): part p's rows read column c exactly when c's row reads a vertex of
    p, so scanning c's own row finds every part that needs c, reading only ``owner`` (small
    enough to stay in cache) and writing nothing scattered. ``bits`` (n, words) uint64 gets
    bit ``p % 64`` of word ``p // 64`` for each such part p != owner[c]; ``cut[p]`` counts p's
    entries in columns it does not own, ``part_nnz[p]`` S's non-zeros in p's rows (both what
    :func:`halo_pass` returns; counted from the mirror entries, equal by symmetry)."""
    n = indptr.shape[0] - 1
    one = np.uint64(1)
    for c in range(n):
        oc = owner[c]
        lo, hi = indptr[c], indptr[c + 1]
        loops = 0
        for e in range(lo, hi):
            v = indices[e]
            if v == c:
                loops += 1
                continue
            p = owner[v]
            if p != oc:
                bits[c, p >> 6] |= one << np.uint64(p & 63)
                cut[p] += 1
        part_nnz[oc] += hi - lo - loops + 1


def _halo_lists(perm, bits, owner, offsets, flat, recv):
    """Each part's halo from :func:`halo_bits_pass`'s ``bits``, into ``flat[offsets[p]:
    offsets[p + 1]]`` (``offsets`` (parts+1,) filled here), ordered by owner then id as
    :func:`halo_pass`'s callers sort it: ``perm`` lists the vertices by owner, ascending
    inside each; ``recv[p, q]`` counts p's halo rows owned by q. Call with ``flat`` of size
    0 first to size it (returns the total), then again to fill it."""
    parts = offsets.shape[0] - 1
    fill = flat.shape[0] > 0
    pos = np.zeros(parts, np.int64)
    if fill:
        for p in range(parts):
            pos[p] = offsets[p]
    for i in range(perm.shape[0]):
        c = perm[i]
        q = owner[c]
        for w in range(bits.shape[1]):
            word = bits[c, w]
            p = w * 64
            while word:
                if word & np.uint64(1):
                    if fill:
                        flat[pos[p]] = c
                    pos[p] += 1
                    recv[p, q] += 1
                word >>= np.uint64(1)
                p += 1
    if not fill:
        offsets[0] = 0
        for p in range(parts):
            offsets[p + 1] = offsets[p] + pos[p]
        recv[:, :] = 0
    return offsets[parts]


def _rows_pass(indptr, indices, weight, weighted, canonical, scratch, owned, table, table_f,
               parts, rinv, inv, out_indptr, out_cols, out_raw, out_orig, out_gcn, out_mean):
    """A part's rows of S (``owned``, ascending) with local columns, each row sorted; values
    ``(w * rinv[v]) * cinv[c]`` (GCN, unit diagonal) and ``raw * inv[v]`` (mean), rounded to
    float32 once, as ``values_for``.

    ``table`` (n, 2) int64 holds, at each column c this part reads, ``group << GROUP_SHIFT |
    local id`` in slot 0 (group 0 owned, 1 + owner for a halo row) and, in slot 1 read through
    its float64 view ``table_f``, ``cinv[c]``: one 16-byte read per entry instead of three
    scattered ones (local id, owner, column norm), which is what a part's pass waits on.

    A row's columns come in ascending id, and local ids ascend with the id inside each group
    (owned; the halo rows of one owner), so sorting a row is a stable counting sort by group:
    O(row + parts) with no comparisons. Where parts outnumber a row's entries a comparison sort
    is cheaper (insertion for short rows)."""
    cols, raw, tmp_c, tmp_w = scratch
    key = np.empty(cols.shape[0], np.int64)
    perm = np.empty(cols.shape[0], np.int64)
    group = np.empty(cols.shape[0], np.int64)
    cnorm = np.empty(cols.shape[0], np.float64)
    start = np.zeros(parts + 2, np.int64)
    mask = (np.int64(1) << GROUP_SHIFT) - 1
    pos = 0
    out_indptr[0] = 0
    for i in range(owned.shape[0]):
        v = owned[i]
        k, diag, hl = s_row(indptr, indices, weight, weighted, canonical, v, cols, raw,
                            tmp_c, tmp_w)
        ordered = True
        for j in range(k):
            c = cols[j]
            entry = table[c, 0]
            cnorm[j] = table_f[c, 1]
            key[j] = entry & mask
            group[j] = entry >> GROUP_SHIFT
            perm[j] = j
            if j and key[j] < key[j - 1]:
                ordered = False
        if not ordered:  # keys are distinct: any sort gives the one order
            if parts + 1 <= 4 * k:
                for j in range(k):
                    start[group[j] + 1] += 1
                for g in range(1, parts + 2):
                    start[g] += start[g - 1]
                for j in range(k):
                    g = group[j]
                    perm[start[g]] = j
                    start[g] += 1
                start[:] = 0
            elif k > 48:
                perm[:k] = np.argsort(key[:k])
            else:  # short rows: insertion sort, no allocation
                for a in range(1, k):
                    j = perm[a]
                    b = a - 1
                    while b >= 0 and key[perm[b]] > key[j]:
                        perm[b + 1] = perm[b]
                        b -= 1
                    perm[b + 1] = j
        rv, iv = rinv[v], inv[v]
        for t in range(k):
            j = perm[t]
            r = raw[j]
            out_cols[pos] = key[j]
            out_raw[pos] = r
            out_orig[pos] = j != diag or hl
            wg = 1.0 if j == diag else r
            out_gcn[pos] = np.float32(wg * rv * cnorm[j])
            out_mean[pos] = np.float32(r * iv)
            pos += 1
        out_indptr[i + 1] = pos
    return pos


def _mix(x, salt):
    """SplitMix64's finaliser of ``x ^ salt`` (uint64, wrapping)."""
    z = x ^ salt
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _symmetric_pass(indptr, indices):
    """Two 64-bit multiset hashes of the entries (r, c) and of their mirrors (c, r), summed with
    wrap-around in one sequential pass: equal when the pattern is symmetric, and for any other
    pattern equal only by a collision of both hashes (about 2^-128 for patterns not built to
    collide). No random access, so it runs at the speed of reading ``indices``."""
    n = indptr.shape[0] - 1
    width = np.uint64(32)
    a = np.uint64(0x9E3779B97F4A7C15)
    b = np.uint64(0xD6E8FEB86659FD93)
    f1 = np.uint64(0)
    f2 = np.uint64(0)
    m1 = np.uint64(0)
    m2 = np.uint64(0)
    for r in range(n):
        ur = np.uint64(r)
        for e in range(indptr[r], indptr[r + 1]):
            uc = np.uint64(indices[e])
            fwd = (ur << width) | uc
            rev = (uc << width) | ur
            f1 += mix(fwd, a)
            f2 += mix(fwd, b)
            m1 += mix(rev, a)
            m2 += mix(rev, b)
    return f1 == m1 and f2 == m2
