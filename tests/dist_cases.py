"""Rank bodies of the multi-rank tests (module level, so spawned children can import them).

Each body builds the same small graph on every rank, runs the serial reference in-process
(the graph is tiny) and the distributed algorithm on its shard, and returns the largest
relative differences, so the parent asserts on values rather than on "it ran".
"""
import torch

from gnnpar.distributed import EPOCH_PHASES, DistRuntime
from gnnpar.kernels.build import make_grid
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.models import GNN
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.serial import SerialRuntime
from gnnpar.trainer import TrainConfig, fit

from .graphs import random_graph


def rel_err(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) if b.numel() else 0.0


def _loss_and_grads(model, rt, train_count):
    model.zero_grad()
    out = model(rt.op, rt.x)
    m = rt.masks["train"]
    loss = torch.nn.functional.cross_entropy(out[m], rt.y[m], reduction="sum") / train_count
    loss.backward()
    rt.sync_grads(list(model.parameters()))
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def epoch_bytes(comm) -> int:
    """Bytes this rank's counters hold for an epoch's phases (forward, backward, grad_sync)."""
    return sum(b for (axis, phase), b in comm.bytes.items() if phase in EPOCH_PHASES)


def epoch_messages(comm) -> int:
    return sum(m for (axis, phase), m in comm.messages.items() if phase in EPOCH_PHASES)


def equivalence_many(rank, world, cases, n, directed, method, kinds, grid_spec=None,
                     device="cpu"):
    """Several algorithms in one spawn (spawning dominates the test time).

    ``cases``: list of (label, algo, dims, replication, algo_kw); ``device``: where the
    serial reference and the ranks compute ("cuda" binds rank r to GPU r % count). Returns, per label, the
    largest relative errors (forward, gradients, 3-epoch loss per model kind) and this rank's
    bytes of one training step per kind (for the cost-model test).
    """
    g = random_graph(n=n, f=6, classes=3, seed=11, directed=directed)
    part = partition_graph(g, world, method, seed=3)
    shard = build_shard(g, part, rank, norms=("gcn", "mean"))
    if device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    out = {}
    serial = {}
    for label, algo, dims, replication, algo_kw in cases:
        grid = make_grid(algo, world, dims, replication)
        errs, nbytes = {}, {}
        for kind in kinds:
            torch.manual_seed(0)
            model = GNN(kind, 6, 7, 3, layers=3, dropout=0.0).to(device)
            if kind not in serial:
                rt_s = SerialRuntime(g, model.norm, device)
                count = float(rt_s.masks["train"].sum())
                out_s, grads_s = _loss_and_grads(model, rt_s, count)
                torch.manual_seed(1)
                m = GNN(kind, 6, 7, 3, layers=3, dropout=0.0).to(device)
                curve = [r["loss"] for r in fit(m, rt_s, TrainConfig(epochs=3, lr=0.05))]
                serial[kind] = (count, out_s, grads_s, curve)
            count, out_s, grads_s, curve_s = serial[kind]
            rt = DistRuntime(grid, shard, algo, model.norm, device, **algo_kw)
            ids = torch.as_tensor(rt.global_ids, device=device)
            rt.comm.reset()
            out_d, grads_d = _loss_and_grads(model, rt, count)
            nbytes[kind] = (epoch_bytes(rt.comm), epoch_messages(rt.comm))
            errs[f"{kind}/forward"] = rel_err(out_d, out_s[ids])
            errs[f"{kind}/grads"] = max(rel_err(a, b) for a, b in zip(grads_d, grads_s))
            torch.manual_seed(1)
            m = GNN(kind, 6, 7, 3, layers=3, dropout=0.0).to(device)
            curve = [r["loss"] for r in fit(m, rt, TrainConfig(epochs=3, lr=0.05))]
            errs[f"{kind}/loss"] = rel_err(curve, curve_s)
        out[label] = {"errs": errs, "bytes": nbytes}
    return out


def fail_mid_epoch(rank, world, victim, how):
    """Train 1d-halo; rank ``victim`` raises (or is SIGKILLed) in its second epoch."""
    import os
    import signal
    g = random_graph(n=40, f=6, classes=3, seed=5)
    shard = build_shard(g, partition_graph(g, world, "block"), rank, norms=("gcn",))
    torch.manual_seed(0)
    model = GNN("gcn", 6, 8, 3, layers=2, dropout=0.0)
    rt = DistRuntime(ProcessGrid.create({"row": world}), shard, "1d-halo", "gcn")

    def on_epoch(rec):
        if rank == victim and rec["epoch"] == 1:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("injected failure")

    fit(model, rt, TrainConfig(epochs=50), on_epoch)
    return "finished"
