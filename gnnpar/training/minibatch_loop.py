"""Mini-batch training: one sampled minibatch per step, data parallel over the ranks.

Step s on every rank: take the next ready minibatch, run ``model(ops, x)`` on its blocks,
sum the cross-entropy of its seeds and divide by the step's *global* seed count
(:meth:`~gnnpar.sampling.seeds.EpochPlan.global_count`), backpropagate, sum the gradients
over the ranks, step the optimiser. The summed gradient is then exactly the gradient of the
mean loss over all ranks' seeds of that step, as if one process had sampled them all.

How a minibatch's blocks run and how gradients are combined is the *engine*'s business
(:class:`gnnpar.interfaces.MiniBatchEngine`; :class:`DataParallel`: local SpMM per block,
one flat all-reduce over the data axis). The
grouped variants (``--algo 4d`` with d > 1, ``--algo 1d…3d --group-size g``: a group of
ranks runs one sampled subgraph with a full-batch kernel on the block's square embedding)
are another engine with the same methods,
:class:`~gnnpar.sampling.grouped.GroupEngine`: each rank returns the loss of its owned seed
rows and the gradients are summed once over every rank (see :mod:`.grouped`).

Epoch record (one JSON line; every field in ``docs/architecture.md``) — ``loss`` is the mean
over every rank's
seeds of the epoch; ``comm_bytes`` counts what all ranks sent for training: gradient
all-reduces plus the samplers' feature rows, id requests and (partitioned structure)
lookups; evaluation and setup traffic are not counted; ``comm_timing`` says what timed this
rank's ``comm_s`` (:attr:`gnnpar.kernels.comm.Comm.timing`) — plus ``train_s`` (steps only),
``steps`` (per rank, equal on all), and the sampling fields summed over ranks:
``sampled_edges`` (neighbour entries kept, self entries not counted), ``input_nodes``
(Σ over minibatches of the first block's sources), ``unique_input_nodes`` (Σ over
macrobatches of their union), ``feat_bytes`` (feature rows moved between ranks),
``cache_hit_rate`` (remote input rows served by the cache / remote input rows), and, as the
maximum over ranks, ``sampler_s`` (producer time) and ``stall_s`` (time the trainer waited
for a ready macrobatch — the host's wait: on a GPU the compute stream's own wait for a batch's
copies, a device-side event wait, is not in it), with ``stall_share`` = ``stall_s / epoch_s``.

``cfg.precision`` bf16: each step's forward pass and the evaluation run under
:func:`gnnpar.nn.precision.autocast`, the loss from float32 logits (as in the full-batch
trainer, :mod:`gnnpar.training.trainer`).

Evaluation is **full-neighbourhood layer-wise inference**: one forward pass of the whole
graph with the exact Â (serial SpMM, or the 1D halo-exchange SpMM over the shards), layer by
layer, no sampling and no gradient — the accuracies are those of the full-batch model.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from gnnpar.training.epochs import memory_fields, run_epochs
from gnnpar.interfaces import SPLITS, CommStats, LayerOps, Reducer
from gnnpar.nn.loss import summed_cross_entropy
from gnnpar.nn.precision import autocast, matmuls
from gnnpar.training.trainer import TrainConfig, evaluate, make_optimizer, sync_device

from gnnpar.sampling.service import MacrobatchService, SamplingStats


class DataParallel:
    """Plain data parallelism over grid axes ``axes`` of ``comm`` (serial when comm is None);
    gradients and metrics through one :class:`~gnnpar.interfaces.Reducer`."""

    def __init__(self, comm=None, axes="data"):
        self.comm, self.axes = comm, axes
        self.reducer = Reducer(comm, axes)
        self.world = self.reducer.world

    def operators(self, batch):
        return batch.ops

    def sync_grads(self, params) -> None:
        self.reducer.sync_grads(params)

    def all_reduce(self, t: torch.Tensor, op="sum") -> torch.Tensor:
        return self.reducer.max(t) if op == "max" else self.reducer.sum(t)

    def comm_stats(self) -> CommStats:
        """This rank's training collectives since the last call, and what timed them."""
        if self.comm is None:
            return CommStats()
        timing = self.comm.timing  # before the reset forgets it
        counts = self.comm.reset()
        nbytes, seconds = counts.total_bytes, counts.seconds
        return CommStats(nbytes, nbytes, seconds, timing=timing)


def train_epoch(model, opt, service: MacrobatchService, epoch: int, engine,
                stats: SamplingStats, precision: str = "fp32", step=None) -> torch.Tensor:
    """One epoch of steps; returns this rank's summed loss (float64). ``step``: what one
    step runs, ``step(opt, engine, batch, plan, global_count)`` → its summed loss (None: the
    node classifier's :func:`train_step`; link prediction has its own,
    :mod:`gnnpar.link.minibatch`)."""
    model.train()
    plan = service.plan
    loss_sum = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)
    for batch in service.epoch(epoch, stats):
        count = plan.global_count(batch.step)
        loss_sum += (train_step(model, opt, engine, batch, count, precision) if step is None
                     else step(opt, engine, batch, plan, count))
    return loss_sum


def train_step(model, opt, engine, batch, global_count: int, precision: str = "fp32"
               ) -> torch.Tensor:
    """One step on a ready minibatch; returns its summed loss (float64, on the device)."""
    opt.zero_grad(set_to_none=True)
    with matmuls(precision):
        with autocast(precision, batch.x.device):
            out = model(LayerOps(engine.operators(batch), batch.x_dropout), batch.x)
        loss = summed_cross_entropy(out, batch.y)
        (loss / max(global_count, 1)).backward()
    engine.sync_grads(model.parameters())
    opt.step()
    return loss.detach().to(torch.float64)


def fit_minibatch(model, service: MacrobatchService, engine, eval_runtime, cfg: TrainConfig,
                  on_epoch: Optional[Callable[[dict], None]] = None, start_epoch: int = 0,
                  opt=None, memory=None, step=None, evaluate_on=None):
    """Train for epochs ``[start_epoch, cfg.epochs)``; ``eval_runtime`` is a full-batch
    :class:`~gnnpar.interfaces.Runtime` used only to evaluate. Returns the epoch records (the
    full-batch fields plus the sampling ones; ``memory``, a
    :class:`gnnpar.training.memory.RankMemory`, adds every rank's peak and baseline), from the loop
    every trainer shares
    (:func:`gnnpar.training.epochs.run_epochs`: it stops after an epoch whose global loss is NaN or
    infinite, on every rank at once). ``step`` (:func:`train_epoch`) and ``evaluate_on``
    (``evaluate_on(eval_runtime)`` → the record's metrics; None: the accuracies of
    :func:`gnnpar.training.trainer.evaluate`) are a task's own (link prediction:
    :func:`gnnpar.link.minibatch.link_minibatch_parts`)."""
    opt = opt or make_optimizer(model, cfg)
    engine.comm_stats()
    device = next(model.parameters()).device
    accs = {f"{s}_acc": float("nan") for s in SPLITS} if evaluate_on is None else {}
    evaluate_on = evaluate_on or (lambda rt: evaluate(model, rt, cfg.precision))

    def train(epoch: int):
        stats = SamplingStats()
        loss_sum = train_epoch(model, opt, service, epoch, engine, stats, cfg.precision, step)
        sync_device(device)  # queued GPU work is training time
        return loss_sum, stats, time.perf_counter()

    def record(epoch: int, trained, metrics: dict, t0: float) -> dict:
        loss_sum, stats, trained_at = trained
        sync_device(device)
        epoch_s = time.perf_counter() - t0
        grad = engine.comm_stats()
        rec = {"epoch": epoch, **metrics, "epoch_s": epoch_s, "train_s": trained_at - t0}
        rec.update(_reduced(engine, loss_sum, service.plan.total, grad, stats))
        rec["compute_s"] = max(epoch_s - rec["comm_s"] - rec["stall_s"], 0.0)
        rec["stall_share"] = rec["stall_s"] / epoch_s if epoch_s > 0 else 0.0
        rec.update(memory_fields(memory, device, engine.all_reduce, engine.reducer.max_int))
        return rec

    service.start(start_epoch, cfg.epochs)
    try:
        return run_epochs(cfg, train, lambda: evaluate_on(eval_runtime), record, accs,
                          start_epoch, on_epoch)
    finally:
        service.close()


def _reduced(engine, loss_sum, total, grad: CommStats, st: SamplingStats) -> dict:
    """The epoch's metrics over all ranks: sums of counts, max of times."""
    mine_bytes, comm_s = grad.bytes + st.comm_bytes, grad.seconds
    sums = engine.all_reduce(torch.tensor(
        [float(loss_sum), mine_bytes, st.sampled_edges, st.input_nodes, st.unique_input_nodes,
         st.remote_rows, st.cache_hits, st.feat_bytes], dtype=torch.float64))
    maxes = engine.all_reduce(torch.tensor([mine_bytes, comm_s, st.sampler_s, st.stall_s],
                                           dtype=torch.float64), "max")
    remote, hits = float(sums[5]), float(sums[6])
    return {"loss": float(sums[0]) / max(total, 1), "comm_s": float(maxes[1]),
            "comm_timing": grad.timing,
            "comm_bytes": int(sums[1]), "comm_bytes_max_rank": int(maxes[0]),
            "steps": st.steps, "sampled_edges": int(sums[2]),
            "input_nodes": int(sums[3]), "unique_input_nodes": int(sums[4]),
            "feat_bytes": int(sums[7]), "cache_hit_rate": hits / remote if remote else 0.0,
            "sampler_s": float(maxes[2]), "stall_s": float(maxes[3])}

