"""The distributed full-batch runtime: this rank's rows, its SpMM operator, and the
collectives the training loop needs (see ``gnnpar.trainer`` for the protocol)."""
from __future__ import annotations

import numpy as np
import torch

from gnnpar.kernels.build import build_operator
from gnnpar.kernels.comm import Comm
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.kernels.local import as_tensor

EPOCH_PHASES = ("forward", "backward", "grad_sync")


class DistRuntime:
    """One rank's view of a distributed full-batch run.

    ``shard`` (``gnnpar.partitioners`` Shard) gives the rows this rank owns (an operator may
    own others: ``row_ids``, e.g. with ``permute=True``); ``algo`` picks the operator (3d/4d
    with ``layers=L`` give a list, one per layer). Weights are replicated and every rank owns
    distinct rows in every algorithm, so the ranks sharing a weight block are all ranks:
    gradients are summed over every axis once per step. The grid must hold the group of all
    its axes together (``gnnpar.kernels.build.make_grid`` builds it).
    """

    def __init__(self, grid: ProcessGrid, shard, algo: str, norm: str, device="cpu", **algo_kw):
        self.grid, self.algo, self.device = grid, algo, torch.device(device)
        self.comm = Comm(grid)
        with self.comm.in_phase("setup"):
            self.op = build_operator(algo, shard, self.comm, norm, self.device, **algo_kw)
        # a list holds one operator per layer (3d/4d axis rotation); they own the same rows
        first = self.op[0] if isinstance(self.op, (list, tuple)) else self.op
        rows = first.row_ids if hasattr(first, "row_ids") else None
        self.global_ids = np.asarray(shard.global_ids if rows is None else rows)
        take = (lambda a: np.asarray(a)) if rows is None else (lambda a: first.take_rows(shard, a))
        with self.comm.in_phase("setup"):
            self.x = as_tensor(take(shard.x), np.float32, self.device)
            self.y = as_tensor(take(shard.y), np.int64, self.device)
            self.masks = {s: as_tensor(take(getattr(shard, f"{s}_mask")), np.bool_, self.device)
                          for s in ("train", "val", "test")}
        self.world_axes = tuple(grid.shape)
        self.comm.reset()

    # -- metrics reductions: small, not part of the algorithm's traffic, not counted
    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.comm.reduce_control(t, self.world_axes)

    def all_reduce_max(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.float64)
        return int(self.comm.reduce_control(t, self.world_axes, "max")[0])

    def sync_grads(self, params) -> None:
        """Sum gradients over all ranks: one flat all-reduce (phase ``grad_sync``)."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads or self.grid.world_size == 1:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        with self.comm.in_phase("grad_sync"):
            self.comm.all_reduce(flat, self.world_axes)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def comm_stats(self):
        """(bytes of all ranks, bytes of the busiest rank, seconds) of forward + backward +
        gradient sync since the last call; counters are then reset."""
        _, per_key, seconds = self.comm.reset()
        mine = sum(b for (axis, phase), b in per_key.items() if phase in EPOCH_PHASES)
        if self.grid.world_size == 1:
            return mine, mine, seconds
        t = torch.tensor([mine, mine, seconds], dtype=torch.float64)
        tsum = self.comm.reduce_control(t, self.world_axes)
        tmax = self.comm.reduce_control(t, self.world_axes, "max")
        return int(tsum[0]), int(tmax[1]), float(tmax[2])
