"""Rank bodies of the multi-rank tests (module level, so spawned children can import them).

Each body builds the same small graph on every rank, runs the serial reference in-process
(the graph is tiny) and the distributed algorithm on its shard, and returns the largest
relative differences, so the parent asserts on values rather than on "it ran".
"""
import copy

import torch

from gnnpar.training.distributed import EPOCH_PHASES, DistRuntime
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.algorithms import make_grid
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.nn.models import GNN
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.training.serial import SerialRuntime
from gnnpar.training.trainer import TrainConfig, fit

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
                     device="cpu", norms=("gcn", "mean"), grad_floors=None):
    """Several algorithms in one spawn (spawning dominates the test time).

    ``cases``: list of (label, algo, dims, replication, algo_kw); ``device``: where the
    serial reference and the ranks compute ("cuda" binds rank r to GPU r % count). Returns, per label, the
    largest relative errors (forward, gradients, 3-epoch loss per model kind) and this rank's
    bytes of one training step per kind (for the cost-model test). ``norms``: the Â the
    shard stores, each ``kinds`` model's among them. ``grad_floors``: {kind: floor} for the
    models whose gradients are checked as GAT's are (:func:`grad_error`; attention layers,
    whose softmax leaves a gradient that is zero in exact arithmetic), the others each tensor
    against its own largest entry.
    """
    g = random_graph(n=n, f=6, classes=3, seed=11, directed=directed)
    part = partition_graph(g, world, method, seed=3)
    shard = build_shard(g, part, rank, norms=norms)
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
            rt = DistRuntime(grid, shard, algorithm(algo), model.norm, device, **algo_kw)
            ids = torch.as_tensor(rt.global_ids, device=device)
            rt.comm.reset()
            out_d, grads_d = _loss_and_grads(model, rt, count)
            nbytes[kind] = (epoch_bytes(rt.comm), epoch_messages(rt.comm))
            errs[f"{kind}/forward"] = rel_err(out_d, out_s[ids])
            floor = (grad_floors or {}).get(kind)
            errs[f"{kind}/grads"] = (grad_error(grads_d, grads_s, floor) if floor is not None
                                     else max(rel_err(a, b) for a, b in zip(grads_d, grads_s)))
            torch.manual_seed(1)
            m = GNN(kind, 6, 7, 3, layers=3, dropout=0.0).to(device)
            curve = [r["loss"] for r in fit(m, rt, TrainConfig(epochs=3, lr=0.05))]
            errs[f"{kind}/loss"] = rel_err(curve, curve_s)
        out[label] = {"errs": errs, "bytes": nbytes}
    return out


def readme_block(needle: str) -> str:
    """The python example of the README or the user guide that contains ``needle``."""
    import re

    from .cli_util import doc_text
    docs = doc_text("guide.md")
    return next(b for b in re.findall(r"```python\n(.*?)```", docs, re.S) if needle in b)


class ReadmeAttention(torch.nn.Module):
    """Three of the user guide's ``DotAttention`` layers (written against the edge contract
    only), ReLU between them, read from docs/guide.md as printed."""

    norm = "gcn"

    def __init__(self, widths):
        super().__init__()
        space = {"torch": torch}
        exec(readme_block("class DotAttention"), space)
        self.layers = torch.nn.ModuleList(space["DotAttention"](a, b)
                                          for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, ops, h):
        from gnnpar.interfaces import LayerOps
        ops = LayerOps(ops)
        for i, layer in enumerate(self.layers):
            h = layer(ops[i], h)
            h = torch.relu(h) if i < len(self.layers) - 1 else h
        return h


#: GAT's gradient checks (docs/guide.md, "Exact equivalence"): each gradient tensor's largest error
#: against the serial one, relative to the larger of that tensor's largest entry and FLOOR × the
#: model's largest gradient. float32: a tensor whose terms cancel (an attention vector's: a
#: softmax row's gradient sums to zero) keeps the rounding of its terms, not of its result —
#: the serial float32 gradients of such a tensor are as far from the float64 ones — so the
#: floor is 1% of the model's largest gradient. float64 (the same algorithm and ranks, the
#: model and features in float64) checks every tensor against its own largest entry; the
#: floor, 1e-8, serves only a gradient that is zero in exact arithmetic (the guide layer's
#: key bias, which a softmax does not see: its computed value is rounding alone).
GRAD_FLOOR = {torch.float32: 1e-2, torch.float64: 1e-8}


def grad_error(grads, ref, floor: float) -> float:
    """The largest error of any tensor of ``grads`` against ``ref``'s, relative to the larger
    of that tensor's largest entry in ``ref`` and ``floor`` × the largest entry of all."""
    top = max(float(b.abs().max()) for b in ref)
    return max(float((a.double() - b.double()).abs().max()) / max(float(b.abs().max()), floor * top)
               for a, b in zip(grads, ref))


def gat_equivalence(rank, world, algo, n, directed, method, heads, dims=None, replication=1,
                    algo_kw=None, kind="gat"):
    """GAT (``heads`` heads, 3 layers, dropout 0; ``kind="readme"``: the user guide's custom
    attention layer, :class:`ReadmeAttention`) on ``algo`` (its grid ``dims`` or
    ``replication``, builder options ``algo_kw``) against the serial run: the largest relative
    errors of the float32 forward (to its largest entry) and 3-epoch loss curve; of the
    gradients (:data:`GRAD_FLOOR`) in float32 (``grads32``) and in float64 (``grads64``), and
    ``grads``, the larger of the two; and this rank's bytes of one float32 step.

    The float64 step runs the same operators (GAT reads Â's structure, never its float32
    values) on the features and a float64 copy of the model."""
    g = random_graph(n=n, f=6, classes=3, seed=12, directed=directed)
    part = partition_graph(g, world, method, seed=4)
    shard = build_shard(g, part, rank, norms=("gcn",))

    def model(seed):
        torch.manual_seed(seed)
        if kind == "readme":
            return ReadmeAttention([6, 2 * heads, 2 * heads, 3])
        return GNN("gat", 6, 2 * heads, 3, layers=3, dropout=0.0, heads=heads)

    def in_float64(m, rt):
        x = rt.x
        rt.x = x.double()
        try:
            return _loss_and_grads(copy.deepcopy(m).double(), rt, count)[1]
        finally:
            rt.x = x

    m = model(0)
    rt_s = SerialRuntime(g, m.norm)
    count = float(rt_s.masks["train"].sum())
    out_s, grads_s = _loss_and_grads(m, rt_s, count)
    grads64_s = in_float64(m, rt_s)
    curve_s = [r["loss"] for r in fit(model(1), rt_s, TrainConfig(epochs=3, lr=0.05))]
    rt = DistRuntime(make_grid(algo, world, dims, replication), shard, algorithm(algo), m.norm,
                     **(algo_kw or {}))
    ids = torch.as_tensor(rt.global_ids)
    rt.comm.reset()
    out_d, grads_d = _loss_and_grads(m, rt, count)
    nbytes = epoch_bytes(rt.comm)
    grads64_d = in_float64(m, rt)
    curve = [r["loss"] for r in fit(model(1), rt, TrainConfig(epochs=3, lr=0.05))]
    errs = {"grads32": grad_error(grads_d, grads_s, GRAD_FLOOR[torch.float32]),
            "grads64": grad_error(grads64_d, grads64_s, GRAD_FLOOR[torch.float64])}
    return {"forward": rel_err(out_d, out_s[ids]), "grads": max(errs.values()), **errs,
            "loss": rel_err(curve, curve_s), "bytes": nbytes}


def fail_mid_epoch(rank, world, victim, how):
    """Train 1d-halo; rank ``victim`` raises (or is SIGKILLed) in its second epoch."""
    import os
    import signal
    g = random_graph(n=40, f=6, classes=3, seed=5)
    shard = build_shard(g, partition_graph(g, world, "block"), rank, norms=("gcn",))
    torch.manual_seed(0)
    model = GNN("gcn", 6, 8, 3, layers=2, dropout=0.0)
    rt = DistRuntime(ProcessGrid.create({"row": world}), shard, algorithm("1d-halo"), "gcn")

    def on_epoch(rec):
        if rank == victim and rec["epoch"] == 1:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("injected failure")

    fit(model, rt, TrainConfig(epochs=50), on_epoch)
    return "finished"


# ---------------------------------------------------------------- the compiled CPU SpMM


def compiled_equivalence(rank, world, cases, n, kinds, precisions, force=True):
    """The distributed algorithms on the compiled CPU SpMM (:mod:`gnnpar.kernels.cpu_spmm`)
    against the serial trainer on ``torch.sparse.mm``.

    The size rule sends float32 and these small bf16 products to torch, so with ``force`` this
    rank sets ``GNNPAR_SPMM=numba`` in itself and counts the compiled kernel's calls by
    dtype, to prove it served the products. ``cases``: (label, algo, dims, algo_kw);
    ``precisions``: "fp32" and/or "bf16" (the forward under bf16 autocast, as
    ``--precision bf16`` runs it). Returns, per (label, precision), the largest relative
    errors (forward, gradients — in bf16 relative to the largest gradient of the model —,
    3-epoch loss per kind), the output dtype per kind and
    ``calls`` {dtype name: compiled-kernel calls}.
    """
    import os
    from collections import Counter

    from gnnpar.kernels import cpu_spmm
    from gnnpar.nn.precision import autocast, loss_logits

    def step(model, rt, count, precision):
        model.zero_grad()
        with autocast(precision, "cpu"):
            out = model(rt.op, rt.x)
        m = rt.masks["train"]
        loss = torch.nn.functional.cross_entropy(loss_logits(out[m]), rt.y[m],
                                                 reduction="sum") / count
        loss.backward()
        rt.sync_grads(list(model.parameters()))
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    def curve(kind, rt, precision):
        torch.manual_seed(1)
        m = GNN(kind, 6, 7, 3, layers=3, dropout=0.0)
        cfg = TrainConfig(epochs=3, lr=0.05, precision=precision)
        return [r["loss"] for r in fit(m, rt, cfg)]

    g = random_graph(n=n, f=6, classes=3, seed=11, directed=True)
    shard = build_shard(g, partition_graph(g, world, "random", seed=3), rank,
                        norms=("gcn", "mean"))
    # the reference runs on torch.sparse.mm, whatever the size rule: independent of the kernel
    env = os.environ.get(cpu_spmm.ENV)
    os.environ[cpu_spmm.ENV] = "torch"
    serial = {}
    for kind in kinds:
        for precision in precisions:
            torch.manual_seed(0)
            model = GNN(kind, 6, 7, 3, layers=3, dropout=0.0)
            rt_s = SerialRuntime(g, model.norm)
            count = float(rt_s.masks["train"].sum())
            serial[kind, precision] = (model, count, *step(model, rt_s, count, precision),
                                       curve(kind, rt_s, precision))
    if force:
        os.environ[cpu_spmm.ENV] = "numba"
    elif env is None:
        del os.environ[cpu_spmm.ENV]
    else:
        os.environ[cpu_spmm.ENV] = env
    calls = Counter()
    kernels = cpu_spmm._compiled()[1]  # cached: every later product looks its kernel up here

    def counting(dtype, kernel):
        def call(*args):
            calls[str(dtype)] += 1
            return kernel(*args)
        return call

    for dtype, kernel in list(kernels.items()):
        kernels[dtype] = counting(dtype, kernel)

    out = {}
    for label, algo, dims, algo_kw in cases:
        grid = make_grid(algo, world, dims, 1)
        for precision in precisions:
            calls.clear()
            errs, dtypes = {}, {}
            for kind in kinds:
                model, count, out_s, grads_s, curve_s = serial[kind, precision]
                rt = DistRuntime(grid, shard, algorithm(algo), model.norm, "cpu", **algo_kw)
                out_d, grads_d = step(model, rt, count, precision)
                ids = torch.as_tensor(rt.global_ids)
                errs[f"{kind}/forward"] = rel_err(out_d.float(), out_s.float()[ids])
                if precision == "fp32":
                    errs[f"{kind}/grads"] = max(rel_err(a, b) for a, b in zip(grads_d, grads_s))
                else:
                    # relative to the model's largest gradient: a ReLU whose bf16 input
                    # rounds to the other side drops or adds one vertex's share of a small
                    # tensor's gradient (sage, layer 0: 0.003 of that tensor's 0.018, the
                    # largest gradient 0.22; the same on torch.sparse.mm)
                    errs[f"{kind}/grads"] = rel_err(torch.cat([a.flatten() for a in grads_d]),
                                                    torch.cat([b.flatten() for b in grads_s]))
                errs[f"{kind}/loss"] = rel_err(curve(kind, rt, precision), curve_s)
                dtypes[kind] = str(out_d.dtype)
            out[label, precision] = {"errs": errs, "dtypes": dtypes, "calls": dict(calls)}
    return out
