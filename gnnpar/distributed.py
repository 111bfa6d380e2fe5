"""The distributed full-batch runtime: this rank's rows, its SpMM operator, and the
collectives the training loop needs (:class:`gnnpar.interfaces.Runtime`)."""
from __future__ import annotations

import numpy as np
import torch

from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.comm import Comm
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.kernels.local import as_tensor

from .interfaces import SPLITS, CommStats, Reducer
from .trainer import RuntimeCollectives

EPOCH_PHASES = ("forward", "backward", "grad_sync")


class DistRuntime(RuntimeCollectives):
    """One rank's view of a distributed full-batch run.

    ``shard`` (``gnnpar.partitioners`` Shard) gives the rows this rank owns (an operator may
    own others: ``row_ids``, e.g. with ``permute=True``); ``algo`` picks the operator (3d/4d
    with ``layers=L`` give a list, one per layer). Weights are replicated and every rank owns
    distinct rows in every algorithm, so the ranks sharing a weight block are all ranks:
    gradients are summed over every axis once per step. The grid must hold the group of all
    its axes together (the registry entry's ``make_grid`` builds it,
    :mod:`gnnpar.kernels.algorithms`).
    """

    def __init__(self, grid: ProcessGrid, shard, algo: str, norm: str, device="cpu",
                 wire_dtype=None, **algo_kw):
        self.grid, self.algo, self.device = grid, algo, torch.device(device)
        self.comm = Comm(grid, wire_dtype)
        with self.comm.in_phase("setup"):
            self.op = algorithm(algo).build(shard, self.comm, norm, self.device, **algo_kw)
        # a list holds one operator per layer (3d/4d axis rotation); they own the same rows
        first = self.op[0] if isinstance(self.op, (list, tuple)) else self.op
        rows = first.row_ids if hasattr(first, "row_ids") else None
        self.global_ids = np.asarray(shard.global_ids if rows is None else rows)
        take = (lambda a: np.asarray(a)) if rows is None else (lambda a: first.take_rows(shard, a))
        with self.comm.in_phase("setup"):
            self.x = as_tensor(take(shard.x), np.float32, self.device)
            self.y = as_tensor(take(shard.y), np.int64, self.device)
            self.masks = {s: as_tensor(take(getattr(shard, f"{s}_mask")), np.bool_, self.device)
                          for s in SPLITS}
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
        _, per_key, seconds = self.comm.reset()
        mine = sum(b for (axis, phase), b in per_key.items() if phase in EPOCH_PHASES)
        t = torch.tensor([mine, mine, seconds, total_s], dtype=torch.float64)
        tsum, tmax = self.reducer.sum(t), self.reducer.max(t)
        return CommStats(int(tsum[0]), int(tmax[1]), float(tmax[2]), float(tmax[3]), timing)
