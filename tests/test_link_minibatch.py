"""Mini-batch link prediction (``--task link --mode minibatch``): edge batches as seeds.

- the plan: every training positive once an epoch over all ranks, each with its negatives;
  a step's nodes are its pairs' endpoints; counts are of pairs;
- exactness: a data-parallel step at 2 and 3 ranks (sampled fanouts, several steps, uneven
  shards) gives the gradient of the same blocks run serially, to 1e-5;
- with full neighbourhoods and one step an epoch, mini batch is full batch: the installed
  ``gnnpar-train`` gives the full-batch run's loss curve and metrics at 1, 2 and 3 ranks;
- grouped (a group of g ranks runs each step's blocks on a distributed SpMM, d = W / g
  groups data parallel): the synced gradient at W = 2 (g = 2, 1d-halo), W = 3 (g = 3, 1d) and
  W = 4 (4d: d = 2 groups of a 1x1x2 cube, GAT) is that of every group's blocks run serially, to 1e-5;
  the installed ``gnnpar-train`` runs it.
"""
import json

import numpy as np
import pytest
import torch

from gnnpar.link.decoders import summed_link_loss
from gnnpar.link.minibatch import LinkPlan, link_minibatch_step, rank_positives
from gnnpar.link.split import split_edges
from gnnpar.nn.models import GNN
from gnnpar.cli.spec import RunSpec
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.sampling import SamplingStats
from gnnpar.sampling.blocks import block_operators
from gnnpar.training.minibatch_setup import build_rank
from gnnpar.launcher.spawn import spawn

from .cli_util import run_installed
from .graphs import random_graph
from .test_minibatch import cli_spec


def test_plan_visits_every_positive_once_with_its_negatives():
    pos = np.stack([np.arange(0, 50), np.arange(50, 100)])
    plans = [LinkPlan(pos, 3, r, 7, seed=4, ratio=2, num_nodes=120) for r in range(3)]
    assert len({p.steps for p in plans}) == 1 and plans[0].steps == 3  # ceil(17 / 7)
    assert plans[0].total == 50 * 3
    seen = []
    for p in plans:
        nodes = p.minibatches(epoch=1)
        for s, ids in enumerate(nodes):
            ps, neg = p.pairs(1, s)
            assert neg.shape[1] == 2 * ps.shape[1] and np.array_equal(neg[0],
                                                                      np.repeat(ps[0], 2))
            assert np.array_equal(ids, np.unique(np.concatenate([ps.ravel(), neg[1]])))
            seen.append(ps)
    got = np.concatenate(seen, axis=1)
    assert sorted(map(tuple, got.T)) == sorted(map(tuple, pos.T))
    for s in range(plans[0].steps):
        assert plans[0].global_count(s) == 3 * sum(p.pairs(1, s)[0].shape[1] for p in plans)
    assert np.array_equal(rank_positives(10, 3, 1), [1, 4, 7])


def _spec(*argv) -> RunSpec:
    return cli_spec("--task", "link", *argv)


def _graph():
    g = random_graph(n=150, avg_deg=5, f=6, classes=3, seed=5)
    return split_edges(g, (0.8, 0.1, 0.1), seed=3)


def step_body(rank, world, kind, layout=()):
    graph, split = _graph()
    shard = build_shard(graph, partition_graph(graph, world, "random", seed=1), rank)
    shard.meta["link_split"] = split
    args = _spec("--fanouts", "4,3", "--batch-size", "9", "--neg-ratio", "2",
                 "--macrobatch", "2", "--prefetch", "1", *layout)
    plan = lambda stream, w: LinkPlan(split.train_pos, w, stream, 9, 0, 2,  # noqa: E731
                                      graph.num_nodes)
    torch.manual_seed(0)
    model = GNN(kind, 6, 8, 8, 2, dropout=0.0)
    decoder = torch.nn.Identity()
    decoder.forward = lambda zu, zv: (zu * zv).sum(-1)
    service, engine, _, _ = build_rank(rank, world, shard, args, model.norm, "cpu",
                                       make_plan=plan)
    service.start(0, 1)
    try:
        batches = list(service.epoch(0, SamplingStats()))
    finally:
        service.close()
    b = batches[1]  # not the first: a later step's own batch
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # gradients kept, weights unchanged
    link_minibatch_step(model, decoder, opt, engine, b, service.plan)
    if b.shards is not None:  # a group member: its group's whole blocks and their inputs
        return {"blocks": b.blocks, "x": np.asarray(graph.x)[b.blocks[0].src_ids],
                "seeds": b.blocks[-1].src_ids[:b.blocks[-1].num_dst],
                "pairs": service.plan.pairs(0, 1), "count": service.plan.global_count(1),
                "steps": len(batches), "lead": service.me == 0,
                "grads": [p.grad.numpy().copy() for p in model.parameters()]}
    return {"blocks": b.blocks, "x": b.x.numpy(), "seeds": b.seeds, "lead": True,
            "pairs": service.plan.pairs(0, 1), "count": service.plan.global_count(1),
            "steps": len(batches), "grads": [p.grad.numpy().copy() for p in model.parameters()]}


LAYOUTS = {"data-parallel-2": (2, "gcn", ()), "data-parallel-3": (3, "sage", ()),
           "grouped-2-1d-halo": (2, "gcn", ("--algo", "1d-halo", "--group-size", "2")),
           "grouped-3-1d": (3, "sage", ("--algo", "1d", "--group-size", "3")),
           "grouped-2x2-4d": (4, "gat", ("--algo", "4d", "--grid", "2x1x1x2"))}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_step_equals_the_same_blocks_run_serially(name):
    world, kind, layout = LAYOUTS[name]
    res = spawn(step_body, world, args=(kind, layout), timeout_s=120, dynamo_first=True)
    assert len({r["steps"] for r in res}) == 1 and res[0]["steps"] > 2
    torch.manual_seed(0)
    model = GNN(kind, 6, 8, 8, 2, dropout=0.0)
    total = 0.0
    for r in (r for r in res if r["lead"]):  # every group's batch, one after another
        z = model(block_operators(r["blocks"]), torch.from_numpy(r["x"]))
        rows = lambda p: z.index_select(0, torch.from_numpy(  # noqa: E731
            np.searchsorted(r["seeds"], p).astype(np.int64)))
        pos, neg = r["pairs"]
        score = lambda p: (rows(p[0]) * rows(p[1])).sum(-1)  # noqa: E731
        total = total + summed_link_loss(score(pos), score(neg))
    (total / res[0]["count"]).backward()
    for r in res:
        for p, g in zip(model.parameters(), r["grads"]):
            torch.testing.assert_close(torch.from_numpy(g), p.grad, rtol=1e-5, atol=1e-7)


DATA = "sbm:n=160,blocks=4,p_in=0.1,p_out=0.01"
COMMON = ["--task", "link", "--dataset", DATA, "--hidden", "8", "--epochs", "3", "--dropout",
          "0", "--neg-ratio", "2", "--quiet"]
METRICS = ("loss", "val_auc", "test_auc", "val_mrr", "test_mrr", "test_hits@20")


@pytest.mark.slow
def test_full_neighbourhood_one_step_minibatch_is_full_batch(tmp_path):
    """``--fanouts=-1,-1`` with a batch of every positive: each epoch is one step on exact
    neighbourhoods, so its loss and metrics are the full-batch run's, on any rank count."""
    runs = {"full": []}
    mb = ["--mode", "minibatch", "--fanouts=-1,-1", "--batch-size", "100000"]
    runs.update({f"mb{w}": mb + ([] if w == 1 else ["--nprocs", str(w)]) for w in (1, 2, 3)})
    logs = {}
    for name, extra in runs.items():
        res = run_installed("gnnpar-train", *COMMON, *extra, "--log-json", f"{name}.jsonl",
                            cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        logs[name] = [json.loads(line) for line in open(tmp_path / f"{name}.jsonl")]
    ref = logs["full"]
    for name in ("mb1", "mb2", "mb3"):
        got = logs[name]
        assert got[-1]["mode"] == "minibatch" and got[-1]["task"] == "link"
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            for k in METRICS:
                assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (name, k, a[k], b[k])


def test_grouped_link_minibatch_trains_through_the_installed_command(tmp_path):
    res = run_installed("gnnpar-train", *COMMON, "--mode", "minibatch", "--fanouts", "5,5",
                        "--batch-size", "16", "--algo", "1d", "--group-size", "2",
                        "--nprocs", "2", "--log-json", "g.jsonl", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    final = [json.loads(line) for line in open(tmp_path / "g.jsonl")][-1]
    assert final["task"] == "link" and final["group_size"] == 2 and final["algo"] == "1d"
    assert 0.0 <= final["test_auc"] <= 1.0 and np.isfinite(final["loss"])


@pytest.mark.slow
def test_resumed_link_minibatch_run_logs_what_an_unbroken_one_does(tmp_path):
    """Negatives keyed by epoch, blocks by (seed, epoch, rank, step): 2 epochs, a checkpoint,
    a resume to 4 give the 4-epoch run's records bit for bit (2 ranks), and its final
    record's sampling totals are the whole run's."""
    argv = ["--task", "link", "--dataset", DATA, "--hidden", "8", "--mode", "minibatch",
            "--fanouts", "4,4", "--batch-size", "32", "--nprocs", "2", "--quiet"]
    half = argv + ["--epochs", "2"]
    argv = argv + ["--epochs", "4"]
    for cmd in (argv + ["--log-json", "whole.jsonl"],
                half + ["--checkpoint-dir", "ck", "--log-json", "cut.jsonl"],
                argv + ["--checkpoint-dir", "ck", "--resume", "--log-json", "cut.jsonl"]):
        res = run_installed("gnnpar-train", *cmd, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
    whole, cut = ([json.loads(line) for line in open(tmp_path / name)]
                  for name in ("whole.jsonl", "cut.jsonl"))
    (whole, whole_final), (cut, cut_final) = ((r[:-1], r[-1]) for r in (whole, cut))
    assert [r["epoch"] for r in cut] == [0, 1, 2, 3]
    for a, b in zip(whole, cut):
        assert a["loss"] == b["loss"] and a["test_auc"] == b["test_auc"]
    # the final totals cover both segments of the resumed run, not only the last
    assert cut_final["epochs"] == whole_final["epochs"] == 4
    for key in ("sampled_edges", "input_nodes", "unique_input_nodes", "feat_bytes",
                "comm_bytes"):
        assert cut_final[key] == whole_final[key] == sum(r[key] for r in whole), key
