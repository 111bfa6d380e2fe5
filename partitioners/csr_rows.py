"""Row slicing of a CSR matrix without Python loops (shared by shards and grid blocks)."""
from __future__ import annotations

import numpy as np

from .shard_kernels import kernels


def gather_rows(indptr: np.ndarray, rows: np.ndarray):
    """Entries of the CSR rows ``rows``, in the given row order.

    Returns ``(entry, local_row, counts)``: ``entry`` (k,) int64 positions into the matrix's
    ``indices``/values, ``local_row`` (k,) int64 index into ``rows`` of each entry, ``counts``
    (len(rows),) int64 entries per row.
    """
    rows = np.asarray(rows, dtype=np.int64)
    starts = np.asarray(indptr, dtype=np.int64)[rows]
    counts = np.asarray(indptr, dtype=np.int64)[rows + 1] - starts
    total = int(counts.sum())
    local_row = np.repeat(np.arange(rows.shape[0], dtype=np.int64), counts)
    if total == 0:
        return np.zeros(0, np.int64), local_row, counts
    # entry = starts[row] + (rank of the entry inside its row)
    first = np.zeros(rows.shape[0], np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    entry = np.arange(total, dtype=np.int64) - first[local_row] + starts[local_row]
    return entry, local_row, counts


def sorted_csr(local_row: np.ndarray, col: np.ndarray, num_rows: int):
    """Order of entries sorting (row, col) and the matching indptr (num_rows+1,)."""
    order = np.lexsort((col, local_row))
    indptr = np.zeros(num_rows + 1, np.int64)
    np.cumsum(np.bincount(local_row, minlength=num_rows), out=indptr[1:])
    return order, indptr


def row_chunks(indptr: np.ndarray, max_entries: int = 1 << 20):
    """Yield ``(first_row, stop_row)`` ranges holding about ``max_entries`` entries each (at least
    one row), so whole-matrix passes can keep their temporaries small."""
    indptr = np.asarray(indptr)
    n = indptr.shape[0] - 1
    start = 0
    while start < n:
        stop = int(np.searchsorted(indptr, indptr[start] + max_entries, side="right")) - 1
        stop = min(max(stop, start + 1), n)
        yield start, stop
        start = stop


def chunk_rows(indptr: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Row id of every entry of rows ``[start, stop)``, int64."""
    return np.repeat(np.arange(start, stop, dtype=np.int64),
                     np.diff(np.asarray(indptr[start:stop + 1])))


def is_canonical(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Columns strictly increasing inside every row (sorted, no duplicates)."""
    for start, stop in row_chunks(indptr):
        lo, hi = int(indptr[start]), int(indptr[stop])
        cols = np.asarray(indices[lo:hi])
        if cols.size < 2:
            continue
        new_row = np.zeros(cols.size, bool)
        bounds = np.asarray(indptr[start + 1:stop]) - lo
        new_row[bounds[bounds < cols.size]] = True
        if not np.all((np.diff(cols) > 0) | new_row[1:]):
            return False
    return True


def is_symmetric_canonical(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Pattern symmetry of a canonical CSR (see :func:`is_canonical`): every entry (r, c) has its
    mirror (c, r). For a canonical CSR (no repeated entry) that is equality of the set of
    entries and the set of mirrors, checked by two 64-bit multiset hashes in one sequential
    pass (``shard_kernels.symmetric_pass``; a false "symmetric" has probability about 2^-128)
    rather than by building the transpose (several copies of the structure) or probing each
    mirror (a random access per entry: minutes on 10^8 entries)."""
    if indptr.shape[0] - 1 >= 1 << 32:
        raise ValueError("is_symmetric_canonical takes graphs of fewer than 2^32 vertices")
    return bool(kernels().symmetric_pass(indptr, indices))


def pattern_facts(graph, symmetric: bool = False) -> dict:
    """``{"canonical": bool, "symmetric": bool or None}`` of ``graph``'s CSR, each pass made at
    most once per graph: partitioning a graph and then sharding it both ask (the partitioner
    needs the symmetric pattern, the shard passes read a canonical CSR as it is and, when it
    is also symmetric, take column sums from row sums). ``symmetric=True`` computes symmetry
    (for a canonical CSR) if not known yet; otherwise it is ``None`` until something has.
    The facts are kept on the graph with the identity of its two arrays, so a graph given new
    arrays is checked again."""
    key = (id(graph.indptr), id(graph.indices))
    memo = graph.__dict__.get("_pattern_facts")
    if memo is None or memo[0] != key:
        indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
        memo = (key, {"canonical": is_canonical(indptr, indices), "symmetric": None})
        graph.__dict__["_pattern_facts"] = memo
    facts = memo[1]
    if symmetric and facts["symmetric"] is None:
        facts["symmetric"] = bool(facts["canonical"] and is_symmetric_canonical(
            np.asarray(graph.indptr), np.asarray(graph.indices)))
    return dict(facts)
