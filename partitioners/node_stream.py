"""Node rows to every part's folder in one pass over row blocks, never all resident.

``x`` (n × f) is read in blocks of consecutive rows. A part's vertices are in ascending global
id (``Partition``), so the block's rows of part r are one contiguous run of r's local rows: each
block costs one positioned write per part into a ``.npy`` file whose header was written first;
blocks are independent (:class:`FeatureBlocks`), so several processes may write them at once.
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
from .write_through import pwrite_through, save_npy

#: bytes of ``x`` read per block
BLOCK_BYTES = 64 << 20
SMALL_ARRAYS = ("y", "train_mask", "val_mask", "test_mask")


def release(arr) -> None:
    """Drop the resident pages of the memory map behind ``arr`` (no-op for in-memory arrays)."""
    mapped = getattr(arr, "_mmap", None)  # np.memmap and its views keep the mapping here
    if (isinstance(mapped, mmap.mmap) and hasattr(mapped, "madvise")
            and hasattr(mmap, "MADV_DONTNEED")):
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


class FeatureBlocks:
    """``x`` of every part written in blocks of rows that are independent of each other, so
    processes may write them at once (``write_shards`` puts them beside the parts' rows in its
    pool): :meth:`prepare` writes each part's ``.npy`` header and sizes the file, and block
    ``i`` writes rows ``[a, b)`` of ``x`` with one ``os.pwrite`` per part at that part's
    offset, known beforehand from the owners of the rows before ``a``."""

    def __init__(self, graph, partition: Partition, folders, row_block=None):
        self.graph, self.partition = graph, partition
        self.paths = [os.path.join(folder, "x.npy") for folder in folders]
        x = graph.x
        n, P = graph.num_nodes, partition.num_parts
        self.row_bytes = int(x.shape[1]) * x.dtype.itemsize
        self.step = min(block_rows(int(x.shape[1]), x.dtype.itemsize, row_block), max(n, 1))
        self.bounds = [(a, min(n, a + self.step)) for a in range(0, n, self.step)]
        counts = np.array([np.bincount(partition.owner[a:b], minlength=P)
                           for a, b in self.bounds], np.int64).reshape(len(self.bounds), P)
        self.counts = counts
        self.before = np.cumsum(counts, axis=0) - counts  # local rows of each part before a block
        self.starts = None
        self._buffers = None

    def __len__(self) -> int:
        return len(self.bounds)

    def prepare(self) -> None:
        """Write every part's header; the row area is sized (sparse) and filled by the blocks."""
        x, sizes = self.graph.x, self.partition.sizes
        self.starts = [_start_npy(path, x.dtype, (int(sizes[r]), int(x.shape[1])))
                       for r, path in enumerate(self.paths)]

    def write(self, i: int, writer=None) -> int:
        """Write block ``i`` (its rows gathered here, written by ``writer.submit`` when given:
        see ``write_through.Background``); returns its row count."""
        a, b = self.bounds[i]
        rows = b - a
        x, owner = self.graph.x, self.partition.owner
        if self._buffers is None or self._buffers[0] != os.getpid():  # reused within a process
            self._buffers = (os.getpid(), [np.empty((self.step, x.shape[1]), x.dtype)
                                           for _ in range(2)], [0])
        _, buffers, turn = self._buffers
        grouped = buffers[turn[0]]  # the other one may still be on its way to the disk
        turn[0] ^= 1
        order = np.argsort(owner[a:b], kind="stable")  # rows grouped by part, ascending
        # straight from the (mapped) rows into a reused buffer: one copy, unbuffered
        np.take(np.asarray(x[a:b]), order, axis=0, out=grouped[:rows], mode="clip")
        release(x)
        if writer is None:
            self._put(i, grouped)
        else:
            writer.submit(self._put, i, grouped)
        return rows

    def _put(self, i: int, grouped: np.ndarray) -> None:
        at = 0
        for rank in np.flatnonzero(self.counts[i]):
            c = int(self.counts[i, rank])
            fd = os.open(self.paths[rank], os.O_WRONLY)
            try:
                offset = self.starts[rank] + int(self.before[i, rank]) * self.row_bytes
                pwrite_through(fd, grouped[at:at + c], offset)
            finally:
                os.close(fd)
            at += c


def write_small_arrays(graph, partition: Partition, folders) -> None:
    """``y`` and the masks of every part (O(n) bytes, gathered in memory)."""
    for name in SMALL_ARRAYS:
        full = np.asarray(getattr(graph, name))
        for rank in range(partition.num_parts):
            save_npy(os.path.join(folders[rank], f"{name}.npy"), full[partition.vertices(rank)])
        release(getattr(graph, name))
        del full
