"""Parts of the mini-batch CPU speed work (issue 25): the compiled CSR transpose (the same
arrays as the stable argsort), sampled blocks' deferred Âᵀ, the product-order cost rule, the
thread budget (sampler priority, OpenMP spin default, ``--threads`` per spawned rank), fused
Adam, and the mini-batch profile script."""
import copy
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from gnnpar.kernels import csr_transpose
from gnnpar.kernels.csr_transpose import transpose_csr, transpose_csr_numpy
from gnnpar.kernels.local import SparseOperator
from gnnpar.nn.models import GNN
from gnnpar.nn.product_order import aggregate_first, aggregate_first_op, product_costs
from gnnpar.sampling import (BulkSampler, EpochPlan, FeatureStore, MacrobatchService, SamplerConfig,
                             ServiceConfig, Topology, batch_rng)
from gnnpar.sampling.blocks import BlockOperator, block_operators
from gnnpar.training.minibatch_loop import DataParallel, train_step
from gnnpar.sampling.service import SamplingStats, lower_thread_priority
from gnnpar.training import adam
from gnnpar.training.adam import FusedAdam, optimizer_imports_dynamo
from gnnpar.training.trainer import TrainConfig, make_optimizer

from .graphs import random_graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_numba = pytest.mark.skipif(not csr_transpose.available(), reason="numba not installed")


def random_csr(rng, n_dst, n_src, nnz, idx_dtype, val_dtype=np.float32):
    """A CSR with empty rows (and, mostly, empty columns) and repeated columns in a row."""
    rows = np.sort(rng.integers(0, max(n_dst, 1), nnz)) if n_dst else np.zeros(0, np.int64)
    counts = np.bincount(rows, minlength=n_dst)[:n_dst] if n_dst else np.zeros(0, np.int64)
    indptr = np.zeros(n_dst + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = rng.integers(0, max(n_src, 1), int(indptr[-1])).astype(idx_dtype)
    values = rng.standard_normal(int(indptr[-1])).astype(val_dtype)
    return indptr, indices, values


SHAPES = [(0, 0, 0), (0, 5, 0), (5, 0, 0), (1, 1, 1), (7, 3, 0), (30, 50, 200), (200, 40, 900),
          (1000, 3000, 15000), (50, 50, 5)]


@needs_numba
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("val_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_compiled_transpose_equals_stable_argsort(shape, idx_dtype, val_dtype):
    n_dst, n_src, nnz = shape
    rng = np.random.default_rng(sum(shape))
    indptr, indices, values = random_csr(rng, n_dst, n_src, nnz if n_src else 0, idx_dtype,
                                         val_dtype)
    ref = transpose_csr_numpy(indptr, indices, values, (n_dst, n_src))
    got = transpose_csr(indptr, indices, values, (n_dst, n_src))
    for a, b in zip(ref, got):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    assert got[0].dtype == np.int64 and got[1].dtype == np.int64
    assert got[2].dtype == np.dtype(val_dtype)


def test_transpose_switches_to_numpy(monkeypatch):
    rng = np.random.default_rng(0)
    indptr, indices, values = random_csr(rng, 20, 30, 100, np.int64)
    monkeypatch.setenv(csr_transpose.ENV, "numpy")
    assert not csr_transpose.available()
    got = transpose_csr(indptr, indices, values, (20, 30))
    ref = transpose_csr_numpy(indptr, indices, values, (20, 30))
    assert all(np.array_equal(a, b) for a, b in zip(ref, got))


def _blocks(seed=0, fanouts=(4, 3)):
    graph = random_graph(120, 6, f=5, seed=seed)
    topo = Topology.from_graph(graph, ("mean",))
    blocks = BulkSampler(topo, SamplerConfig(fanouts, "mean")).sample(
        [np.arange(10)], [batch_rng(0, 0, 0, 0)])[0]
    return graph, blocks


def test_block_operator_defers_the_transpose_and_builds_the_same():
    _, blocks = _blocks()
    calls = []
    for b in blocks:
        eager = b.operator()
        ref = SparseOperator(b.indptr, b.indices, b.values, (b.num_dst, b.num_src))
        assert isinstance(eager, BlockOperator) and eager.transposed
        lazy = b.operator(transpose=False, on_demand=lambda: calls.append(1))
        assert not lazy.transposed and calls == []
        h = torch.randn(b.num_src, 3)
        assert torch.equal(lazy(h), ref(h))  # the forward product needs no transpose
        assert not lazy.transposed
        w = torch.ones(3, requires_grad=True)
        (lazy(h) * w).sum().backward()  # h needs no gradient: Âᵀ stays unbuilt
        assert not lazy.transposed and calls == []
        hs = [h.clone().requires_grad_() for _ in range(3)]
        for op, hh in zip((ref, eager, lazy), hs):
            (op(hh) * torch.arange(b.num_dst, dtype=torch.float32)[:, None]).sum().backward()
        assert torch.equal(hs[0].grad, hs[1].grad) and torch.equal(hs[0].grad, hs[2].grad)
        assert lazy.transposed and len(calls) == 1
        for op in (eager, lazy):
            for name in ("crow_indices", "col_indices", "values"):
                assert torch.equal(getattr(op.AT, name)(), getattr(ref.AT, name)())
        calls.clear()


def test_block_operators_defer_the_input_block_only():
    _, blocks = _blocks()
    used = []
    ops = block_operators(blocks, on_demand=used.append)
    assert [op.transposed for op in ops] == [False, True]
    ops = block_operators(blocks, transpose=[True, False], on_demand=used.append)
    assert [op.transposed for op in ops] == [True, False]
    ops[1].AT
    assert used == [1]
    # tensors (the device sampler's blocks): the parent's eager operator, as before
    t = blocks[0]
    op = BlockOperator(*(torch.as_tensor(a) for a in (t.indptr, t.indices, t.values)),
                       (t.num_dst, t.num_src), transpose=False)
    assert op.transposed


def _service(graph, model, cfg, batch=16):
    topo = Topology.from_graph(graph, (model.norm,))
    seeds = np.flatnonzero(np.asarray(graph.train_mask))
    plan = EpochPlan(seeds, [seeds.shape[0]], 0, batch, 3)
    return MacrobatchService(topo, FeatureStore.local(graph.x), plan,
                             SamplerConfig((4, 3), model.norm), cfg,
                             torch.as_tensor(np.asarray(graph.y, np.int64)))


@pytest.mark.parametrize("f_in,hidden", [(5, 8), (12, 4), (64, 1)])
def test_service_builds_a_needed_input_transpose_after_the_first_use(f_in, hidden):
    """When SAGE's first layer aggregates the raw features first (the cheaper order,
    gnnpar/nn/product_order.py), block 0's Âᵀ is never built. When the weight comes first the
    features need a gradient: the first such step builds it on demand, the workers build it
    from then on. Losses as with every transpose built up front."""
    graph = random_graph(150, 6, f=f_in, seed=1)
    losses = {}
    for eager in (False, True):
        torch.manual_seed(0)
        model = GNN("sage", f_in, hidden, graph.num_classes, 2, 0.0)
        opt = make_optimizer(model, TrainConfig())
        service = _service(graph, model, ServiceConfig(inline=True))
        if eager:
            service._transposes_needed.update({0})
        service.start(0, 1)
        out, built = [], []
        for b in service.epoch(0, SamplingStats()):
            need = not model.layers[0]._aggregates_first(b.ops[0])
            before = b.ops[0].transposed
            out.append(float(train_step(model, opt, DataParallel(), b, 10)))
            built.append((before, b.ops[0].transposed, need))
        service.close()
        losses[eager] = out
        if eager:
            assert all(before for before, _, _ in built)
        else:
            needed_yet = False
            for before, after, need in built:
                assert before == needed_yet and after == (needed_yet or need)
                needed_yet = needed_yet or need
            assert needed_yet == (f_in == 64)  # the (64, 1) case transforms first
    assert losses[False] == losses[True]


def test_product_order_rule():
    # full batch (n_dst == n_src): the width rule
    for f_in, f_out in ((128, 256), (256, 256), (256, 16), (16, 256)):
        assert aggregate_first(5000, 1000, 1000, f_in, f_out) == (f_in <= f_out)
    # a sampled last layer 256 -> 16: the row counts decide
    assert product_costs(2584, 1022, 2959, 256, 16) == (2584 * 256 + 1022 * 256 * 16,
                                                        2959 * 256 * 16 + 2584 * 16)
    assert aggregate_first(2584, 1022, 2959, 256, 16)
    assert not aggregate_first(200000, 1022, 1100, 256, 16)  # dense rows: transform first
    assert aggregate_first(0, 0, 0, 3, 2)  # a tie aggregates first
    _, blocks = _blocks()
    op = blocks[0].operator()
    assert aggregate_first_op(op, 64, 8) == aggregate_first(op.nnz, op.num_dst, op.num_src, 64, 8)

    class Dist:  # a distributed operator: every rank must agree, the width rule
        num_dst, num_src, nnz = 10, 30, 20
    assert aggregate_first_op(Dist(), 8, 16) and not aggregate_first_op(Dist(), 256, 16)
    assert aggregate_first(20, 10, 30, 256, 16)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread niceness: Linux")
def test_sampler_workers_lower_their_own_priority_on_cpu():
    graph = random_graph(150, 6, f=5, seed=1)
    model = GNN("sage", 5, 8, graph.num_classes, 2, 0.0)
    seen = {}
    main_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    for nice in (19, 0):
        service = _service(graph, model, ServiceConfig(nice=nice, workers=2))
        real = service.produce

        def produce(*a, _real=real, _nice=nice, **k):
            seen.setdefault(_nice, set()).add(
                os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return _real(*a, **k)
        service.produce = produce
        service.start(0, 1)
        for _ in service.epoch(0, SamplingStats()):
            pass
        service.close()
    assert seen[19] == {max(19, main_nice)} and seen[0] == {main_nice}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_nice
    with pytest.raises(Exception, match="niceness"):
        ServiceConfig(nice=20)


def test_lower_thread_priority_is_per_thread():
    if not sys.platform.startswith("linux"):
        assert lower_thread_priority(19) is False
        return
    out = {}

    def worker():
        out["set"] = lower_thread_priority(10)
        out["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert out["nice"] == max(10, main) and out["set"] == (main < 10)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main
    assert lower_thread_priority(0) is False


@pytest.mark.parametrize("env,want", [({}, "10000"), ({"GOMP_SPINCOUNT": "5"}, "5"),
                                      ({"OMP_WAIT_POLICY": "active"}, None)])
def test_openmp_spin_default_is_set_before_torch_and_overridable(env, want):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    clean.update(env, PYTHONPATH=ROOT)
    code = ("import sys, os, gnnpar; assert 'torch' not in sys.modules; "
            "print(os.environ.get('GOMP_SPINCOUNT'))")
    res = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(want)


def test_make_optimizer_is_fused_on_cpu_and_resumes_exactly():
    torch.manual_seed(0)
    model = GNN("sage", 5, 8, 3, 2, 0.0)
    opt = make_optimizer(model, TrainConfig())
    assert isinstance(opt, FusedAdam)
    assert opt.param_groups[0]["weight_decay"] == 5e-4 and opt.param_groups[0]["lr"] == 0.01
    assert opt.param_groups[0]["fused"] is True
    x = torch.randn(6, 5)

    def step(o, m):
        o.zero_grad(set_to_none=True)
        m([_Dense(6)] * 2, x).pow(2).sum().backward()
        o.step()
    for _ in range(2):
        step(opt, model)
    state = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
    step(opt, model)
    want = [p.detach().clone() for p in model.parameters()]
    # a resume: a fresh model and optimiser loaded from the saved state, one more step
    model2 = GNN("sage", 5, 8, 3, 2, 0.0)
    model2.load_state_dict(state["model"])
    opt2 = make_optimizer(model2, TrainConfig())
    opt2.load_state_dict(state["opt"])
    step(opt2, model2)
    assert all(torch.equal(a, b) for a, b in zip(want, model2.parameters()))


def test_one_rule_picks_the_optimiser_and_what_a_rank_imports_for_it():
    """make_optimizer and optimizer_imports_dynamo decide by the same rule (adam.takes): a
    float32 CPU model gets FusedAdam and no dynamo; any other dtype gets torch's Adam."""
    model = GNN("gcn", 5, 8, 3, 2, 0.0)
    assert isinstance(make_optimizer(model, TrainConfig()), FusedAdam)
    assert adam.takes("cpu", torch.float32) and not optimizer_imports_dynamo("cpu")
    assert not adam.takes("cpu", torch.float64) and optimizer_imports_dynamo("cuda")
    assert isinstance(make_optimizer(model.double(), TrainConfig()), torch.optim.Adam)


def test_fused_adam_is_torchs_fused_adam_bit_for_bit():
    """The same updates as ``torch.optim.Adam(fused=True)`` (its kernel), step after step,
    without importing ``torch._dynamo``; the state dicts load into one another."""
    torch.manual_seed(1)
    models = [GNN("gcn", 5, 8, 3, 3, 0.0) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    ours = FusedAdam(models[0].parameters(), lr=0.05, weight_decay=5e-4)
    theirs = torch.optim.Adam(models[1].parameters(), lr=0.05, weight_decay=5e-4, fused=True)
    x = torch.randn(6, 5)
    for _ in range(4):
        for m, o in zip(models, (ours, theirs)):
            o.zero_grad(set_to_none=True)
            m([_Dense(6)] * 3, x).pow(2).sum().backward()
            o.step()
        assert all(torch.equal(a, b) for a, b in zip(*(m.parameters() for m in models)))
    mine, torchs = ours.state_dict(), theirs.state_dict()
    assert mine["param_groups"] == torchs["param_groups"]
    assert mine["state"].keys() == torchs["state"].keys()
    for i, s in mine["state"].items():
        assert s.keys() == torchs["state"][i].keys()
        assert all(torch.equal(v, torchs["state"][i][k]) for k, v in s.items())
    back = FusedAdam(models[0].parameters())
    back.load_state_dict(copy.deepcopy(torchs))
    assert back.param_groups[0]["lr"] == 0.05
    torch.optim.Adam(models[1].parameters(), fused=True).load_state_dict(copy.deepcopy(mine))
    plain = torch.optim.Adam(models[1].parameters()).state_dict()
    plain["state"] = {}
    with pytest.raises(ValueError, match="fused"):
        FusedAdam(models[0].parameters()).load_state_dict(plain)


DYNAMO_CHECK = """
import sys
from gnnpar.train import main
try:
    main(["--dataset", "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02", "--epochs", "2", "--quiet"])
except SystemExit:
    pass
print("dynamo imported" if "torch._dynamo" in sys.modules else "dynamo not imported")
"""


def test_training_on_the_cpu_never_imports_dynamo():
    """A serial run of gnnpar-train's main: torch's optimiser class would import
    ``torch._dynamo`` (nearly 2 s of CPU a process); the trainers' Adam does not."""
    res = subprocess.run([sys.executable, "-c", DYNAMO_CHECK], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "dynamo not imported"


class _Dense:
    """Â = mean over all rows (n × n), as an operator the models take."""

    def __init__(self, n):
        self.num_dst = self.num_src = n

    def __call__(self, h):
        return h.mean(0, keepdim=True).expand(self.num_dst, -1)


def test_spawned_ranks_get_threads(monkeypatch):
    """``--threads T`` reaches every ``--nprocs`` rank (launch passes it to spawn)."""
    import gnnpar.launcher.launch as launch
    seen = {}

    def fake_spawn(fn, nprocs, args=(), **kw):
        seen.update(kw)
        return [{}]
    monkeypatch.setattr(launch, "spawn", fake_spawn)
    monkeypatch.setattr(launch, "prepare_shards", lambda *a, **k: (None, False))
    from gnnpar.cli.spec import RunSpec
    launch._spawn_local(RunSpec.of(mode="minibatch", nprocs=2, threads=3, fanouts=(2,),
                                batch_size=4, layers=1))
    assert seen["threads"] == 3


def test_profile_script_minibatch_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = ROOT
    res = subprocess.run(
        [sys.executable, "scripts/profile_epoch.py", "--mode", "minibatch", "--dataset",
         "rmat:scale=10,ef=4", "--layers", "2", "--hidden", "16", "--fanouts", "5,3",
         "--batch-size", "64", "--batches", "3", "--threads", "1", "--warmup", "1",
         "--epochs", "1", "--top", "5", "--cache-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["mode"] == "minibatch" and out["batches"] == 3 and len(out["blocks"]) == 2
    assert {"forward", "backward", "optimizer"} <= set(out["phases_ms"])
    assert out["by_kind_ms"].get("sparse", 0) > 0 and out["by_kind_ms"].get("dense", 0) > 0
    assert "layer 0:" in res.stdout
