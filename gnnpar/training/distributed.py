"""The distributed full-batch runtime: this rank's rows, its SpMM operator, and the
collectives the training loop needs (:class:`gnnpar.interfaces.Runtime`).

Memory (a rank's peak held near its shard's size): a shard is memory-mapped, and a mapped
page counts in the resident set once read. The operator holds its own copies of the sparse
arrays, so once it is built the shard's pages are handed back (:func:`release`; a later read
maps them again); the node rows (``x``, ``y``, masks) are not copied but mapped again
copy-on-write and used in place (:func:`rows_tensor`).
"""
from __future__ import annotations

import mmap
import os

import numpy as np
import torch

from gnnpar.kernels.comm import Comm
from gnnpar.kernels.entry import Algorithm
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.kernels.local import as_tensor
from gnnpar.partitioners.node_stream import release

from gnnpar.interfaces import SPLITS, CommStats, Reducer
from gnnpar.training.trainer import RuntimeCollectives

EPOCH_PHASES = ("forward", "backward", "grad_sync")


class DistRuntime(RuntimeCollectives):
    """One rank's view of a distributed full-batch run.

    ``shard`` (``gnnpar.partitioners`` Shard) gives the rows this rank owns (an operator may
    own others: ``row_ids``, e.g. with ``permute=True``); ``entry``, the algorithm's registry
    entry (the one the grid was made with, passed down), builds the operator (3d/4d with
    ``layers=L`` give a list, one per layer). Weights are replicated and every rank owns
    distinct rows in every algorithm, so the ranks sharing a weight block are all ranks:
    gradients are summed over every axis once per step. The grid must hold the group of all
    its axes together (the registry entry's ``make_grid`` builds it,
    :mod:`gnnpar.kernels.algorithms`).
    """

    def __init__(self, grid: ProcessGrid, shard, entry: Algorithm, norm: str, device="cpu",
                 wire_dtype=None, **algo_kw):
        self.grid, self.algo, self.device = grid, entry.name, torch.device(device)
        self.comm = Comm(grid, wire_dtype)
        with self.comm.in_phase("setup"):
            self.op = entry.build(shard, self.comm, norm, self.device, **algo_kw)
        # a list holds one operator per layer (3d/4d axis rotation); they own the same rows
        first = self.op[0] if isinstance(self.op, (list, tuple)) else self.op
        rows = first.row_ids if hasattr(first, "row_ids") else None
        self.global_ids = np.asarray(shard.global_ids if rows is None else rows)
        take = (lambda a: a) if rows is None else (lambda a: first.take_rows(shard, a))
        with self.comm.in_phase("setup"):
            self.x = rows_tensor(take(shard.x), np.float32, self.device)
            self.y = rows_tensor(take(shard.y), np.int64, self.device)
            self.masks = {s: rows_tensor(take(getattr(shard, f"{s}_mask")), np.bool_,
                                         self.device) for s in SPLITS}
        release_shard(shard)  # the operator and the rows above hold what training reads
        self.world_axes = tuple(grid.shape)
        # gradients: over every axis; every rank's cover the same parameters
        self.reducer = Reducer(self.comm, self.world_axes, missing="skip")
        self.comm.reset()

    def comm_stats(self) -> CommStats:
        """(bytes of all ranks, bytes of the busiest rank, exposed and total seconds of the
        slowest rank, what timed them on this rank: :attr:`Comm.timing`) of forward + backward
        + gradient sync since the last call; counters are then reset. Reading the seconds
        resolves the CUDA events of the epoch's collectives (one synchronize)."""
        total_s, timing = self.comm.total_seconds, self.comm.timing
        counts = self.comm.reset()
        per_key, seconds = counts.by_key, counts.seconds
        mine = sum(b for (axis, phase), b in per_key.items() if phase in EPOCH_PHASES)
        t = torch.tensor([mine, mine, seconds, total_s], dtype=torch.float64)
        tsum, tmax = self.reducer.sum(t), self.reducer.max(t)
        return CommStats(int(tsum[0]), int(tmax[1]), float(tmax[2]), float(tmax[3]), timing)


def release_shard(shard) -> None:
    """Hand back the resident pages of every memory-mapped array of ``shard`` (a no-op for
    arrays in memory); the arrays stay valid, a later read maps their pages again."""
    for value in vars(shard).values():
        for a in (value.values() if isinstance(value, dict) else (value,)):
            if isinstance(a, np.ndarray):
                release(a)


def rows_tensor(a, dtype, device) -> torch.Tensor:
    """A tensor of the node rows ``a`` (``as_tensor``), with no copy of a whole read-only
    memory-mapped ``.npy`` array of ``dtype`` (a loaded shard's): the same file (checked by
    device and inode against the mapping's, so a shard rewritten since is never read) is
    mapped again copy-on-write. The tensor is then writable (a write would copy the page it
    touches, never reach the file) and its pages are the page cache's, read on use and given
    back under memory pressure; training only reads these rows. On another device than the
    CPU the rows are copied there from the map, whose pages are then handed back."""
    if not (isinstance(a, np.memmap) and isinstance(a.base, mmap.mmap)  # not a view
            and not a.flags.writeable and a.flags.c_contiguous and a.dtype == np.dtype(dtype)
            and a.size and getattr(a, "filename", None)):
        return as_tensor(a, dtype, device)
    try:
        with open(a.filename, "rb") as fh:
            if _mapped_file(a.ctypes.data) != _file_id(os.fstat(fh.fileno())):
                return as_tensor(a, dtype, device)  # replaced since it was mapped
            cow = np.memmap(fh, dtype=a.dtype, mode="c", offset=a.offset, shape=a.shape)
    except (OSError, ValueError):  # gone, or shorter now: copy what is mapped
        return as_tensor(a, dtype, device)
    t = torch.from_numpy(cow)
    if device is None or torch.device(device).type == "cpu":
        t._gnnpar_mapped_rows = cow  # for drop_row_pages
        return t
    t = t.to(device)
    release(cow)
    return t


def drop_row_pages(t: torch.Tensor) -> None:
    """Hand back the resident pages of rows :func:`rows_tensor` mapped from a file (a no-op
    for any other tensor): they are the file's, and a later read maps them again. Only for
    rows that nothing wrote (a written page would go back to the file's values), as every
    reader of a shard's rows is."""
    mapped = getattr(t, "_gnnpar_mapped_rows", None)
    if mapped is not None:
        release(mapped)


def _file_id(st) -> tuple:
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def _mapped_file(address: int):
    """(major, minor, inode) of the file mapped at ``address`` (``/proc/self/maps``), or
    None (no such mapping, or no ``/proc``)."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                fields = line.split()
                lo, hi = (int(v, 16) for v in fields[0].split("-"))
                if lo <= address < hi:
                    major, minor = (int(v, 16) for v in fields[3].split(":"))
                    return major, minor, int(fields[4])
    except (OSError, ValueError, IndexError):
        return None
    return None
