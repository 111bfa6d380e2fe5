"""Node rows to every part's folder in one pass over row blocks, never all resident.

``x`` (n × f) is read in blocks of consecutive rows. A part's vertices are in ascending global
id (``Partition``), so the block's rows of part r are one contiguous run of r's local rows: each
block costs one positioned write per part into a ``.npy`` file whose header was written first.
The small node arrays (``y`` and the masks, O(n) bytes) are gathered per part in memory.

Pages of a memory-mapped array stay in the process's resident set once read, so a pass over a
mapped ``x`` would end with all of it counted as resident: :func:`release` hands a mapping's
pages back to the page cache (``madvise(MADV_DONTNEED)``; a later read maps them again) after
every block.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from .partition import Partition

#: bytes of ``x`` read per block
BLOCK_BYTES = 64 << 20
SMALL_ARRAYS = ("y", "train_mask", "val_mask", "test_mask")


def release(arr) -> None:
    """Drop the resident pages of the memory map behind ``arr`` (no-op for in-memory arrays)."""
    mapped = getattr(arr, "_mmap", None)  # np.memmap and its views keep the mapping here
    if isinstance(mapped, mmap.mmap) and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        try:
            mapped.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):  # closed map, or a kernel without it: only memory is lost
            pass


def block_rows(num_cols: int, itemsize: int, row_block=None) -> int:
    """Rows per block: ``row_block`` when given, else about :data:`BLOCK_BYTES` of rows."""
    if row_block:
        return max(1, int(row_block))
    return max(1, BLOCK_BYTES // max(1, num_cols * itemsize))


def _start_npy(path: str, dtype, shape) -> int:
    """Write a ``.npy`` header for ``shape`` and size the file; returns the header's length."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": tuple(int(s) for s in shape)}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        start = f.tell()
        f.truncate(start + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return start


def write_node_arrays(graph, partition: Partition, folders, row_block=None, progress=None) -> None:
    """Write ``x.npy`` and the small node arrays of every part into ``folders[r]``."""
    say = progress or (lambda msg: None)
    P, n = partition.num_parts, graph.num_nodes
    owner = partition.owner
    for name in SMALL_ARRAYS:
        full = np.asarray(getattr(graph, name))
        for rank in range(P):
            np.save(os.path.join(folders[rank], f"{name}.npy"), full[partition.vertices(rank)])
        release(getattr(graph, name))
        del full
    x = graph.x
    f = int(x.shape[1])
    row_bytes = f * x.dtype.itemsize
    starts = [_start_npy(os.path.join(folders[r], "x.npy"), x.dtype, (int(partition.sizes[r]), f))
              for r in range(P)]
    handles = [open(os.path.join(folders[r], "x.npy"), "r+b") for r in range(P)]
    filled = np.zeros(P, np.int64)  # local rows of each part written so far
    step = min(block_rows(f, x.dtype.itemsize, row_block), max(n, 1))
    block = np.empty((step, f), x.dtype)    # reused: no fresh pages to fault in every block
    grouped = np.empty((step, f), x.dtype)
    try:
        for a in range(0, n, step):
            b = min(n, a + step)
            rows = b - a
            block[:rows] = x[a:b]
            release(x)
            order = np.argsort(owner[a:b], kind="stable")  # rows grouped by part, ascending
            counts = np.bincount(owner[a:b], minlength=P)
            np.take(block[:rows], order, axis=0, out=grouped[:rows], mode="clip")  # unbuffered
            at = 0
            for rank in np.flatnonzero(counts):
                c = int(counts[rank])
                handles[rank].seek(starts[rank] + int(filled[rank]) * row_bytes)
                handles[rank].write(memoryview(grouped[at:at + c]).cast("B"))
                filled[rank] += c
                at += c
            if (a // step) % 16 == 15:
                say(f"features: {b:,}/{n:,} rows")
    finally:
        for h in handles:
            h.close()
