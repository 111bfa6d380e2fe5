"""Full-batch training shared by the serial and every distributed runtime (the epoch loop
itself is every trainer's, :mod:`gnnpar.training.epochs`).

A *runtime* (:class:`gnnpar.interfaces.Runtime`) supplies this rank's rows (``op``, ``x``,
``y``, ``masks``) and the collectives the loop needs (``all_reduce_sum``, ``all_reduce_max``,
``sync_grads``, ``comm_stats`` → :class:`~gnnpar.interfaces.CommStats`, ``start_pass``);
:class:`RuntimeCollectives` gives them through one :class:`~gnnpar.interfaces.Reducer`.

The loss is the global mean cross-entropy over training nodes: each rank sums its rows' losses
and divides by the global count, so the summed gradients equal the serial ones exactly.

``TrainConfig.precision`` (``--precision``): each step (forward and backward) and evaluation
runs in :func:`gnnpar.nn.precision.matmuls`, the forward passes in
:func:`gnnpar.nn.precision.autocast` and the loss takes float32 logits
(:func:`gnnpar.nn.precision.loss_logits`, in :func:`gnnpar.nn.loss.summed_cross_entropy`);
parameters and optimiser stay float32.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

from gnnpar.training.epochs import memory_fields, run_epochs
from gnnpar.training.adam import FusedAdam, takes as fused_adam_takes
from gnnpar.interfaces import SPLITS, CommStats, LayerOps, Reducer
from gnnpar.nn.loss import summed_cross_entropy
from gnnpar.training.memory import RankMemory
from gnnpar.nn.precision import autocast, check, matmuls


#: ``--weight-decay``'s default per ``--task`` (:func:`default_weight_decay`)
NODE_WEIGHT_DECAY, LINK_WEIGHT_DECAY = 5e-4, 0.0


def default_weight_decay(task: str) -> float:
    """``--weight-decay`` left out: 5e-4 for node classification (the GCN paper's), 0 for link
    prediction. Decay pulls the encoder's embeddings toward zero, and a pair's score is a
    product of two of them: with it both decoders learn far more slowly (the figures are in
    ``docs/performance.md``, "Link prediction")."""
    return LINK_WEIGHT_DECAY if task == "link" else NODE_WEIGHT_DECAY


@dataclass
class TrainConfig:
    """Optimisation settings.

    epochs: full passes over the graph (default 100).
    lr: Adam learning rate (default 0.01).
    weight_decay: Adam L2 penalty (default 5e-4).
    eval_every: evaluate accuracies every k epochs, and always at the last (default 1).
    precision: ``"fp32"`` or ``"bf16"`` (mixed precision, :mod:`gnnpar.nn.precision`;
    default fp32).
    """

    epochs: int = 100
    lr: float = 0.01
    weight_decay: float = NODE_WEIGHT_DECAY
    eval_every: int = 1
    precision: str = "fp32"

    def __post_init__(self):
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")
        check(self.precision)


class RuntimeCollectives:
    """A runtime's collectives through its ``reducer`` (:class:`~gnnpar.interfaces.Reducer`,
    identities for one rank); ``comm_stats`` zeros and ``start_pass`` a no-op unless the
    runtime says otherwise."""

    reducer: Reducer = Reducer()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.reducer.sum(t)

    def all_reduce_max(self, value: int) -> int:
        return self.reducer.max_int(value)

    def sync_grads(self, params) -> None:
        self.reducer.sync_grads(params)

    def comm_stats(self) -> CommStats:
        return CommStats()

    def start_pass(self) -> None:
        return None


def accuracy_counts(logits: torch.Tensor, y: torch.Tensor,
                    masks: Dict[str, torch.Tensor]) -> torch.Tensor:
    pred = logits.argmax(dim=1)
    right = pred == y
    return torch.stack([torch.stack([(right & masks[s]).sum(), masks[s].sum()]) for s in SPLITS]
                       ).to(torch.float64).flatten()


def train_step(model, opt, runtime, train_count: float, precision: str = "fp32"
               ) -> torch.Tensor:
    """One forward/backward/step; returns this rank's summed loss (detached, float64)."""
    model.train()
    opt.zero_grad(set_to_none=True)
    runtime.start_pass()
    with matmuls(precision):
        with autocast(precision, runtime.x.device):
            out = model(LayerOps(runtime.op), runtime.x)
        mask = runtime.masks["train"]
        loss_sum = summed_cross_entropy(out, runtime.y, mask)
        (loss_sum / train_count).backward()
    runtime.sync_grads(list(model.parameters()))
    opt.step()
    return loss_sum.detach().to(torch.float64)


@torch.no_grad()
def evaluate(model, runtime, precision: str = "fp32") -> Dict[str, float]:
    """Accuracy on train/val/test over all ranks."""
    model.eval()
    runtime.start_pass()
    with matmuls(precision), autocast(precision, runtime.x.device):
        out = model(LayerOps(runtime.op), runtime.x)
    c = runtime.all_reduce_sum(accuracy_counts(out, runtime.y, runtime.masks))
    return {f"{s}_acc": float(c[2 * i] / max(c[2 * i + 1], 1)) for i, s in enumerate(SPLITS)}


def make_optimizer(model, cfg: TrainConfig):
    """The optimiser every trainer uses (Adam), made before a checkpoint can restore it.

    float32 parameters on the CPU get :class:`~gnnpar.training.adam.FusedAdam`: torch's fused
    Adam kernel (one pass over each tensor for the whole update instead of ~10 elementwise
    ops per tensor, each with its own call and, on two or more threads, its own OpenMP
    region: about half the optimiser's time on a mini-batch step's small tensors), called
    without ``torch.optim``'s class, so the process never imports ``torch._dynamo``;
    elsewhere, and on a GPU, torch's default Adam
    (:func:`~gnnpar.training.adam.optimizer_imports_dynamo`). Every trainer, serial or
    distributed, comes through here, so runs that are compared see the same update; a resume
    takes the optimiser's settings from its checkpoint (``load_state_dict``), so it continues
    the saved run's arithmetic exactly."""
    params = list(model.parameters())
    kw = dict(lr=cfg.lr, weight_decay=cfg.weight_decay)
    if params and all(fused_adam_takes(p.device, p.dtype) for p in params):
        return FusedAdam(params, **kw)
    return torch.optim.Adam(params, **kw)




def fit(model, runtime, cfg: TrainConfig, on_epoch: Optional[Callable[[dict], None]] = None,
        start_epoch: int = 0, opt=None, memory: Optional[RankMemory] = None):
    """Train ``model`` on ``runtime``; calls ``on_epoch(record)`` after every epoch.

    Returns the list of epoch records (the per-epoch fields of the JSON log,
    ``docs/architecture.md``), made by the loop every trainer shares
    (:func:`gnnpar.training.epochs.run_epochs`: the evaluation cadence, and the stop after an epoch
    whose global loss is NaN or infinite, its record made and passed on). ``memory``
    (distributed runs, :class:`~gnnpar.training.memory.RankMemory`) adds every rank's peak and data
    bytes to each record (one small all-reduce per epoch, in place of the largest peak's).
    """
    opt = opt or make_optimizer(model, cfg)
    train_count = float(runtime.all_reduce_sum(runtime.masks["train"].sum().to(torch.float64)))
    runtime.comm_stats()  # reset the counters: setup traffic is not an epoch's

    def train(epoch: int) -> float:
        loss_sum = train_step(model, opt, runtime, train_count, cfg.precision)
        return float(runtime.all_reduce_sum(loss_sum.reshape(1))[0]) / train_count

    return run_epochs(cfg, train, lambda: evaluate(model, runtime, cfg.precision),
                      costed_record(runtime, memory),
                      {f"{s}_acc": float("nan") for s in SPLITS}, start_epoch, on_epoch)


def costed_record(runtime, memory: Optional[RankMemory] = None):
    """The record of a full-batch epoch (node or link task) for
    :func:`gnnpar.training.epochs.run_epochs`: ``epoch``, the global ``loss``, the metrics, then
    :func:`epoch_costs`."""
    def record(epoch: int, loss: float, metrics: Dict[str, float], t0: float) -> dict:
        return {"epoch": epoch, "loss": loss, **metrics, **epoch_costs(runtime, t0, memory)}
    return record


def epoch_costs(runtime, t0: float, memory: Optional[RankMemory] = None) -> dict:
    """An epoch record's time, traffic and memory fields (``docs/architecture.md``): the
    epoch's seconds since ``t0`` (the device synchronised first), its compute and exposed
    communication, the bytes moved since the last call (the counters reset), and every rank's
    peak (``memory``) or the largest one."""
    sync_device(runtime.x.device)
    epoch_s = time.perf_counter() - t0
    stats = runtime.comm_stats()
    rec = {"epoch_s": epoch_s, "compute_s": max(epoch_s - stats.seconds, 0.0),
           "comm_s": stats.seconds, "comm_total_s": stats.total_seconds,
           "comm_timing": stats.timing, "comm_bytes": stats.bytes,
           "comm_bytes_max_rank": stats.bytes_max_rank}
    rec.update(memory_fields(memory, runtime.x.device, runtime.all_reduce_sum,
                             runtime.all_reduce_max))
    return rec


def sync_device(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
