"""Edge lists to CSR in bounded memory: count, fill, then sort and merge each row block.

Pass 1 reads the edge chunks once, counting each row's raw entries and keeping the chunks
in an :class:`EdgeSpill` (memory, or a scratch file next to a cache being written); pass 2
replays the spill and puts every entry's column (uint32) at its row's next free slot of one
preallocated array; pass 3 sorts and merges repeats row block by row block, compacting the
array in place. Memory is 4 bytes per raw entry, a few int64 per row, and temporaries
bounded by :data:`BATCH` entries, whatever the number of chunks — never the 30-odd bytes per
entry of building the CSR with one global sort.

Row = target (``dst``), column = source: row ``i`` aggregates from its columns. Undirected
streams store both directions of every edge. The result equals :meth:`Graph.csr_from_edges`
on the concatenated edges (columns sorted and unique in every row).
"""
from __future__ import annotations

import os
from typing import Callable, Iterable, Iterator, Optional, Tuple

import numpy as np

from .errors import InputError
from .progress import throttled

#: entries sorted per step in passes 2 and 3: bounds the temporaries (~40 bytes an entry)
BATCH = 1 << 22
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)

Edges = Tuple[np.ndarray, np.ndarray]


def csr_bytes(entries: int, n: int, in_memory: bool) -> int:
    """About the peak bytes :func:`build_csr` needs for ``entries`` raw entries (both
    directions counted) of ``n`` rows: 4 bytes an entry, five int64 a row, one batch of
    sort temporaries (~32 bytes an entry); ``in_memory`` adds the spilled edges and the int64
    result."""
    return 4 * entries + 40 * n + 32 * min(entries, BATCH) + (16 * entries if in_memory else 0)


def _directions(src: np.ndarray, dst: np.ndarray, directed: bool):
    """(rows, cols) pairs of one chunk: row = target; undirected adds every edge reversed."""
    return ((dst, src),) if directed else ((dst, src), (src, dst))


def _count(counts: np.ndarray, rows: np.ndarray) -> None:
    """counts[r] += occurrences of r in ``rows``, in time independent of the row count when
    the chunk is small next to it."""
    if rows.size == 0:
        return
    if 4 * rows.size >= counts.size:
        counts += np.bincount(rows, minlength=counts.size)
    else:
        ids, k = np.unique(rows, return_counts=True)
        counts[ids] += k


def _fill(raw: np.ndarray, cursor: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> None:
    """Place ``cols`` at their rows' next free slots of ``raw`` and advance ``cursor``."""
    for start in range(0, rows.size, BATCH):
        key = rows[start:start + BATCH].astype(np.uint64)
        key <<= _SHIFT
        key |= cols[start:start + BATCH]
        key.sort()  # groups the rows; one sort of 64-bit keys beats an argsort of the rows
        r = key >> _SHIFT
        first = np.flatnonzero(np.concatenate(([True], r[1:] != r[:-1])))
        lengths = np.diff(np.append(first, r.size))
        head = r[first]
        del r
        pos = np.repeat(cursor[head] - first, lengths)
        pos += np.arange(key.size, dtype=np.int64)
        raw[pos] = key.astype(np.uint32)  # the low 32 bits: the column
        cursor[head] += lengths


def _merge_rows(raw: np.ndarray, rawptr: np.ndarray, say) -> np.ndarray:
    """Sort and deduplicate every row of the raw CSR in place (compacting ``raw``); returns
    the final count of each row."""
    n = rawptr.size - 1
    final = np.zeros(n, dtype=np.int64)
    out, r0 = 0, 0
    while r0 < n:
        a = int(rawptr[r0])
        r1 = int(np.searchsorted(rawptr, a + BATCH, side="right")) - 1
        r1 = min(n, max(r1, r0 + 1))
        b = int(rawptr[r1])
        if b > a:
            key = np.repeat(np.arange(r1 - r0, dtype=np.uint64), np.diff(rawptr[r0:r1 + 1]))
            key <<= _SHIFT
            key |= raw[a:b]
            key.sort()
            keep = np.empty(key.size, dtype=bool)
            keep[0] = True
            np.not_equal(key[1:], key[:-1], out=keep[1:])
            key = key[keep]
            final[r0:r1] = np.bincount((key >> _SHIFT).view(np.int64), minlength=r1 - r0)
            raw[out:out + key.size] = key.astype(np.uint32)  # out <= a: never ahead of the reads
            out += key.size
        r0 = r1
        say(f"csr: sorted rows up to {r1:,} of {n:,}")
    return final


def build_csr(chunks: Iterable[Edges], n: int, directed: bool, spill: "EdgeSpill",
              drop_loops: bool = False, progress: Optional[Callable[[str], None]] = None):
    """CSR ``(indptr int64 (n+1,), cols uint32 (m,))`` of the edges in ``chunks``.

    ``chunks`` yields ``(src, dst)`` integer arrays with ids already checked to lie in
    ``[0, n)``; it is read once, into ``spill`` (emptied on return). ``drop_loops`` drops
    self loops (the generators' convention); otherwise a loop is kept once. Repeated edges
    are merged. ``cols`` is a view of the working array: convert it in blocks
    (:func:`csr_blocks`) rather than whole.
    """
    if n > 1 << 32:
        raise InputError(f"{n:,} nodes: the streamed CSR builder holds node ids in 32 bits "
                         f"(at most {1 << 32:,} nodes)")
    say = throttled(progress)
    counts = np.zeros(n, dtype=np.int64)
    say(f"csr: counting the entries of {n:,} rows", force=True)
    try:
        for src, dst in chunks:
            src, dst = np.asarray(src), np.asarray(dst)
            if drop_loops:
                keep = src != dst
                src, dst = src[keep], dst[keep]
            for rows, _ in _directions(src, dst, directed):
                _count(counts, rows)
            spill.add(src, dst)
        rawptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=rawptr[1:])
        del counts
        raw = np.empty(int(rawptr[-1]), dtype=np.uint32)
        cursor = rawptr[:-1].copy()
        say(f"csr: {spill.edges:,} edges, {raw.size:,} entries; placing them", force=True)
        done = 0
        for src, dst in spill.replay():
            for rows, cols in _directions(src, dst, directed):
                _fill(raw, cursor, rows, cols)
                done += rows.size
            say(f"csr: placed {done:,} of {raw.size:,} entries")
    finally:
        spill.remove()
    if done != raw.size or not np.array_equal(cursor, rawptr[1:]):  # pragma: no cover
        raise RuntimeError("the edge spill returned other edges than were put in")
    del cursor
    say("csr: sorting and merging the rows", force=True)
    final = _merge_rows(raw, rawptr, say)
    del rawptr
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(final, out=indptr[1:])
    return indptr, raw[:int(indptr[-1])]


def csr_blocks(cols: np.ndarray, step: Optional[int] = None) -> Iterator[np.ndarray]:
    """``cols`` as int64 (the stored dtype), ``step`` (default :data:`BATCH`) entries at a time."""
    step = step or BATCH
    for start in range(0, cols.size, step):
        yield cols[start:start + step].astype(np.int64)


class EdgeSpill:
    """Edge chunks kept for a second pass: in memory, or appended to a scratch file.

    Ids are stored as uint32 (the caller has checked them against the node count, which
    :func:`build_csr` limits to 2**32), 8 bytes an edge.
    """

    def __init__(self, path: Optional[str] = None):
        self.path, self.edges = path, 0
        self._chunks, self._sizes = [], []
        self._f = None if path is None else open(path, "wb")

    def add(self, src: np.ndarray, dst: np.ndarray) -> None:
        src = np.ascontiguousarray(src, dtype=np.uint32)
        dst = np.ascontiguousarray(dst, dtype=np.uint32)
        if self._f is None:
            self._chunks.append((src, dst))
        elif src.size:
            self._f.write(memoryview(src).cast("B"))
            self._f.write(memoryview(dst).cast("B"))
        self._sizes.append(src.size)
        self.edges += src.size

    def replay(self) -> Iterator[Edges]:
        """The chunks as added, (src, dst) uint32."""
        if self._f is None:
            yield from self._chunks
            return
        self._f.close()
        with open(self.path, "rb") as f:
            for k in self._sizes:
                if k:
                    yield (np.fromfile(f, dtype=np.uint32, count=k),
                           np.fromfile(f, dtype=np.uint32, count=k))

    def remove(self) -> None:
        """Drop what was kept (delete the scratch file)."""
        self._chunks, self._sizes = [], []
        if self._f is not None:
            self._f.close()
            if os.path.exists(self.path):
                os.remove(self.path)
