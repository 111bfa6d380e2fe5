"""CUDA checks (skipped without a GPU; run by scripts/gpu_check.sh where one exists).

NCCL refuses two ranks on one GPU, so multi-rank CUDA runs use gloo with CUDA tensors and
NCCL runs at world size 1 (and at 2+ where there are that many GPUs).
"""
import importlib.util
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gnnpar.kernels.comm import AUDIT_ENV, Comm, device_routes
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.nn.models import GNN
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn
from gnnpar.training.trainer import TrainConfig, fit

from .dist_cases import equivalence_many
from .test_pipeline import serial_losses
from .test_comm_rule import check_finals, every_mode_body, records_of
from .test_comm_timing import check_records, check_slow_peer, fit_body, slow_peer_body
from .graphs import random_graph

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ALL = [("1d", "1d", None, 1, {}), ("1d-halo", "1d-halo", None, 1, {}),
       ("1.5d", "1.5d", None, 1, {"variant": "bcast"}), ("2d", "2d", (1, 1), 1, {}),
       ("3d", "3d", (1, 1, 1), 1, {"layers": 3}), ("4d", "4d", (1, 1, 1, 1), 1, {"layers": 3})]
MULTI = {2: [("1d", "1d", None, 1, {}), ("1d-halo", "1d-halo", None, 1, {}),
             ("1.5d-c2", "1.5d", None, 2, {"variant": "halo"}), ("2d-1x2", "2d", (1, 2), 1, {}),
             ("3d-1x1x2", "3d", (1, 1, 2), 1, {"layers": 3})],
         4: [("2d-2x2", "2d", (2, 2), 1, {}), ("3d-1x2x2", "3d", (1, 2, 2), 1, {"layers": 3}),
             ("1.5d-c2", "1.5d", None, 2, {"variant": "bcast"})]}


def check(results):
    for rank, per_label in enumerate(results):
        for label, res in per_label.items():
            for what, err in res["errs"].items():
                assert err <= 1e-5, f"rank {rank} {label} {what}: {err:.3g}"


def test_serial_cuda_matches_cpu():
    g = random_graph(n=200, f=8, classes=4, seed=1)
    curves = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = GNN("gcn", 8, 16, 4, layers=2, dropout=0.0).to(device)
        curves.append([r["loss"] for r in fit(model, SerialRuntime(g, "gcn", device),
                                               TrainConfig(epochs=5))])
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-5)


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_dropout_draws_the_same_masks_on_cuda_and_cpu(kind):
    """With dropout on, a CUDA run (the fused Triton bias + ReLU + dropout pass,
    kernels/triton_epilogue.py) follows the CPU run (the compiled pass): the same hash of the
    same seeds, so the same masks and the same losses."""
    pytest.importorskip("triton")
    g = random_graph(n=300, f=8, classes=4, seed=2)
    curves = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = GNN(kind, 8, 16, 4, layers=3, dropout=0.5).to(device)
        curves.append([r["loss"] for r in fit(model, SerialRuntime(g, model.norm, device),
                                               TrainConfig(epochs=6))])
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-4)


def test_every_algorithm_nccl_world_1():
    check(spawn(_nccl_body, 1, backend="nccl", timeout_s=240))


def _nccl_body(rank, world):
    return equivalence_many(rank, world, ALL, 47, True, "random", ("gcn", "sage"), device="cuda")


def _gloo_cuda_body(rank, world):
    return equivalence_many(rank, world, MULTI[world], 47, False, "random", ("gcn", "sage"),
                            device="cuda")


@pytest.mark.parametrize("world", [2, 4])
def test_multi_rank_gloo_on_cuda_tensors(world):
    check(spawn(_gloo_cuda_body, world, backend="gloo", timeout_s=300))


@pytest.mark.parametrize("world,backend", [(1, "nccl"), (4, "cuda:gloo")])
def test_every_mode_on_cuda(world, backend, tmp_path, monkeypatch):
    """Full batch (every algorithm), mini batch (data parallel, grouped, 4d), checkpoints and
    --resume on CUDA tensors: NCCL at world 1 (the group is cpu:gloo,cuda:nccl), and at 4 ranks
    on one GPU a CUDA-only group given a host route, as NCCL's is (CUDA tensors on gloo)."""
    monkeypatch.setenv(AUDIT_ENV, str(tmp_path / "audit"))
    finals = spawn(every_mode_body, world, args=(str(tmp_path / "ckpt"), "cuda"),
                   backend=backend, timeout_s=600)[0]
    check_finals(finals, world)
    records = records_of(str(tmp_path / "audit"))
    assert all("cpu" in device_routes(r["backend"]) for r in records)
    if world > 1:  # the algorithm's traffic is on CUDA tensors (NCCL's side of the group)
        heavy = [r for r in records if r["phase"] in ("forward", "backward", "grad_sync")]
        assert heavy and all(r["devices"] == ["cuda"] for r in heavy), heavy[:3]


def test_device_sampler_same_blocks_on_cuda_as_on_cpu():
    """The device sampler's own (hash) draws: a GPU samples exactly what a CPU samples."""
    from gnnpar.datasets import load_dataset
    from gnnpar.sampling import SamplerConfig, Topology
    from gnnpar.sampling.device_sampler import TorchBulkSampler, TorchTopology
    from gnnpar.sampling.draws import HashDraws
    topo = Topology.from_graph(load_dataset("rmat:scale=12,ef=8"), ("gcn",))
    seeds = [np.arange(0, 300), np.arange(1000, 1100)]
    out = {}
    for dev in ("cpu", "cuda"):
        s = TorchBulkSampler(TorchTopology(topo, dev), SamplerConfig((10, 5, 3), "gcn"))
        out[dev] = s.sample(seeds, [HashDraws(3, 0, 0, b, dev) for b in range(2)])
    for bc, bg in zip(out["cpu"], out["cuda"]):
        for a, b in zip(bc, bg):
            for name in ("indptr", "indices", "values", "src_ids"):
                assert torch.equal(getattr(a, name), getattr(b, name).cpu()), name


@pytest.mark.parametrize("sampler,features_on_device", [("device", True), ("device", False),
                                                        ("host", True), ("host", False)])
def test_minibatch_pipeline_on_cuda_matches_the_plain_run(sampler, features_on_device):
    """Side-stream staging, pinned copies, device gathers: same losses as the inline run
    (pcg draws: the same blocks whichever sampler)."""
    from gnnpar.sampling import ServiceConfig
    g = random_graph(n=300, f=8, classes=4, seed=1)
    plain, _ = serial_losses(g, ServiceConfig(inline=True, seed=7, device="cuda"))
    piped, hist = serial_losses(g, ServiceConfig(macrobatch=3, workers=2, prefetch=2, seed=7,
                                                 device="cuda", sampler=sampler, draws="pcg"),
                                features_on_device)
    np.testing.assert_allclose(piped, plain, rtol=1e-5)
    assert all(0 <= r["stall_share"] <= 1 for r in hist)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
def test_triton_spmm_on_cuda_matches_cusparse(monkeypatch):
    """The Triton kernel on the GPU: forward and backward through SparseOperator, fp32 (to
    1e-5) and bf16 features (fp32 sums)."""
    from gnnpar.datasets import load_dataset
    from gnnpar.datasets.normalize import propagation_matrix
    from gnnpar.kernels import triton_spmm
    from gnnpar.kernels.local import SparseOperator
    g = load_dataset("rmat:scale=12,ef=8")
    ip, ix, v = propagation_matrix(g, "mean")
    n = g.num_nodes
    grads = {}
    for mode in ("triton", "cusparse"):
        monkeypatch.setenv(triton_spmm.ENV, mode)
        op = SparseOperator(ip, ix, v, (n, n), "cuda")
        h = torch.randn(n, 96, device="cuda", generator=torch.Generator("cuda").manual_seed(0),
                        requires_grad=True)
        (op(op(h)) ** 2).sum().backward()
        grads[mode] = (op(h.detach()), h.grad)
    for a, b in zip(grads["triton"], grads["cusparse"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    A = SparseOperator(ip, ix, v, (n, n), "cuda").A
    hb = torch.randn(n, 128, device="cuda").to(torch.bfloat16)
    torch.testing.assert_close(triton_spmm.csr_mm(A, hb).float(), (A @ hb.float()),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
def test_every_triton_tile_and_the_tuned_one_match_cusparse(monkeypatch):
    """Each candidate tile, the tuned tile and the rows unsorted, on a power-law matrix with
    empty rows, at widths 7, 64 and 256, fp32 to 1e-5; deterministic mode fixes the tile."""
    from gnnpar.datasets import load_dataset
    from gnnpar.datasets.normalize import propagation_matrix
    from gnnpar.kernels import triton_spmm
    from gnnpar.kernels.local import csr_tensor
    g = load_dataset("rmat:scale=11,ef=8")
    ip, ix, v = propagation_matrix(g, "mean")
    n = g.num_nodes
    dense = csr_tensor(ip, ix, v, (n, n), "cuda").to_dense()
    dense[::7] = 0  # empty rows
    A = dense.to_sparse_csr()
    ident = torch.arange(n, dtype=torch.int32, device="cuda")
    for f in (7, 64, 256):
        h = torch.randn(n, f, device="cuda")
        want = torch.sparse.mm(A, h)
        for c in triton_spmm.CANDIDATES:
            got = triton_spmm.csr_mm(A, h, config=triton_spmm.capped(c, f))
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=str(c))
        torch.testing.assert_close(triton_spmm.csr_mm(A, h, order=ident), want, rtol=1e-5,
                                   atol=1e-5)
        torch.testing.assert_close(triton_spmm.csr_mm(A, h), want, rtol=1e-5, atol=1e-5)
        assert triton_spmm.tuned(A, h, torch.empty_like(h)) in {
            triton_spmm.capped(c, f) for c in triton_spmm.CANDIDATES}
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert triton_spmm.tuned(A, h, torch.empty_like(h)) == triton_spmm.config_for(256, h.dtype)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
def test_every_algorithm_through_triton_world_1(monkeypatch):
    """The distributed algorithms at world 1 with every CUDA product on the Triton kernel
    equal the serial run (the children inherit GNNPAR_SPMM_GPU)."""
    from gnnpar.kernels import triton_spmm
    monkeypatch.setenv(triton_spmm.ENV, "triton")
    check(spawn(_nccl_body, 1, backend="nccl", timeout_s=240))


def test_cuda_event_timer_counts_a_late_peer_to_completion():
    """CUDA tensors on gloo (two ranks on one GPU): the CUDA event timer gives the late peer's
    wait as the host timer does (tests/test_comm_timing.py)."""
    check_slow_peer(spawn(slow_peer_body, 2, args=("cuda",), backend="cuda:gloo",
                          timeout_s=180)[0], "cuda_events")


def test_fit_on_cuda_logs_cuda_event_timing():
    for records in spawn(fit_body, 2, args=("cuda",), backend="cuda:gloo", timeout_s=180):
        check_records(records, "cuda_events")


def _sleep_cycles(seconds: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that take about ``seconds`` on this GPU."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10 ** 7)
    end.record()
    torch.cuda.synchronize()
    return int(10 ** 7 * seconds / (start.elapsed_time(end) / 1e3))


def _nccl_late_body(rank, world):
    """One rank on NCCL: the collective's stream first waits for a sleep kernel on another
    stream (a peer arriving late). NCCL's wait() does not block the host and its future
    completes at the enqueue, so the host sees almost nothing; the events see the collective
    end and the current stream wait for it."""
    comm = Comm(ProcessGrid.create({"row": world}))
    x = torch.ones(1024, device="cuda")
    dist.all_reduce(x)  # NCCL's communicator is made at its first collective
    cycles = _sleep_cycles(0.3)
    late = torch.cuda.Stream()

    def issue():
        with torch.cuda.stream(late):
            torch.cuda._sleep(cycles)
            return dist.all_reduce(x, async_op=True)
    t0 = time.perf_counter()
    comm._start("all_reduce", [x], None, issue, lambda: x).wait()
    host_s = time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(late)
    torch.cuda._sleep(cycles)
    end.record(late)
    torch.cuda.synchronize()
    return comm.seconds, comm.total_seconds, comm.timing, host_s, start.elapsed_time(end) / 1e3


def test_nccl_collective_timed_to_its_end_not_its_enqueue():
    exposed, total, timing, host_s, late_s = spawn(_nccl_late_body, 1, backend="nccl",
                                                   timeout_s=180)[0]
    assert timing == "cuda_events"
    assert host_s < 0.5 * late_s, (host_s, late_s)  # a host clock would read about 0
    assert total >= 0.8 * late_s, (total, late_s)
    assert exposed >= 0.8 * late_s, (exposed, late_s)  # the current stream waited for it
