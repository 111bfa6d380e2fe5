"""``--precision bf16`` (gnnpar/nn/precision.py): mixed-precision training against fp32.

- accuracy: bf16 test accuracy within 0.5 points of fp32 on the default SBM dataset and on an
  R-MAT graph whose labels its structure decides (R-MAT's own labels are random, so both
  precisions would sit at chance and agree for no reason);
- the product: ``csr_mm``/``SparseOperator`` on bf16 input sum in fp32 and round once, so
  they equal the fp32 product to bf16 tolerance, forward and backward, on random,
  power-law, empty-row and single-row matrices, on the numba and the torch paths;
- fp32 runs are the plain step they always were (bitwise);
- bf16 at 2 and 3 ranks (1d-halo, 2d) is close to bf16 serial;
- the flag reaches the model: float32 parameters, bf16 activations, the JSON log names the
  precision (full batch and mini batch); checkpoints resume only in their precision.
"""
import dataclasses
import json

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import gnnpar.training.rank
from gnnpar.datasets import DEFAULT_SPEC, load_dataset
from gnnpar.datasets.normalize import propagation_matrix
from gnnpar.training.distributed import DistRuntime
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels import cpu_spmm
from gnnpar.kernels.algorithms import make_grid
from gnnpar.kernels.cpu_spmm import csr_mm
from gnnpar.kernels.local import SparseOperator, csr_tensor
from gnnpar.nn.models import GNN, build_model
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.nn.precision import autocast, compute_dtype, loss_logits, matmuls
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn
from gnnpar.train import main as train_main
from gnnpar.training.trainer import TrainConfig, fit, make_optimizer

from .graphs import random_graph
from .exact import sequential_mm

BF16_EPS = 2.0 ** -8  # bf16 keeps 8 significant bits: relative rounding error ≤ 2^-8


# ---------------------------------------------------------------- accuracy


def _test_acc(g, precision, epochs, dropout=0.5, lr=0.01, seed=0):
    """The final test accuracy. Evaluated once, at the end: an evaluation draws nothing and
    changes no weight, so the last record is the one evaluating every epoch gives, and on CPUs
    whose bf16 dense products are slow, per-epoch evaluations were much of the test's time."""
    torch.manual_seed(seed)
    model = build_model("gcn", g.num_features, 64, g.num_classes, 2, dropout)
    rt = SerialRuntime(g, model.norm, torch.device("cpu"))
    cfg = TrainConfig(epochs=epochs, lr=lr, precision=precision, eval_every=max(epochs, 1))
    return fit(model, rt, cfg)[-1]["test_acc"]


def _structural_labels(g, classes, seed):
    """``g`` with labels argmax(Â²·X·W) for a random W: labels the graph's structure and
    features decide, which a 2-layer GCN can learn (R-MAT's own labels are uniform noise)."""
    indptr, indices, values = propagation_matrix(g, "gcn")
    op = SparseOperator(indptr, indices, values, (g.num_nodes, g.num_nodes))
    w = torch.randn(g.num_features, classes, generator=torch.Generator().manual_seed(seed))
    z = op(op(torch.as_tensor(np.asarray(g.x), dtype=torch.float32) @ w))
    return dataclasses.replace(g, y=z.argmax(1).numpy().astype(np.int64), num_classes=classes)


def test_bf16_accuracy_on_the_default_sbm_within_half_a_point():
    g = load_dataset(DEFAULT_SPEC)
    fp32, bf16 = _test_acc(g, "fp32", 100), _test_acc(g, "bf16", 100)
    assert fp32 > 0.9  # the run learns: the comparison means something
    assert abs(bf16 - fp32) <= 0.005, (fp32, bf16)


def test_bf16_accuracy_on_rmat_within_half_a_point():
    """The mean over model seeds 0-3 of bf16's test accuracy minus fp32's is within half a
    point. scale 14: 3277 test nodes, so half a point is 16 nodes. Trained to its plateau (no
    dropout, lr 0.05: about 0.98). One seed's difference spreads by most of a point either
    way, and with the CPU's arithmetic (MKL with or without FMA changes the fp32 and bf16
    trajectories alike), so a single seed would make the test a coin flip near its bound;
    ``docs/performance.md`` has the per-seed figures."""
    g = _structural_labels(load_dataset("rmat:scale=14,ef=8,feat=32,classes=4,seed=0"), 4, 0)
    diffs = []
    for seed in range(4):
        fp32, bf16 = (_test_acc(g, p, 150, dropout=0.0, lr=0.05, seed=seed)
                      for p in ("fp32", "bf16"))
        assert fp32 > 0.9, seed  # 4 classes: chance is about 0.25
        diffs.append(bf16 - fp32)
    assert abs(float(np.mean(diffs))) <= 0.005, diffs


# ---------------------------------------------------------------- the product


def _random_csr(n_dst, n_src, density, seed, empty_rows=()):
    rng = np.random.default_rng(seed)
    dense = (rng.random((n_dst, n_src)) < density) * rng.standard_normal((n_dst, n_src))
    dense[list(empty_rows)] = 0
    return torch.tensor(dense, dtype=torch.float32).to_sparse_csr()


def _matrices():
    yield "random", _random_csr(50, 70, 0.1, 0)
    yield "empty rows", _random_csr(40, 40, 0.2, 1, empty_rows=range(0, 40, 3))
    yield "single row", _random_csr(1, 30, 0.5, 2)
    g = load_dataset("rmat:scale=10,ef=8")  # power law: a few rows hold most entries
    yield "rmat", csr_tensor(*propagation_matrix(g, "gcn"), (g.num_nodes, g.num_nodes))


MATRICES = list(_matrices())
PATHS = ["numba", "torch"] if cpu_spmm.available() else ["torch"]


def _fp32_product(path, A, h):
    """The float32 product as ``path`` computes it: the compiled kernel's sequential sum, or
    torch's own (MKL may fuse multiply and add: never an oracle for the kernel)."""
    return sequential_mm(A, h) if path == "numba" else torch.sparse.mm(A, h)


def _within_bf16(z, A, h):
    """|z − A·h| ≤ 2·2⁻⁸·(|A|·|h|) + tiny: the input's rounding and the output's, each at
    most 2⁻⁸ relative, and nothing more (fp32 sums are exact to far below that)."""
    ref = torch.sparse.mm(A, h.float())
    bound = 2 * BF16_EPS * torch.sparse.mm(A.abs(), h.float().abs()) + 1e-30
    return bool(((z.float() - ref).abs() <= bound).all())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,A", MATRICES, ids=[m[0] for m in MATRICES])
@pytest.mark.parametrize("f", [1, 16, 130])
def test_csr_mm_on_bf16_sums_in_fp32_and_rounds_once(monkeypatch, path,
                                                     name, A, f):
    monkeypatch.setenv(cpu_spmm.ENV, path)
    h = torch.randn(A.shape[1], f, generator=torch.Generator().manual_seed(f))
    hb = h.bfloat16()
    z = csr_mm(A, hb)
    assert z.dtype == torch.bfloat16 and z.shape == (A.shape[0], f)
    # fp32 sums of the bf16 values, rounded once: exactly that, on every path, each path
    # summing in its own arithmetic (the kernel without FMA; torch's may fuse)
    assert torch.equal(z, _fp32_product(path, A, hb.float()).bfloat16()), name
    assert _within_bf16(z, A, h), name  # and within bf16 tolerance of the fp32 product
    out = torch.full((A.shape[0], f), 7.0, dtype=torch.bfloat16)
    assert csr_mm(A, hb, out) is out and torch.equal(out, z)
    z16 = csr_mm(A, h.half())
    assert z16.dtype == torch.float16
    assert torch.equal(z16, _fp32_product(path, A, h.half().float()).half())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,A", MATRICES, ids=[m[0] for m in MATRICES])
def test_operator_forward_and_backward_in_bf16(monkeypatch, path, name,
                                               A):
    monkeypatch.setenv(cpu_spmm.ENV, path)
    crow, col, val = A.crow_indices(), A.col_indices(), A.values()
    op = SparseOperator(crow.numpy(), col.numpy(), val.numpy(), tuple(A.shape))
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(A.shape[1], 24, generator=gen)
    g = torch.randn(A.shape[0], 24, generator=gen)
    hb = h.bfloat16().requires_grad_()
    z = op(hb)
    z.backward(g.bfloat16())
    assert z.dtype == torch.bfloat16 and hb.grad.dtype == torch.bfloat16
    assert _within_bf16(z, A, h), name
    AT = A.to_dense().t().contiguous().to_sparse_csr()
    assert _within_bf16(hb.grad, AT, g), name
    # a float32 input cast under autocast: the gradient comes back as float32
    h32 = h.clone().requires_grad_()
    with autocast("bf16", "cpu"):
        z32 = op(h32)
    assert z32.dtype == torch.bfloat16
    z32.backward(g.bfloat16())
    assert h32.grad.dtype == torch.float32 and _within_bf16(h32.grad, AT, g)


# ---------------------------------------------------------------- fp32 unchanged


def test_fp32_training_is_the_plain_step_bit_for_bit():
    """fit(precision="fp32") against the step written out without any precision code."""
    g = random_graph(n=80, f=6, classes=3, seed=2)
    curves = []
    for plain in (False, True):
        torch.manual_seed(0)
        model = GNN("sage", 6, 16, 3, layers=2, dropout=0.5)
        rt = SerialRuntime(g, model.norm, torch.device("cpu"))
        cfg = TrainConfig(epochs=6, precision="fp32")
        if not plain:
            curves.append([r["loss"] for r in fit(model, rt, cfg)])
            continue
        opt, m = make_optimizer(model, cfg), rt.masks["train"]
        count, losses = float(m.sum()), []
        for _ in range(cfg.epochs):
            model.train()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(rt.op, rt.x)[m], rt.y[m], reduction="sum")
            (loss / count).backward()
            opt.step()
            losses.append(float(loss.detach().double()) / count)
        curves.append(losses)
    assert curves[0] == curves[1]


def test_precision_helpers():
    assert compute_dtype("fp32") == torch.float32 and compute_dtype("bf16") == torch.bfloat16
    assert compute_dtype("tf32") == torch.float32
    x = torch.ones(2, 3)
    assert loss_logits(x) is x and loss_logits(x.bfloat16()).dtype == torch.float32
    with pytest.raises(ValueError):
        TrainConfig(precision="fp16")


# ---------------------------------------------------------------- distributed


def bf16_ranks(rank, world, cases):
    """Rank body: per (label, algo, dims) the largest relative differences of the bf16
    distributed forward output, gradients and 3-epoch loss curve from bf16 serial."""
    g = random_graph(n=90, f=6, classes=3, seed=11)
    shard = build_shard(g, partition_graph(g, world, "random", seed=3), rank, norms=("gcn",))
    cpu = torch.device("cpu")

    def step(model, rt, count):
        model.zero_grad()
        with autocast("bf16", "cpu"):
            out = model(rt.op, rt.x)
        m = rt.masks["train"]
        (F.cross_entropy(loss_logits(out[m]), rt.y[m], reduction="sum") / count).backward()
        rt.sync_grads(list(model.parameters()))
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    def curve(rt):
        torch.manual_seed(1)
        m = GNN("gcn", 6, 16, 3, layers=3, dropout=0.0)
        return [r["loss"] for r in fit(m, rt, TrainConfig(epochs=3, lr=0.05, precision="bf16"))]

    torch.manual_seed(0)
    model = GNN("gcn", 6, 16, 3, layers=3, dropout=0.0)
    rt_s = SerialRuntime(g, model.norm, cpu)
    count = float(rt_s.masks["train"].sum())
    out_s, grads_s = step(model, rt_s, count)
    curve_s = curve(rt_s)
    res = {}
    for label, algo, dims in cases:
        rt = DistRuntime(make_grid(algo, world, dims, 1), shard, algorithm(algo), "gcn", cpu)
        out_d, grads_d = step(model, rt, count)
        ids = torch.as_tensor(rt.global_ids)
        res[label] = {"dtype": str(out_d.dtype),
                      "forward": _rel(out_d, out_s[ids]),
                      # every parameter's gradient together: a tensor of small entries
                      # (a bias) alone turns a bf16 rounding step into a large ratio
                      "grads": _rel(torch.cat([a.reshape(-1) for a in grads_d]),
                                    torch.cat([b.reshape(-1) for b in grads_s])),
                      "loss": _rel(curve(rt), curve_s)}
    return res


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("world,cases", [
    (2, [("1d-halo", "1d-halo", None), ("2d-2x1", "2d", (2, 1)), ("2d-1x2", "2d", (1, 2))]),
    (3, [("1d-halo", "1d-halo", None)]),
])
def test_bf16_distributed_matches_bf16_serial(world, cases):
    for rank, res in enumerate(spawn(bf16_ranks, world, args=(cases,), timeout_s=240)):
        for label, r in res.items():
            assert r["dtype"] == "torch.bfloat16", (rank, label)
            # bf16 keeps 8 bits; sums in another order may round a value one step the other
            # way, and three layers carry that on: a few bf16 steps, far below a wrong sum
            for what in ("forward", "grads", "loss"):
                assert r[what] <= 0.03, (rank, label, what, r[what])


# ---------------------------------------------------------------- the flag reaches the model


def _probe(monkeypatch):
    """Wraps rank.build_model: records each layer's output dtype during training."""
    seen = {"outputs": set(), "models": []}

    def build(*a, **k):
        model = build_model(*a, **k)
        for layer in model.layers:
            layer.register_forward_hook(lambda mod, inp, out: seen["outputs"].add(out.dtype))
        seen["models"].append(model)
        return model

    monkeypatch.setattr(gnnpar.training.rank, "build_model", build)
    return seen


@pytest.mark.parametrize("mode", [[], ["--mode", "minibatch", "--fanouts", "4,4",
                                       "--batch-size", "32"]], ids=["fullbatch", "minibatch"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_flag_reaches_the_model(monkeypatch, tmp_path, precision, mode):
    seen = _probe(monkeypatch)
    log = tmp_path / "run.jsonl"
    rc = train_main(["--dataset", "sbm:n=120,blocks=3,p_in=0.1,p_out=0.01,feat=8,seed=1",
                     "--epochs", "2", "--hidden", "16", "--precision", precision, "--quiet",
                     "--device", "cpu", "--log-json", str(log), *mode])
    assert rc == 0
    assert seen["outputs"] == {compute_dtype(precision)}  # activations in the run's dtype
    (model,) = seen["models"]
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records and all(r["precision"] == precision for r in records)


def test_checkpoints_resume_only_in_their_precision(tmp_path):
    base = ["--dataset", "sbm:n=120,blocks=3,p_in=0.1,p_out=0.01,feat=8,seed=1", "--hidden",
            "8", "--quiet", "--device", "cpu", "--checkpoint-dir", str(tmp_path / "ck")]
    assert train_main([*base, "--epochs", "2", "--precision", "bf16"]) == 0
    assert train_main([*base, "--epochs", "3", "--precision", "fp32", "--resume"]) == 2
    assert train_main([*base, "--epochs", "3", "--precision", "bf16", "--resume"]) == 0


# ---------------------------------------------------------------- tf32


def test_tf32_allows_tf32_matmuls_for_the_step_only():
    before = torch.get_float32_matmul_precision()
    with matmuls("tf32"):
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before
    for other in ("fp32", "bf16"):
        with matmuls(other):
            assert torch.get_float32_matmul_precision() == before
    with pytest.raises(ValueError):
        with matmuls("tf16"):
            pass


def test_tf32_step_runs_in_tf32_mode_and_leaves_it(monkeypatch):
    """The trainer's step (forward and backward) sees "high"; nothing after it does."""
    g = random_graph(n=60, f=6, classes=3, seed=4)
    seen = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("forward", torch.get_float32_matmul_precision()))
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            seen.append(("backward", torch.get_float32_matmul_precision()))
            return grad

    torch.manual_seed(0)
    model = GNN("gcn", 6, 8, 3, layers=2, dropout=0.0)
    inner = model.forward
    monkeypatch.setattr(model, "forward", lambda ops, x: Spy.apply(inner(ops, x)))
    rt = SerialRuntime(g, "gcn", torch.device("cpu"))
    before = torch.get_float32_matmul_precision()
    fit(model, rt, TrainConfig(epochs=1, precision="tf32"))
    assert ("forward", "high") in seen and ("backward", "high") in seen
    assert torch.get_float32_matmul_precision() == before


def test_tf32_is_refused_on_the_cpu():
    rc = train_main(["--dataset", "sbm:n=120,blocks=3,p_in=0.1,p_out=0.01,feat=8,seed=1",
                     "--epochs", "1", "--precision", "tf32", "--quiet", "--device", "cpu"])
    assert rc == 2


def test_summed_cross_entropy_both_forms_agree():
    """The CUDA form (log_softmax, gather, the mask on the terms) is the CPU form's sum."""
    from gnnpar.nn import loss as L
    torch.manual_seed(0)
    logits = torch.randn(40, 5, requires_grad=True)
    y = torch.randint(0, 5, (40,))
    mask = torch.rand(40) < 0.6
    y_bad = torch.where(mask, y, -7)  # unselected labels are never used as indices
    want = F.cross_entropy(logits[mask], y[mask], reduction="sum")
    (g_want,) = torch.autograd.grad(want, logits)
    assert torch.allclose(L.summed_cross_entropy(logits, y_bad, mask), want)
    got = L.by_gather(logits, y_bad, mask)
    (g_got,) = torch.autograd.grad(got, logits)
    assert torch.allclose(got, want, rtol=1e-6) and torch.allclose(g_got, g_want, atol=1e-7)
    assert torch.allclose(L.by_gather(logits, y), F.cross_entropy(logits, y, reduction="sum"))
