"""Full-batch training loop shared by the serial and every distributed runtime.

A *runtime* supplies this rank's rows and the collectives the loop needs:

- ``op`` — the aggregation operator handed to the model (see ``gnnpar.models``);
- ``x`` (n_local, f), ``y`` (n_local,), ``masks`` dict of bool (n_local,) — this rank's rows;
- ``all_reduce_sum(t)`` — sum a small tensor over all ranks (identity when serial);
- ``sync_grads(params)`` — sum each parameter's gradient over the ranks that share it;
- ``comm_stats()`` — ``(bytes, bytes_max_rank, seconds)`` since the last call (zeros serially);
- optionally ``start_pass()`` — called before each forward pass (the serial runtime rewinds
  its reused SpMM output buffers there).

The loss is the global mean cross-entropy over training nodes: each rank sums its rows' losses
and divides by the global count, so the summed gradients equal the serial ones exactly.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
from torch.nn import functional as F

from .memory import peak_memory_bytes

SPLITS = ("train", "val", "test")


@dataclass
class TrainConfig:
    """Optimisation settings.

    epochs: full passes over the graph (default 100).
    lr: Adam learning rate (default 0.01).
    weight_decay: Adam L2 penalty (default 5e-4).
    eval_every: evaluate accuracies every k epochs, and always at the last (default 1).
    """

    epochs: int = 100
    lr: float = 0.01
    weight_decay: float = 5e-4
    eval_every: int = 1

    def __post_init__(self):
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")


class SerialComm:
    """The collectives of a one-rank run: all identities."""

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def sync_grads(self, params) -> None:
        return None

    def comm_stats(self):
        return 0, 0, 0.0


def _counts(logits: torch.Tensor, y: torch.Tensor, masks: Dict[str, torch.Tensor]) -> torch.Tensor:
    pred = logits.argmax(dim=1)
    right = pred == y
    return torch.stack([torch.stack([(right & masks[s]).sum(), masks[s].sum()]) for s in SPLITS]
                       ).to(torch.float64).flatten()


def train_step(model, opt, rt, train_count: float) -> torch.Tensor:
    """One forward/backward/step; returns this rank's summed loss (detached, float64)."""
    model.train()
    opt.zero_grad(set_to_none=True)
    start_pass(rt)
    out = model(rt.op, rt.x)
    mask = rt.masks["train"]
    loss_sum = F.cross_entropy(out[mask], rt.y[mask], reduction="sum")
    (loss_sum / train_count).backward()
    rt.sync_grads(list(model.parameters()))
    opt.step()
    return loss_sum.detach().to(torch.float64)


@torch.no_grad()
def evaluate(model, rt) -> Dict[str, float]:
    """Accuracy on train/val/test over all ranks."""
    model.eval()
    start_pass(rt)
    c = rt.all_reduce_sum(_counts(model(rt.op, rt.x), rt.y, rt.masks))
    return {f"{s}_acc": float(c[2 * i] / max(c[2 * i + 1], 1)) for i, s in enumerate(SPLITS)}


def make_optimizer(model, cfg: TrainConfig):
    """The optimiser every trainer uses (Adam), made before a checkpoint can restore it."""
    return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def fit(model, rt, cfg: TrainConfig, on_epoch: Optional[Callable[[dict], None]] = None,
        start_epoch: int = 0, opt=None):
    """Train ``model`` on runtime ``rt``; calls ``on_epoch(record)`` after every epoch.

    Returns the list of epoch records (fields of DESIGN.md's JSON log, minus run-level ones).
    An epoch whose global loss is NaN or infinite (the same on every rank) is the last: its
    record is made and passed on, then training stops (the run has diverged).
    """
    opt = opt or make_optimizer(model, cfg)
    train_count = float(rt.all_reduce_sum(rt.masks["train"].sum().to(torch.float64)))
    rt.comm_stats()  # reset the counters: setup traffic is not an epoch's
    history = []
    accs = {f"{s}_acc": float("nan") for s in SPLITS}
    for epoch in range(start_epoch, cfg.epochs):
        t0 = time.perf_counter()
        loss_sum = train_step(model, opt, rt, train_count)
        loss = float(rt.all_reduce_sum(loss_sum.reshape(1))[0]) / train_count
        if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
            accs = evaluate(model, rt)
        sync_device(rt.x.device)
        epoch_s = time.perf_counter() - t0
        nbytes, nbytes_max, comm_s = rt.comm_stats()
        rec = {"epoch": epoch, "loss": loss, **accs, "epoch_s": epoch_s,
               "compute_s": max(epoch_s - comm_s, 0.0), "comm_s": comm_s,
               "comm_bytes": nbytes, "comm_bytes_max_rank": nbytes_max,
               "peak_mem_bytes": peak_memory_bytes(rt.x.device, rt)}
        history.append(rec)
        if on_epoch is not None:
            on_epoch(rec)
        if not math.isfinite(loss):  # diverged: every rank sees the same global loss
            break
    return history


def start_pass(rt) -> None:
    """Tell a runtime that reuses its SpMM outputs that a new forward pass begins."""
    if hasattr(rt, "start_pass"):
        rt.start_pass()


def sync_device(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
