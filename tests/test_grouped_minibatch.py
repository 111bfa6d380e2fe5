"""Grouped mini-batch training: each data-parallel group of g ranks runs its sampled subgraph
on a distributed SpMM (1d, 1d-halo, 1.5d, 2d, 3d with --group-size / --grid, 4d with
--grid DxPXxPYxPZ).

Every rank body computes, for every step of an epoch, the grouped forward (its owned seed
rows), the synced gradient, and the same minibatch run whole on one process; the parent
checks the forward per rank, the synced gradient against the sum over groups of the whole
minibatch gradients and, with full neighbourhoods, against the serial full-graph gradient on
the step's seeds.
"""
import json

import numpy as np
import pytest
import torch

from gnnpar.kernels.bipartite import block_shard, dst_first_owner
from gnnpar.nn.models import GNN
from gnnpar.partitioners import Partition, partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.sampling import SamplingStats
from gnnpar.training.minibatch_setup import build_rank
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn

from .graphs import random_graph

from .cli_util import run_train as run_cli
from .test_minibatch import cli_spec
GRAPH = dict(n=120, avg_deg=4, f=6, classes=3, seed=9)


def rel_err(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) if b.numel() else 0.0


# ---------------------------------------------------------------- pure functions
def test_dst_first_owner_balances_every_layer_and_prefers():
    bounds = [5, 12, 30]
    prefer = np.full(30, -1)
    prefer[:5] = [2, 2, 2, 2, 0]            # rank 2 wants 4 of 5 seeds: room for 1 only
    prefer[12:20] = 1
    owner = dst_first_owner(bounds, 3, prefer)
    for stop in bounds:                      # every layer's rows split evenly (±1 per band)
        counts = np.bincount(owner[:stop], minlength=3)
        assert counts.max() - counts.min() <= len(bounds) - 1
    assert list(owner[:5]).count(2) == 1 and owner[0] == 2 and owner[4] == 0
    assert np.all(np.bincount(owner[12:30], minlength=3) == 6)
    assert np.all(owner[12:18] == 1)         # preferred while there is room


def test_block_shard_rows_halo_and_send_lists_are_consistent():
    rng = np.random.default_rng(0)
    n_dst, n_src, g = 7, 19, 3
    dense = (rng.random((n_dst, n_src)) < 0.3) * rng.random((n_dst, n_src))
    dense[np.arange(n_dst), np.arange(n_dst)] = 1.0
    indptr = np.concatenate([[0], np.cumsum((dense != 0).sum(1))])
    indices = np.nonzero(dense)[1]
    values = dense[dense != 0].astype(np.float32)
    indices = np.concatenate([indices, [3]])           # a repeated entry in the last row
    values = np.concatenate([values, [0.5]]).astype(np.float32)
    indptr[-1] += 1
    dense[-1, 3] += 0.5
    owner = dst_first_owner([n_dst, n_src], g)
    shards = [block_shard(indptr, indices, values, owner, r, g, "gcn") for r in range(g)]
    for r, sh in enumerate(shards):
        assert np.array_equal(sh.global_ids, np.flatnonzero(owner == r))
        assert np.all(sh.global_ids[:sh.num_dst] < n_dst) and np.all(sh.global_ids[sh.num_dst:]
                                                                     >= n_dst)
        local = np.zeros((sh.n_local, n_src))
        cols = sh.column_ids()
        rows = np.repeat(np.arange(sh.n_local), np.diff(sh.indptr))
        np.add.at(local, (rows, cols[sh.indices]), sh.values["gcn"])
        np.testing.assert_allclose(local[:sh.num_dst], dense[sh.global_ids[:sh.num_dst]],
                                   rtol=1e-6)
        assert not local[sh.num_dst:].any()             # rows >= n_dst of S are empty
        for q in range(g):                              # q's halo from r == r's sends to q
            halo_q = shards[q].halo_ids[shards[q].recv_counts[:r].sum():
                                        shards[q].recv_counts[:r + 1].sum()]
            sent = sh.send_local[sh.send_counts[:q].sum():sh.send_counts[:q + 1].sum()]
            assert np.array_equal(sh.global_ids[sent], halo_q)


# ---------------------------------------------------------------- multi-rank equivalence
def uneven_partition(graph, world):
    """Group 1 (ranks 2, 3) holds a single training seed: its minibatches are one seed, then
    empty, so its members own zero destination rows at some steps."""
    owner = np.arange(graph.num_nodes, dtype=np.int32) % world
    train = np.flatnonzero(graph.train_mask)
    owner[train] = train % 2
    owner[train[0]] = 2
    return Partition.from_owner(owner, world, method="uneven")


def _whole_minibatch(model, batch, graph, count):
    """Logits of the minibatch's seeds and the gradient of its loss / count, on one process."""
    model.zero_grad()
    ops = [b.operator() for b in batch.blocks]
    out = model(ops, torch.from_numpy(graph.x[batch.blocks[0].src_ids]))
    seeds = batch.blocks[-1].dst_ids
    y = torch.from_numpy(graph.y[seeds])
    (torch.nn.functional.cross_entropy(out, y, reduction="sum") / count).backward()
    return out.detach(), [p.grad.numpy().copy() for p in model.parameters()]


def grouped_body(rank, world, cases, uneven):
    graph = random_graph(**GRAPH)
    part = (uneven_partition(graph, world) if uneven
            else partition_graph(graph, world, "random", seed=1))
    shard = build_shard(graph, part, rank)
    res = {}
    for label, kind, layers, argv in cases:
        args = cli_spec("--batch-size", "16", "--macrobatch", "2", "--layers", str(layers),
                        *argv)
        torch.manual_seed(0)
        model = GNN(kind, 6, 8, 3, layers, dropout=0.0)
        service, engine, _, info = build_rank(rank, world, shard, args, model.norm, "cpu")
        plan = service.plan
        service.start(0, 1)
        try:
            batches = list(service.epoch(0, SamplingStats()))
        finally:
            service.close()
        engine.comm_stats()
        steps = []
        for b in batches:
            count = max(plan.global_count(b.step), 1)
            ref_out, ref_grads = _whole_minibatch(model, b, graph, count)
            model.zero_grad()
            out = model(engine.operators(b), b.x)
            loss = torch.nn.functional.cross_entropy(out, b.y, reduction="sum")
            (loss / count).backward()
            engine.sync_grads(model.parameters())
            mine = np.searchsorted(b.blocks[-1].dst_ids, b.seeds)
            steps.append({"fwd": rel_err(out.detach(), ref_out[torch.from_numpy(mine)]),
                          "grads": [p.grad.numpy().copy() for p in model.parameters()],
                          "ref": ref_grads, "seeds": b.blocks[-1].dst_ids,
                          "owned": int(b.seeds.size), "x_rows": int(b.x.shape[0]),
                          "inputs": int(b.blocks[0].num_src)})
        group_bytes = engine.comm_stats()[0]
        res[label] = {"steps": steps, "group": plan.stream, "layout": info["layout"],
                      "bytes": group_bytes}
    return res


def check_case(results, label, kind, layers, full_neighbourhood):
    graph = random_graph(**GRAPH)
    per_rank = [r[label] for r in results]
    groups = {}
    for r in per_rank:
        groups.setdefault(r["group"], r)
    n_steps = len(per_rank[0]["steps"])
    assert all(len(r["steps"]) == n_steps for r in per_rank)
    assert all(r["bytes"] > 0 for r in per_rank)       # kernel traffic was counted
    for s in range(n_steps):
        for r in per_rank:
            assert r["steps"][s]["fwd"] < 1e-5, (label, s, r["steps"][s]["fwd"])
        # each seed's row is owned by exactly one member; every member fetched only its rows
        for g, first in groups.items():
            members = [r for r in per_rank if r["group"] == g]
            assert sum(m["steps"][s]["owned"] for m in members) == first["steps"][s]["seeds"].size
            assert sum(m["steps"][s]["x_rows"] for m in members) == first["steps"][s]["inputs"]
        ref = [sum(grads) for grads in zip(*[g["steps"][s]["ref"] for g in groups.values()])]
        for r in per_rank:
            for a, b in zip(r["steps"][s]["grads"], ref):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        if full_neighbourhood:
            seeds = np.concatenate([g["steps"][s]["seeds"] for g in groups.values()])
            if seeds.size == 0:
                continue
            torch.manual_seed(0)
            model = GNN(kind, 6, 8, 3, layers, dropout=0.0)
            rt = SerialRuntime(graph, model.norm)
            seeds = torch.from_numpy(seeds)
            torch.nn.functional.cross_entropy(model(rt.op, rt.x)[seeds], rt.y[seeds]).backward()
            for p, a in zip(model.parameters(), per_rank[0]["steps"][s]["grads"]):
                assert rel_err(a, p.grad) < 1e-5, (label, s)
    return per_rank


FULL = "--fanouts=-1,-1"
CASES_2 = [
    ("1d-halo", "sage", 2, [FULL, "--algo", "1d-halo", "--group-size", "2"]),
    ("1d", "gcn", 3, ["--fanouts=-1,-1,-1", "--algo", "1d", "--group-size", "2"]),
    ("1.5d", "gcn", 2, [FULL, "--algo", "1.5d", "--group-size", "2", "--replication", "2"]),
    ("2d", "sage", 2, [FULL, "--algo", "2d", "--grid", "1x2"]),
    ("2d-bcast", "gcn", 2, [FULL, "--algo", "2d", "--grid", "2x1", "--variant", "bcast"]),
    ("3d", "gcn", 2, [FULL, "--algo", "3d", "--grid", "1x1x2"]),
    ("2d-gat", "gat", 2, [FULL, "--algo", "2d", "--grid", "1x2"]),
    # a neighbour drawn twice: two entries of the whole minibatch's block, one merged entry
    # of the group's shards; the softmax counts it once in both
    ("replace-gat", "gat", 2, ["--fanouts", "4,3", "--replace", "--algo", "1d-halo",
                               "--group-size", "2"]),
]
CASES_4 = [
    ("1d-halo", "gcn", 2, [FULL, "--algo", "1d-halo", "--group-size", "2"]),
    ("4d", "sage", 2, [FULL, "--algo", "4d", "--grid", "2x1x1x2"]),
    ("sampled", "sage", 2, ["--fanouts", "3,2", "--replace", "--algo", "1d-halo",
                            "--group-size", "2"]),
    ("3d-group4", "gcn", 2, ["--fanouts", "4,3", "--algo", "3d", "--grid", "2x1x2"]),
    ("4d-gat", "gat", 2, [FULL, "--algo", "4d", "--grid", "2x1x1x2"]),
    ("sampled-gat", "gat", 2, ["--fanouts", "3,2", "--algo", "1d-halo", "--group-size", "2"]),
]


def test_grouped_step_equals_whole_minibatch_and_full_batch_two_ranks():
    res = spawn(grouped_body, 2, args=(CASES_2, False), timeout_s=120)
    for label, kind, layers, argv in CASES_2:
        per_rank = check_case(res, label, kind, layers, full_neighbourhood=FULL in argv)
        assert per_rank[0]["layout"]["groups"] == 1 and per_rank[0]["layout"]["group_size"] == 2


def test_grouped_step_two_groups_four_ranks_uneven_seeds():
    res = spawn(grouped_body, 4, args=(CASES_4, True), timeout_s=150)
    for label, kind, layers, argv in CASES_4:
        per_rank = check_case(res, label, kind, layers, full_neighbourhood=FULL in argv)
        groups = 1 if label == "3d-group4" else 2
        assert per_rank[0]["layout"]["groups"] == groups
        assert [r["group"] for r in per_rank] == ([0, 0, 1, 1] if groups == 2 else [0] * 4)
    # group 1 has one seed: a member owning no seed row, then empty minibatches, still exact
    steps = [r["1d-halo"]["steps"] for r in res[2:]]
    assert sorted(s[0]["owned"] for s in steps) == [0, 1]
    assert all(s[1]["seeds"].size == 0 for s in steps)
    assert res[0]["4d"]["layout"]["grid"] == [2, 1, 1, 2]


# ---------------------------------------------------------------- CLI
def test_cli_grouped_1d_halo_learns_and_logs_sampling_fields(tmp_path):
    log = tmp_path / "log.jsonl"
    p = run_cli("--mode", "minibatch", "--algo", "1d-halo", "--group-size", "2", "--nprocs", "4",
                "--fanouts", "5,5", "--batch-size", "100", "--macrobatch", "2", "--epochs", "6",
                "--lr", "0.02", "--partitioner", "block", "--quiet", "--log-json", str(log))
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(recs) == 7 and recs[-1]["final"] is True
    for rec in recs[:-1]:
        for key in ("sampled_edges", "input_nodes", "unique_input_nodes", "feat_bytes",
                    "cache_hit_rate", "sampler_s", "stall_s", "comm_bytes"):
            assert key in rec, key
        assert rec["algo"] == "1d-halo" and rec["grid"] == [2, 2] and rec["group_size"] == 2
        assert rec["world_size"] == 4 and rec["feat_bytes"] > 0 and rec["comm_bytes"] > 0
        # each group's ranks together fetch at least its minibatches' distinct inputs
        assert 0 < rec["sampled_edges"] and 0 < rec["unique_input_nodes"]
    assert recs[-1]["test_acc"] > 0.6  # 8 classes: chance is 0.125
    assert recs[-2]["loss"] < recs[0]["loss"]


@pytest.mark.parametrize("argv,needle", [
    (["--algo", "2d", "--group-size", "2"], "--grid"),
    (["--algo", "1d-halo"], "--group-size"),
    (["--algo", "1d-halo", "--group-size", "3", "--nprocs", "4"], "world size 4"),
    (["--algo", "3d", "--grid", "1x2x2", "--group-size", "2", "--nprocs", "4"], "disagrees"),
    (["--algo", "4d", "--grid", "3x1x1x2", "--nprocs", "4"], "world size is 4"),
    (["--group-size", "2"], "needs --algo"),
    (["--algo", "auto", "--nprocs", "2"], "full-batch"),
])
def test_cli_bad_group_flags_exit_2(argv, needle, capsys):
    from gnnpar.train import main
    assert main(["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "8", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_group_size_needs_minibatch_mode(capsys):
    from gnnpar.train import main
    assert main(["--algo", "1d", "--nprocs", "2", "--group-size", "2"]) == 2
    assert "--mode minibatch" in capsys.readouterr().err
