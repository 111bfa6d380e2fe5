"""Mini-batch training on several gloo ranks: accuracy against full batch, exact gradients with
uneven seeds, feature bytes counted exactly, and the CLI.

Rank bodies are module-level so spawned children can import them; each returns what it saw
and the parent compares it with a serial computation on the same graph.
"""
import json

import numpy as np
import pytest
import torch

from gnnpar.datasets import DEFAULT_SPEC, load_dataset
from gnnpar.nn.models import GNN
from gnnpar.cli.options import build_parser
from gnnpar.cli.spec import RunSpec
from gnnpar.partitioners import Partition, partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.sampling import SamplingStats
from gnnpar.training.minibatch_loop import fit_minibatch
from gnnpar.training.minibatch_setup import build_rank
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn
from gnnpar.training.trainer import TrainConfig, fit

from .graphs import random_graph

from .cli_util import run_train as run_cli


def cli_args(*argv):
    """The CLI's own defaults, with mini-batch flags on top."""
    return build_parser().parse_args(["--mode", "minibatch", *argv])


def cli_spec(*argv) -> RunSpec:
    """:func:`cli_args` as the run spec a rank reads."""
    return RunSpec.from_args(cli_args(*argv))


def uneven_partition(graph, ratio=3):
    """Two parts; part 0 owns ``ratio`` times as many training nodes as part 1 (all of them
    when ``ratio`` is None)."""
    owner = np.ones(graph.num_nodes, np.int32)
    train = np.flatnonzero(graph.train_mask)
    owner[train if ratio is None else train[:len(train) * ratio // (ratio + 1)]] = 0
    rest = np.flatnonzero(~graph.train_mask)
    owner[rest[: len(rest) // 2]] = 0
    return Partition.from_owner(owner, 2, method="uneven")


# ---------------------------------------------------------------- accuracy vs full batch
def accuracy_body(rank, world, kind, epochs, extra):
    graph = load_dataset(DEFAULT_SPEC)
    shard = build_shard(graph, partition_graph(graph, world, "metis", seed=0), rank)
    args = cli_spec("--fanouts", "10,10", "--batch-size", "128", "--macrobatch", "2",
                    "--cache-frac", "0.05", *extra)
    torch.manual_seed(0)
    model = GNN(kind, graph.num_features, 64, graph.num_classes, 2, 0.5)
    service, engine, eval_rt, _ = build_rank(rank, world, shard, args, model.norm, "cpu")
    torch.manual_seed(1 + rank)
    hist = fit_minibatch(model, service, engine, eval_rt, TrainConfig(epochs=epochs, eval_every=99))
    return hist[-1]["test_acc"], [r["steps"] for r in hist]


@pytest.mark.parametrize("kind,extra,world", [
    ("gcn", [], 2),
    ("sage", ["--no-replicate-graph", "--cache-policy", "presample"], 2),
    ("sage", [], 4),
])
def test_minibatch_accuracy_within_two_points_of_full_batch(kind, extra, world):
    graph = load_dataset(DEFAULT_SPEC)
    torch.manual_seed(0)
    model = GNN(kind, graph.num_features, 64, graph.num_classes, 2, 0.5)
    full = fit(model, SerialRuntime(graph, model.norm), TrainConfig(epochs=100, eval_every=1000))
    full_acc = full[-1]["test_acc"]
    assert full_acc > 0.9  # the reference itself learned
    # the global batch grows with the world: more epochs keep the number of steps comparable
    results = spawn(accuracy_body, world, args=(kind, 10 * world, extra), timeout_s=180)
    accs = {acc for acc, _ in results}
    assert len(accs) == 1  # every rank evaluates the same global model
    acc = accs.pop()
    assert abs(acc - full_acc) <= 0.02, (acc, full_acc)
    assert all(r[1] == results[0][1] for r in results)


# ---------------------------------------------------------------- uneven seeds, exact step
def uneven_body(rank, world, kind, ratio):
    graph = random_graph(n=120, avg_deg=4, f=6, classes=3, seed=9)
    shard = build_shard(graph, uneven_partition(graph, ratio), rank)
    args = cli_spec("--fanouts=-1,-1", "--batch-size", "16", "--macrobatch", "2",
                    "--sampler-workers", "2", "--prefetch", "1")
    torch.manual_seed(0)
    model = GNN(kind, 6, 8, 3, 2, dropout=0.0)
    service, engine, _, _ = build_rank(rank, world, shard, args, model.norm, "cpu")
    plan = service.plan
    service.start(0, 2)
    try:
        batches = list(service.epoch(0, SamplingStats()))
        first = batches[0]
        model.zero_grad()
        out = model(first.ops, first.x)
        loss = torch.nn.functional.cross_entropy(out, first.y, reduction="sum")
        (loss / plan.global_count(0)).backward()
        engine.sync_grads(model.parameters())
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        # the rest of the run: the small rank keeps stepping with smaller minibatches
        second = list(service.epoch(1, SamplingStats()))
    finally:
        service.close()
    return {"seeds": first.seeds, "grads": grads, "steps": (len(batches), len(second)),
            "sizes": [b.seeds.size for b in batches], "own": int(plan.seeds.size)}


@pytest.mark.parametrize("kind,ratio", [("gcn", 3), ("sage", 3), ("sage", None)])
def test_uneven_seeds_same_steps_and_exact_gradient(kind, ratio):
    res = spawn(uneven_body, 2, args=(kind, ratio), timeout_s=120)
    assert res[0]["own"] == (3 * res[1]["own"] if ratio else 72) and res[0]["own"] > 0
    assert res[0]["steps"] == res[1]["steps"]
    assert max(res[0]["sizes"]) <= 16 and max(res[1]["sizes"]) < max(res[0]["sizes"])
    # the synced step equals one serial full-graph step on both ranks' seeds together
    graph = random_graph(n=120, avg_deg=4, f=6, classes=3, seed=9)
    seeds = torch.from_numpy(np.concatenate([r["seeds"] for r in res]))
    torch.manual_seed(0)
    model = GNN(kind, 6, 8, 3, 2, dropout=0.0)
    rt = SerialRuntime(graph, model.norm)
    torch.nn.functional.cross_entropy(model(rt.op, rt.x)[seeds], rt.y[seeds]).backward()
    for r in res:
        for p, g in zip(model.parameters(), r["grads"]):
            torch.testing.assert_close(torch.from_numpy(g), p.grad, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- partitioned structure
def partitioned_body(rank, world, replace):
    from gnnpar.kernels.comm import Comm
    from gnnpar.kernels.grid import ProcessGrid
    from gnnpar.sampling import BulkSampler, NeighborSampler, SamplerConfig, Topology, batch_rng
    from gnnpar.sampling.features import owner_map
    from gnnpar.sampling.partitioned import PartitionedTopology
    graph = random_graph(n=300, avg_deg=6, f=5, classes=3, seed=12, directed=True, weighted=True)
    shard = build_shard(graph, partition_graph(graph, world, "random", seed=2), rank)
    comm = Comm(ProcessGrid.create({"data": world}))
    owner, local_index, me = owner_map(shard, comm, "data")
    part = PartitionedTopology.from_shard(shard, comm, "data", ("gcn", "mean"), owner,
                                          local_index, me)
    full = Topology.from_graph(graph, ("gcn", "mean"))
    same = [np.array_equal(part.degree, full.degree), np.array_equal(part.in_rows(),
                                                                     full.in_rows())]
    same += [np.array_equal(part.self_values[k], full.self_values[k]) for k in ("gcn", "mean")]
    # uneven work per rank, the last rank's minibatches empty
    seeds = [np.arange(rank + b, 300, 11)[:0 if rank == world - 1 else 5 + 4 * rank]
             for b in range(3)]
    rngs = lambda: [batch_rng(1, 0, rank, b) for b in range(3)]  # noqa: E731
    comm.reset()
    for kind in ("gcn", "mean"):
        cfg = SamplerConfig((3, -1, 2), kind, replace)
        got = BulkSampler(part, cfg).sample(seeds, rngs(), owners=(comm, "data"))
        one = [NeighborSampler(part, cfg).sample(s, r, owners=(comm, "data"))
               for s, r in zip(seeds, rngs())]
        ref = BulkSampler(full, cfg).sample(seeds, rngs())
        for a, b, c in zip(got, one, ref):
            for x, y, z in zip(a, b, c):
                for name in ("indptr", "indices", "values", "src_ids"):
                    same.append(np.array_equal(getattr(x, name), getattr(z, name)))
                    same.append(np.array_equal(getattr(y, name), getattr(z, name)))
    lookup_bytes = sum(b for (axis, phase), b in comm.bytes.items() if phase == "sampling")
    return all(same), lookup_bytes, part.nbytes(), full.nbytes()


@pytest.mark.parametrize("replace", [False, True])
def test_partitioned_structure_samples_the_same_blocks(replace):
    res = spawn(partitioned_body, 3, args=(replace,), timeout_s=120)
    for same, lookup_bytes, part_bytes, full_bytes in res:
        assert same
        assert part_bytes < full_bytes
    assert sum(r[1] for r in res) > 0  # remote rows were asked of their owners


# ---------------------------------------------------------------- feature bytes
def bytes_body(rank, world, macro, cache_frac):
    graph = random_graph(n=400, avg_deg=5, f=12, classes=3, seed=4)
    shard = build_shard(graph, partition_graph(graph, world, "random", seed=1), rank)
    args = cli_spec("--fanouts", "3,2", "--batch-size", "20", "--macrobatch", str(macro),
                    "--cache-frac", str(cache_frac), "--sampler-workers", "2")
    service, _, _, _ = build_rank(rank, world, shard, args, "gcn", "cpu")
    unions, stats = [], SamplingStats()
    service.start(0, 1)
    try:
        for b in service.epoch(0, stats):
            unions.append(b.blocks[0].src_ids)
    finally:
        service.close()
    K, groups = macro, []
    for m in range(0, len(unions), K):
        groups.append(np.unique(np.concatenate(unions[m:m + K])))
    return {"groups": groups, "cache": service.store.cache_ids, "owner": service.store.owner,
            "feat_bytes": stats.feat_bytes, "hits": stats.cache_hits, "remote": stats.remote_rows,
            "row_bytes": service.store.row_bytes}


def expected_bytes(res):
    """Bytes each rank sends: rows other ranks need, hold neither locally nor in cache."""
    owner, world = res[0]["owner"], len(res)
    sent = np.zeros(world, np.int64)
    for q, r in enumerate(res):
        for ids in r["groups"]:
            need = ids[(owner[ids] != q) & ~np.isin(ids, r["cache"])]
            sent += np.bincount(owner[need], minlength=world) * r["row_bytes"]
    return sent


def test_feature_bytes_counted_exactly_and_fewer_with_macrobatches():
    totals = {}
    for macro, cache in ((1, 0.0), (4, 0.0), (4, 0.2)):
        res = spawn(bytes_body, 3, args=(macro, cache), timeout_s=120)
        sent = expected_bytes(res)
        assert [r["feat_bytes"] for r in res] == sent.tolist()
        assert sent.sum() > 0
        totals[(macro, cache)] = int(sent.sum())
        if cache:
            assert sum(r["hits"] for r in res) > 0
            assert all(0 < r["cache"].size <= round(0.2 * np.sum(r["owner"] != q))
                       for q, r in enumerate(res))
    assert totals[(4, 0.0)] < totals[(1, 0.0)]
    assert totals[(4, 0.2)] < totals[(4, 0.0)]


# ---------------------------------------------------------------- CLI
def test_cli_minibatch_two_ranks_writes_sampling_fields(tmp_path):
    log = tmp_path / "log.jsonl"
    p = run_cli("--mode", "minibatch", "--nprocs", "2", "--fanouts", "5,5", "--batch-size", "200",
                "--macrobatch", "2", "--cache-frac", "0.1", "--epochs", "2", "--quiet",
                "--partitioner", "block", "--log-json", str(log))
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(recs) == 3 and recs[-1]["final"] is True
    graph = load_dataset(DEFAULT_SPEC)
    owner = partition_graph(graph, 2, "block").owner
    most = max(np.sum(graph.train_mask & (owner == r)) for r in range(2))
    for rec in recs[:2]:
        for key in ("sampled_edges", "input_nodes", "unique_input_nodes", "feat_bytes",
                    "cache_hit_rate", "sampler_s", "stall_s", "loss", "test_acc"):
            assert key in rec, key
        assert rec["world_size"] == 2 and rec["steps"] == -(-most // 200)
        assert rec["feat_bytes"] > 0 and 0 < rec["cache_hit_rate"] < 1
        assert rec["unique_input_nodes"] <= rec["input_nodes"]
        assert rec["comm_timing"] == "host", rec  # the gradient all-reduce, on host tensors


@pytest.mark.parametrize("argv,needle", [
    (["--mode", "minibatch", "--fanouts", "5", "--batch-size", "8"], "--layers"),
    (["--mode", "minibatch", "--fanouts", "5,5"], "--batch-size"),
    (["--fanouts", "5,5"], "--mode minibatch"),
    (["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "8", "--algo", "2d"],
     "2d needs --grid"),
    (["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "8", "--cache-frac", "2"],
     "--cache-frac"),
])
def test_cli_bad_minibatch_flags_exit_2(argv, needle, capsys):
    from gnnpar.train import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
