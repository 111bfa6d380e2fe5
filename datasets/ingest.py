"""Where generators and readers put a graph: memory or a cache folder, through one interface.

A generator or reader writes its arrays into an *output* (:class:`MemoryWriter` here, or
:class:`gnnpar.datasets.cache.CacheWriter`) in the cache's array order, whole or in blocks of
rows, sets ``name``, ``num_classes`` and ``meta``, and the caller calls ``finish()``: a
:class:`Graph` in memory, or a cache folder on disk written in bounded memory. The same code
thus builds the in-memory graph and the cache, and both have the same fingerprint.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from .csr_stream import EdgeSpill, build_csr, csr_blocks
from .errors import InputError
from .graph import Graph

#: bytes of one block of generated or parsed rows (features): bounds the temporaries
ROW_BLOCK_BYTES = 1 << 24


class _MemoryStream:
    """:class:`gnnpar.datasets.cache.NpyStream`'s interface, filling an array in memory."""

    def __init__(self, dtype, shape):
        self.dtype, self.rows, self.tail = np.dtype(dtype), shape[0], tuple(shape[1:])
        self.written, self.closed = 0, False
        self.array = None if self.rows is None else np.empty(tuple(shape), dtype=self.dtype)
        self._blocks = []

    def append(self, block) -> None:
        block = np.asarray(block)
        if block.dtype != self.dtype or tuple(block.shape[1:]) != self.tail:
            raise ValueError(f"block {block.dtype} {block.shape} does not fit {self.dtype} "
                             f"(rows,) + {self.tail}")
        k = block.shape[0]
        if self.array is None:
            self._blocks.append(block.copy())
        else:
            if self.written + k > self.rows:
                raise ValueError(f"more than the {self.rows} rows announced")
            self.array[self.written:self.written + k] = block
        self.written += k

    def close(self) -> tuple:
        if not self.closed:
            if self.array is None:
                self.array = (np.concatenate(self._blocks) if self._blocks
                              else np.zeros((0,) + self.tail, dtype=self.dtype))
                self._blocks = []
            elif self.written != self.rows:
                raise ValueError(f"{self.written} rows written, {self.rows} announced")
            self.closed = True
        return self.array.shape


class MemoryWriter:
    """The output that assembles a :class:`Graph` in memory (see the module docstring)."""

    holds_arrays = True  # every array stays in memory (for memory estimates)

    def __init__(self):
        self.name, self.num_classes, self.meta = "graph", None, {}
        self._arrays = {}

    def __enter__(self) -> "MemoryWriter":
        return self

    def __exit__(self, *exc) -> None:
        self._arrays = {}

    def scratch(self, name: str) -> Optional[str]:
        """No scratch file: spills stay in memory."""
        return None

    def open(self, name: str, dtype, shape) -> _MemoryStream:
        if name in self._arrays:
            raise ValueError(f"array '{name}' written twice")
        stream = self._arrays[name] = _MemoryStream(dtype, tuple(shape))
        return stream

    def write(self, name: str, arr) -> None:
        arr = np.asarray(arr)
        if name in self._arrays:
            raise ValueError(f"array '{name}' written twice")
        stream = self._arrays[name] = _MemoryStream(arr.dtype, arr.shape)
        stream.array, stream.written, stream.closed = arr, arr.shape[0], True

    def finish(self, validate: bool = False, where: str = "") -> Graph:
        arrays = {}
        for name, stream in self._arrays.items():
            stream.close()
            arrays[name] = stream.array
        self._arrays = {}
        graph = Graph(num_classes=int(self.num_classes), name=self.name, meta=self.meta, **arrays)
        if validate:
            try:
                graph.validate()
            except InputError as exc:
                raise InputError(f"{where}: {exc}" if where else str(exc)) from None
        return graph


def write_csr(out, indptr: np.ndarray, cols: np.ndarray) -> None:
    """Store a :func:`gnnpar.datasets.csr_stream.build_csr` result as ``indptr``/``indices``
    (int64), converting the columns a block at a time."""
    out.write("indptr", indptr)
    stream = out.open("indices", np.int64, (cols.size,))
    for block in csr_blocks(cols):
        stream.append(block)
    stream.close()


def write_rows(out, name: str, dtype, shape: tuple, make: Callable[[int, int], np.ndarray]) -> None:
    """Store array ``name`` of ``shape`` built ``make(start, stop)`` rows at a time, blocks
    of about :data:`ROW_BLOCK_BYTES` (``make`` is called in row order, once per block)."""
    row = max(1, np.dtype(dtype).itemsize * int(np.prod(shape[1:], dtype=np.int64)))
    step = max(1, ROW_BLOCK_BYTES // row)
    stream = out.open(name, dtype, shape)
    for start in range(0, shape[0], step):
        stream.append(make(start, min(shape[0], start + step)))
    stream.close()


def edge_spill(out, name: str = "edges") -> EdgeSpill:
    """An :class:`EdgeSpill` in memory for a memory output, in a scratch file of a cache."""
    return EdgeSpill(out.scratch(name))


def feature_block_bytes(nbytes: int, itemsize: int, block: int) -> int:
    """Temporaries of :func:`write_features` for features stored in ``nbytes`` bytes of
    ``itemsize``-byte floats read ``block`` bytes at a time: one block and its float32 copy."""
    read = min(int(nbytes), int(block))
    return read + (read * 4 // itemsize if itemsize != 4 else 0)


def write_features(out, blocks, n: Optional[int], where: str) -> tuple:
    """Store ``x`` from ``(first row, rows)`` blocks as float32, ``n`` rows (None: as many as
    come); returns its shape. Rows holding NaN or inf are refused once all are read,
    counted and the first named, as :meth:`Graph.validate` words it."""
    stream, rows, bad_rows, first_bad = None, 0, 0, None
    for _, block in blocks:
        if block.ndim != 2 or not np.issubdtype(block.dtype, np.floating):
            raise InputError(f"{where}: x must be a 2-D float array, "
                             f"got {block.dtype} {block.shape}")
        block = block.astype(np.float32, copy=False)
        if stream is None:
            stream = out.open("x", np.float32, (n, block.shape[1]))
        bad = ~np.isfinite(block).all(axis=1)
        if bad.any():
            first_bad = rows + int(np.argmax(bad)) if first_bad is None else first_bad
            bad_rows += int(bad.sum())
        stream.append(block)
        rows += block.shape[0]
    if stream is None:
        stream = out.open("x", np.float32, (0, 0))
    shape = stream.close()
    if bad_rows:
        raise InputError(f"{where}: x contains NaN or inf in {bad_rows} row(s), "
                         f"first at node {first_bad}")
    return shape


def checked_edges(blocks, n: int, locate: Callable[[int, int], str]):
    """``(src, dst)`` of ``(first, src, dst)`` blocks, refusing an id outside ``[0, n)`` with
    ``locate(first, i)`` (e.g. "FILE line N") naming where it was read."""
    for first, src, dst in blocks:
        bad = (src < 0) | (src >= n) | (dst < 0) | (dst >= n)
        if bad.any():
            i = int(np.argmax(bad))
            value = src[i] if (src[i] < 0 or src[i] >= n) else dst[i]
            raise InputError(f"{locate(first, i)}: edge endpoint {int(value)} "
                             f"is out of range [0, {n})")
        yield src, dst


def write_edges(out, chunks, n: int, directed: bool, progress=None) -> None:
    """Store the CSR of edge chunks read from a file: self loops kept, repeats merged."""
    write_csr(out, *build_csr(chunks, n, directed, edge_spill(out), drop_loops=False,
                              progress=progress))
