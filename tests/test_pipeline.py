"""The mini-batch input pipeline of a GPU run, exercised on CPU: the torch (device) sampler,
its draws, feature placement, the staged service — and proof that the pipelined run trains on
the blocks of the plain one (same seeds, same losses)."""
import numpy as np
import pytest
import torch

from gnnpar.datasets import InputError, load_dataset
from gnnpar.nn.models import GNN
from gnnpar.sampling import (BulkSampler, EpochPlan, FeatureStore, MacrobatchService, SamplerConfig,
                             ServiceConfig, Topology, batch_rng)
from gnnpar.sampling.device_sampler import TorchBulkSampler, TorchRelabeler, TorchTopology
from gnnpar.sampling.draws import HashDraws, PcgDraws
from gnnpar.training.minibatch_loop import DataParallel, fit_minibatch
from gnnpar.sampling.placement import resolve_placement
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn
from gnnpar.training.trainer import TrainConfig

from .graphs import random_graph
from .test_minibatch import cli_args, cli_spec, uneven_partition


def _same_block(ref, got):
    got = got.numpy()
    for name in ("indptr", "indices", "values", "src_ids"):
        a, b = getattr(ref, name), getattr(got, name)
        assert a.shape == b.shape and np.array_equal(a.astype(b.dtype), b), name
    assert (ref.num_dst, ref.num_sampled) == (got.num_dst, got.num_sampled)


@pytest.mark.parametrize("kind", ["gcn", "mean"])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [(4, 3), (-1, 2), (0, 5), (30, 30)])
def test_device_sampler_draws_the_host_samplers_blocks(kind, replace, fanouts):
    """Given the host samplers' uniforms (PcgDraws) the torch sampler returns BulkSampler's
    blocks exactly: a power-law graph with empty rows, uneven and empty seed sets."""
    graph = load_dataset("rmat:scale=9,ef=4")  # R-MAT leaves some rows empty
    topo = Topology.from_graph(graph, (kind,))
    assert (topo.degree == 0).any()
    cfg = SamplerConfig(fanouts, kind, replace)
    seeds = [np.arange(0, 40), np.array([3]), np.zeros(0, np.int64),
             np.flatnonzero(topo.degree == 0)[:5], np.array([11, 400, 17])]
    ref = BulkSampler(topo, cfg).sample(seeds, [batch_rng(5, 1, 2, s) for s in range(5)])
    got = TorchBulkSampler(TorchTopology(topo, "cpu"), cfg).sample(
        seeds, [PcgDraws(5, 1, 2, s) for s in range(5)])
    for rb, gb in zip(ref, got):
        assert len(rb) == len(gb) == len(fanouts)
        for a, b in zip(rb, gb):
            _same_block(a, b)


def test_device_sampler_operators_match_host_operators():
    """A device block's operator (transpose built by torch ops) equals the host block's."""
    graph = random_graph(150, 6, seed=3)
    topo = Topology.from_graph(graph, ("gcn",))
    cfg = SamplerConfig((5, 5), "gcn")
    seeds = [np.arange(20)]
    ref = BulkSampler(topo, cfg).sample(seeds, [batch_rng(0, 0, 0, 0)])[0]
    got = TorchBulkSampler(TorchTopology(topo, "cpu"), cfg).sample(seeds,
                                                                  [PcgDraws(0, 0, 0, 0)])[0]
    h = torch.randn(ref[0].num_src, 7, requires_grad=True)
    for a, b in zip(ref, got):
        oa, ob = a.operator(), b.operator()
        assert torch.equal(oa.AT.to_dense(), ob.AT.to_dense())
    h2 = h.detach().clone().requires_grad_()
    ref[0].operator()(h).sum().backward()
    got[0].operator()(h2).sum().backward()
    assert torch.equal(h.grad, h2.grad)


def test_hash_draws_are_uniform_and_depend_on_the_minibatch_only():
    a = HashDraws(1, 2, 3, 4).next(5000, 8)
    assert a.shape == (5000, 8) and a.dtype == torch.float64
    assert float(a.min()) >= 0.0 and float(a.max()) < 1.0
    assert abs(float(a.mean()) - 0.5) < 0.01 and abs(float(a.var()) - 1 / 12) < 0.005
    assert torch.equal(a, HashDraws(1, 2, 3, 4).next(5000, 8))  # a function of the key only
    assert not torch.equal(a, HashDraws(1, 2, 3, 5).next(5000, 8))
    d = HashDraws(1, 2, 3, 4)
    first, second = d.next(10, 3), d.next(10, 3)  # layers differ
    assert not torch.equal(first, second)
    # neighbouring counters are not correlated
    flat = a.reshape(-1)
    assert abs(float(torch.corrcoef(torch.stack([flat[:-1], flat[1:]]))[0, 1])) < 0.03


def test_relabeler_sort_and_scan_paths_agree():
    rng = np.random.default_rng(0)
    dst = torch.as_tensor(rng.choice(1000, 30, replace=False))
    cols = torch.as_tensor(rng.integers(0, 1000, 500))
    scan, sort = TorchRelabeler(1000, "cpu"), TorchRelabeler(1000, "cpu")
    scan.scan_factor, sort.scan_factor = 0, 1  # 0: always scan; 1: 1000 > 500 ids, sort
    (s1, l1), (s2, l2) = scan(dst, cols), sort(dst, cols)
    assert torch.equal(s1, s2) and torch.equal(l1, l2)
    assert torch.equal(s1[:30], dst) and torch.equal(s1[l1], cols)
    assert (scan.slot == -1).all() and not scan.mark.any()


# ---------------------------------------------------------------- pipelined = plain
def serial_losses(graph, cfg: ServiceConfig, features_on_device=False, epochs=3):
    """Loss curve of a serial mini-batch run on ``cfg.device`` (also used by test_cuda)."""
    torch.manual_seed(0)
    device = cfg.device
    model = GNN("sage", graph.num_features, 16, graph.num_classes, 2, 0.0).to(device)
    topo = Topology.from_graph(graph, (model.norm,))
    store = FeatureStore.local(graph.x)
    if features_on_device:
        store.to(device)
    seeds = np.flatnonzero(np.asarray(graph.train_mask))
    plan = EpochPlan(seeds, [seeds.shape[0]], 0, 32, 7)
    service = MacrobatchService(topo, store, plan, SamplerConfig((5, 3), model.norm), cfg,
                                torch.as_tensor(np.asarray(graph.y, np.int64)))
    hist = fit_minibatch(model, service, DataParallel(), SerialRuntime(graph, model.norm, device),
                         TrainConfig(epochs=epochs, lr=0.01, eval_every=99))
    return [r["loss"] for r in hist], hist


def test_pipelined_run_trains_on_the_plain_runs_blocks():
    """Plain: host sampler, inline (no threads), host features. Pipelined: the device sampler
    on two worker threads with prefetch, macrobatches of 3, features behind the device
    gather path, staged batches. Same draws (pcg) → bitwise the same losses."""
    graph = random_graph(300, 8, seed=1)
    plain, _ = serial_losses(graph, ServiceConfig(macrobatch=1, inline=True, seed=7))
    piped, hist = serial_losses(graph, ServiceConfig(macrobatch=3, workers=2, prefetch=2,
                                                      seed=7, sampler="device", draws="pcg"),
                                 features_on_device=True)
    assert plain == piped
    assert all(0.0 <= r["stall_share"] <= 1.0 for r in hist)


def test_hash_draws_pipelined_equals_inline():
    """The device sampler's own draws: threads/prefetch/macrobatch size change nothing."""
    graph = random_graph(300, 8, seed=2)
    a, _ = serial_losses(graph, ServiceConfig(inline=True, seed=7, sampler="device"))
    b, _ = serial_losses(graph, ServiceConfig(macrobatch=4, workers=3, prefetch=1, seed=7,
                                               sampler="device"), features_on_device=True)
    assert a == b


def _dp_body(rank, world, extra):
    from gnnpar.partitioners.shard_build import build_shard
    from gnnpar.training.minibatch_setup import build_rank
    graph = random_graph(240, 8, seed=4)
    shard = build_shard(graph, uneven_partition(graph), rank)
    args = cli_spec("--fanouts", "4,3", "--batch-size", "24", "--cache-frac", "0.1",
                    "--sample-on", "device", "--quiet", *extra)
    torch.manual_seed(0)
    model = GNN("gcn", graph.num_features, 16, graph.num_classes, 2, 0.0)
    service, engine, eval_rt, info = build_rank(rank, world, shard, args, model.norm, "cpu")
    hist = fit_minibatch(model, service, engine, eval_rt, TrainConfig(epochs=2, eval_every=99))
    return [r["loss"] for r in hist], info["sample_on"], [r["feat_bytes"] for r in hist]


def test_data_parallel_device_sampler_same_losses_however_pipelined():
    """Two ranks, remote feature rows fetched per macrobatch from device-sampled ids (cache
    on): one worker, no lookahead, K = 1 versus three workers, K = 3, versus two workers
    sampling in bursts (their fetches still pair up across the ranks) — same losses."""
    a = spawn(_dp_body, 2, args=(["--sampler-workers", "1", "--prefetch", "1"],))
    b = spawn(_dp_body, 2, args=(["--sampler-workers", "3", "--prefetch", "2",
                                  "--macrobatch", "3"],))
    c = spawn(_dp_body, 2, args=(["--sampler-workers", "2", "--macrobatch", "2",
                                  "--sample-in-bursts"],))
    assert a[0][0] == a[1][0] == b[0][0] == b[1][0] == c[0][0] == c[1][0]
    assert a[0][1] == "device"
    assert sum(a[0][2]) > 0  # rows really crossed ranks


# ---------------------------------------------------------------- placement
def test_placement_on_cpu_runs_every_choice_with_a_note():
    p = resolve_placement("device", "device", "cpu", replicated=True, grouped=False,
                          feature_bytes=10, topo_bytes=10)
    assert (p.sample_on, p.features_on) == ("device", "host") and len(p.notes) == 2
    p = resolve_placement("auto", "auto", "cpu", replicated=True, grouped=False,
                          feature_bytes=10, topo_bytes=10)
    assert (p.sample_on, p.features_on, p.notes) == ("host", "host", ())


@pytest.mark.parametrize("replicated,grouped,needle", [
    (False, False, "--no-replicate-graph"), (True, True, "grouped mini batch")])
def test_device_sampler_refused_where_it_cannot_run(replicated, grouped, needle):
    with pytest.raises(InputError, match=needle):
        resolve_placement("device", "auto", "cpu", replicated=replicated, grouped=grouped,
                          feature_bytes=1, topo_bytes=1)


@pytest.mark.parametrize("free,expect", [(10 ** 9, "device"), (300, "host")])
def test_features_auto_on_a_gpu_follows_free_memory(monkeypatch, free, expect):
    """The rule itself (no GPU here): rows + topology within half the free memory → device."""
    from gnnpar.sampling import placement
    monkeypatch.setattr(placement, "free_device_bytes", lambda device: free)
    p = resolve_placement("auto", "auto", "cuda", replicated=True, grouped=False,
                          feature_bytes=100, topo_bytes=100)
    assert p.sample_on == "device" and p.features_on == expect
    assert bool(p.notes) == (expect == "host")
    with pytest.raises(InputError, match="--features-on device"):
        resolve_placement("auto", "device", "cuda", replicated=True, grouped=False,
                          feature_bytes=10 ** 9 * 2, topo_bytes=0)


@pytest.mark.parametrize("flags, device, expect", [
    ((), "cpu", (4, 1)),                                   # a CPU run: K = 4, one ahead
    (("--sampler-workers", "2"), "cpu", (4, 2)),           # one macrobatch ahead per worker
    (("--macrobatch", "1"), "cpu", (1, 2)),                # K given as 1: two ahead, as before
    (("--macrobatch", "8", "--prefetch", "3"), "cpu", (8, 3)),
])
def test_pipeline_defaults_of_a_cpu_run(flags, device, expect):
    """The CLI's unset --macrobatch/--prefetch resolve in the frozen spec (every rank alike),
    and the service the setup builds uses them."""
    from gnnpar.training.minibatch_setup import _service_cfg
    from gnnpar.cli.spec import RunSpec
    spec = RunSpec.from_args(cli_args("--fanouts", "5,5", "--batch-size", "8", "--device",
                                      device, *flags))
    assert (spec.batch.macrobatch, spec.batch.prefetch) == expect
    placement = resolve_placement("auto", "auto", torch.device("cpu"), replicated=True,
                                  grouped=False, feature_bytes=1, topo_bytes=1)
    cfg = _service_cfg(spec, "cpu", placement)
    assert (cfg.macrobatch, cfg.prefetch) == expect


def test_pipeline_defaults_where_the_device_may_sample():
    """Unset flags with the device sampling: K = 1 and two ahead (as before K had a default
    of its own); the host sampling: K = 4."""
    from gnnpar.sampling.options import HOST_MACROBATCH, pipeline_depth
    assert pipeline_depth(None, None, 1, host_samples=False) == (1, 2)
    assert pipeline_depth(None, None, 1, host_samples=True) == (HOST_MACROBATCH, 1)
    assert pipeline_depth(None, None, 3, host_samples=True) == (HOST_MACROBATCH, 3)
