"""Shard files written through to the disk and out of the page cache as they go.

A shard folder is written once and read later by other processes (the ranks), often on other
machines, so the writer has no use for its pages in its own page cache. Left there, the
dirty pages of a 2.6 GB scale-21 shard set make the kernel find 2.6 GB of free pages while
the writer runs and flush them afterwards. :func:`pwrite_through` writes in
:data:`CHUNK`-byte pieces, waits for each piece to reach the disk (``fdatasync``) and hands
its pages back (``POSIX_FADV_DONTNEED``), so the writer's page-cache footprint stays one chunk
and the next chunk reuses the pages just freed. It also makes every file durable before
``meta.json`` names the folder complete, which crash safety wants anyway.

Written through, a file costs the writer the disk's time: :class:`Background` moves the
writes of a shard task to one thread of its process, so the next task's passes (compiled,
without the GIL) run while the disk takes the last one's files.

Figures (buffered against written through, 2.56 GB in 16 files from 2 processes) are in
``docs/performance.md``. Where ``posix_fadvise`` does not exist (macOS) the pages stay cached;
the data are still written the same.
"""
from __future__ import annotations

import os
import threading

import numpy as np

#: bytes written, synced and dropped at a time
CHUNK = 8 << 20

_sync = getattr(os, "fdatasync", os.fsync)


def pwrite_through(fd: int, data, offset: int) -> None:
    """Write the bytes of ``data`` (a buffer) at ``offset`` of ``fd``, chunk by chunk, each
    synced to the disk and dropped from the page cache before the next."""
    data = memoryview(data).cast("B")
    while len(data):
        piece = data[:CHUNK]
        at, left = offset, piece
        while len(left):
            done = os.pwrite(fd, left, at)
            left, at = left[done:], at + done
        _sync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, offset, len(piece), os.POSIX_FADV_DONTNEED)
        data, offset = data[len(piece):], offset + len(piece)


def save_npy(path: str, arr: np.ndarray) -> None:
    """``np.save(path, arr)`` (the same bytes) for a C-contiguous array, written through."""
    arr = np.ascontiguousarray(arr)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(arr))
        f.flush()
        pwrite_through(f.fileno(), arr.reshape(-1).view(np.uint8), f.tell())


class Background:
    """One writer thread for this process: :meth:`submit` waits for the job before (so at
    most one is pending: one task's arrays, and a double buffer suffices for reused ones),
    then starts ``fn(*args)``; :meth:`flush` waits for the last. A job's error is raised by
    the next :meth:`submit` or :meth:`flush`, in the caller's thread."""

    def __init__(self):
        self._thread = None
        self._error = None

    def _run(self, fn, args) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self._error = exc

    def flush(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def submit(self, fn, *args) -> None:
        self.flush()
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True,
                                        name="gnnpar-shard-writer")
        self._thread.start()


_WRITERS = {}


def background() -> Background:
    """This process's :class:`Background` (a forked worker makes its own)."""
    pid = os.getpid()
    if pid not in _WRITERS:
        _WRITERS.clear()  # a parent's, inherited by fork: not this process's thread
        _WRITERS[pid] = Background()
    return _WRITERS[pid]
