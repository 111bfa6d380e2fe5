"""Row slicing of a CSR matrix without Python loops (shared by shards and grid blocks)."""
from __future__ import annotations

import numpy as np


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
