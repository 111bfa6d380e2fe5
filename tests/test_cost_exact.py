"""The cost model predicts the bytes runs log: for every algorithm and grid ``gnnpar-plan``
ranks (and 4d), its busiest rank's logical bytes are the ``comm_bytes_max_rank`` of one
training step built as ``gnnpar-train`` builds it — the block layout and its seed, the wire
format — in fp32 and bf16, under METIS and random partitions, at 4 and 6 ranks; every rank's
logical and padded bytes and messages are exactly the model's. One spawn per (world size,
partitioner) trains every case in-process (:func:`step_bytes`); two real ``gnnpar-train
--nprocs`` runs check the flags reach the same prediction through ``gnnpar-plan --json``."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gnnpar.distributed import EPOCH_PHASES, DistRuntime
from gnnpar.kernels.algorithms import get
from gnnpar.kernels.build import make_grid
from gnnpar.kernels.comm import WIRE_DTYPES
from gnnpar.kernels.cost_terms import gat_kind
from gnnpar.kernels.cost_model import (Machine, Structure, candidates, epoch_traffic, predict,
                                       rank_algorithms, run_options, run_structure, wire_bytes)
from gnnpar.models import GNN
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.plan_cli import main as plan_main
from gnnpar.spawn import spawn
from gnnpar.trainer import train_step

from .cli_util import run_train
from .dist_cases import epoch_bytes, epoch_messages
from .graphs import random_graph

N, SEED, HIDDEN, LAYERS = 60, 3, 8, 3
WIDTHS = [6] + [HIDDEN] * (LAYERS - 1) + [3]
DTYPES = ("fp32", "bf16")
WORLDS = [(4, "metis"), (4, "random"), (6, "metis"), (6, "random")]
#: 4d is not ranked (the plan lists its full-batch twin 3d) but is predicted and run alike
EXTRA = {4: [("4d", (1, 2, 2), "-")], 6: [("4d", (1, 2, 3), "-")]}


def graph():
    return random_graph(n=N, f=WIDTHS[0], classes=WIDTHS[-1], seed=7, directed=True)


def settings(variant, dtype, precision="fp32"):
    """What a gnnpar-train RunSpec gives the option rule and the wire (defaults otherwise)."""
    return SimpleNamespace(layers=LAYERS, seed=SEED, block_layout="balanced",
                           variant=variant if variant in ("halo", "bcast") else None,
                           comm_dtype=dtype, precision=precision)


def cases(world):
    """(algo, dims, variant) of every candidate the plan ranks at ``world``, and 4d."""
    return list(candidates(world)) + EXTRA[world]


def grid_args(algo, dims):
    """make_grid's (dims, replication) for the cost model's dims."""
    return (None, int(dims)) if algo == "1.5d" else (dims, 1)


def step_bytes(rank, world, method, runs, kind="gcn"):
    """Rank body: each run ``(algo, dims, variant, dtype, precision)`` of a ``kind`` model
    (``"gat"``: :data:`GAT_HEADS` heads) built as
    :func:`gnnpar.rank._fullbatch` builds it (its entry's options from the run settings, the
    wire dtype), one training step (:func:`gnnpar.trainer.train_step`), and this rank's bytes
    of the step's phases with the run's logged ``comm_bytes_max_rank``. Runs that differ only
    in the wire share one build (the wire is read per collective, and a build's own traffic
    is phase ``setup``, not the step's)."""
    g = graph()
    shard = build_shard(g, partition_graph(g, world, method, seed=SEED), rank, norms=("gcn",))
    out, built = [], {}
    for algo, dims, variant, dtype, precision in runs:
        if (algo, dims, variant) not in built:
            spec = settings(variant, "fp32")
            built = {(algo, dims, variant): DistRuntime(
                make_grid(algo, world, *grid_args(algo, dims)), shard, algo, "gcn", "cpu",
                None, **get(algo).options(spec))}
        rt = built[algo, dims, variant]
        rt.comm.wire_dtype = WIRE_DTYPES[dtype]
        torch.manual_seed(0)
        model = GNN(kind, WIDTHS[0], HIDDEN, WIDTHS[-1], layers=LAYERS, dropout=0.0,
                    **({"heads": GAT_HEADS} if kind == "gat" else {}))
        opt = SimpleNamespace(zero_grad=model.zero_grad, step=lambda: None)  # bytes only
        rt.comm.reset()
        train_step(model, opt, rt, float(rt.masks["train"].sum()) or 1.0, precision)
        c = rt.comm
        mine = [epoch_bytes(c), sum(v for (_, ph), v in c.padded.items() if ph in EPOCH_PHASES),
                epoch_messages(c)]
        out.append((mine, rt.comm_stats().bytes_max_rank))
    return out


def all_runs(world):
    """Every case in both wire formats, and a few under ``--precision bf16`` (autocast hands
    the SpMM bf16 features: they travel as bf16 on an fp32 wire); a case's runs together."""
    some = [next(c for c in cases(world) if c[0] == a and c[2] in v)
            for a, v in (("1d", "bcast"), ("2d", "bcast"), ("3d", "-"))]
    runs = []
    for case in cases(world):
        wires = [(t, "fp32") for t in DTYPES] + ([("fp32", "bf16")] if case in some else [])
        runs += [tuple(case) + w for w in wires]
    return runs


_MEASURED = {}


def measured(world, method):
    """[(bytes per rank, logged max) per run of :func:`all_runs`], one spawn per (world,
    method), kept for the module."""
    if (world, method) not in _MEASURED:
        got = spawn(step_bytes, world, args=(method, all_runs(world)), timeout_s=600)
        _MEASURED[world, method] = [([r[i][0] for r in got], got[0][i][1])
                                    for i in range(len(got[0]))]
    return _MEASURED[world, method]


@pytest.mark.parametrize("world,method", WORLDS, ids=[f"{m}-p{w}" for w, m in WORLDS])
def test_predicted_bytes_are_the_logged_bytes(world, method):
    g = graph()
    s = Structure.from_graph(g, partition_graph(g, world, method, seed=SEED).owner, world)
    runs = all_runs(world)
    n, m = g.num_nodes, int(s.rows.shape[0])
    seen = set()
    for dtype in DTYPES:
        # the very rows gnnpar-plan prints: every candidate is among the runs measured
        plan = rank_algorithms(n, m, WIDTHS, world, structure=s, settings=settings(None, dtype))
        assert len(plan) == len(list(candidates(world)))
        for row in plan:
            dims = (tuple(int(d) for d in row["grid"].split("x")) if row["algo"] in ("2d", "3d")
                    else (row["replication"] if row["algo"] == "1.5d" else None))
            i = runs.index((row["algo"], dims, row["variant"], dtype, "fp32"))
            per_rank, logged = measured(world, method)[i]
            assert max(r[0] for r in per_rank) == logged
            assert row["comm_bytes_max_rank"] == pytest.approx(logged, rel=0.01), row
            seen.add(i)
    for i, (algo, dims, variant, dtype, precision) in enumerate(runs):
        per_rank, logged = measured(world, method)[i]
        spec = settings(variant, dtype, precision)
        got = predict(s, algo, "gcn", WIDTHS, Machine(), dims, variant, LAYERS, spec)
        assert got["comm_bytes_max_rank"] == logged, (algo, dims, variant, dtype, precision)
        # and every rank's, exactly: the model lays Â out as the builders do
        opts = run_options(algo, spec, variant, LAYERS)
        exact = epoch_traffic(run_structure(s, opts), algo, "gcn", WIDTHS, dims,
                              opts.get("variant", variant), opts.get("layers", 0),
                              wire=wire_bytes(spec))
        case = (algo, dims, variant, dtype, precision)
        assert exact["bytes"].tolist() == [r[0] for r in per_rank], case
        # what the collectives really move (a low-precision reduce-scatter pads nothing)
        assert exact["padded"].tolist() == [r[1] for r in per_rank], case
        assert exact["messages"].tolist() == [r[2] for r in per_rank], case
    assert len(seen) == 2 * len(list(candidates(world)))
    # the cases differ: the layout and the wire are not no-ops here
    lay = {run_structure(s, run_options(a, settings(v, "fp32"), v, LAYERS)).owner.tobytes()
           for a, _, v in cases(world)}
    assert len(lay) == 2  # the partition's (1d, 1d-halo, 1.5d) and the balanced one (2d-4d)
    maxima = {r: measured(world, method)[i][1] for i, r in enumerate(runs)}
    for a, d, v, dtype, precision in runs:
        if (dtype, precision) != ("fp32", "fp32"):
            assert maxima[a, d, v, dtype, precision] < maxima[a, d, v, "fp32", "fp32"]


# ----------------------------------------------------------------- GAT's exchanges
GAT_HEADS = 2
GAT_WORLDS = [(4, "random"), (6, "metis")]


@pytest.mark.parametrize("world,method", GAT_WORLDS, ids=[f"{m}-p{w}" for w, m in GAT_WORLDS])
def test_gat_exchanges_are_predicted_exactly(world, method):
    """Every rank's bytes, padded bytes and messages of a GAT step on every algorithm and grid
    the plan ranks (and 4d) are the cost model's moves (kernels/cost_attention.py), in fp32
    and, for a few, on a bf16 wire (the row maxima still travel in fp32); the plan ranks
    every candidate for --model gat."""
    some = [next(c for c in cases(world) if c[0] == a and c[2] == v)
            for a, v in (("1d", "bcast"), ("2d", "bcast"), ("1.5d", "halo"), ("3d", "-"))]
    runs = ([tuple(c) + ("fp32", "fp32") for c in cases(world)]
            + [tuple(c) + ("bf16", "fp32") for c in some])
    got = spawn(step_bytes, world, args=(method, runs, "gat"), timeout_s=600)
    g = graph()
    s = Structure.from_graph(g, partition_graph(g, world, method, seed=SEED).owner, world)
    kind = gat_kind(GAT_HEADS)
    for i, (algo, dims, variant, dtype, precision) in enumerate(runs):
        spec = settings(variant, dtype, precision)
        opts = run_options(algo, spec, variant, LAYERS)
        exact = epoch_traffic(run_structure(s, opts), algo, kind, WIDTHS, dims,
                              opts.get("variant", variant), opts.get("layers", 0),
                              wire=wire_bytes(spec))
        per_rank = [r[i][0] for r in got]
        for j, name in enumerate(("bytes", "padded", "messages")):
            assert exact[name].tolist() == [r[j] for r in per_rank], (runs[i], name)
        if algo in ("2d", "3d") and dtype == "fp32":  # the moves are not a product's
            gcn = epoch_traffic(run_structure(s, opts), algo, "gcn", WIDTHS, dims,
                                opts.get("variant", variant), opts.get("layers", 0))
            assert exact["bytes"].sum() != gcn["bytes"].sum(), runs[i]
    n, m = g.num_nodes, int(s.rows.shape[0])
    plan = rank_algorithms(n, m, WIDTHS, world, kind=kind, structure=s,
                           settings=settings(None, "fp32"))
    assert len(plan) == len(list(candidates(world)))
    if method == "random":  # the estimate (no partition) is near the mean rank's bytes
        exact = {(r["algo"], r["grid"], r["variant"]): r["bytes_mean"] for r in plan}
        for r in rank_algorithms(n, m, WIDTHS, world, kind=kind):
            ratio = r["bytes"] / exact[r["algo"], r["grid"], r["variant"]]
            assert 2 / 3 < ratio < 1.5, (r["algo"], r["grid"], r["variant"], ratio)


# ----------------------------------------------------------------- the CLI's plumbing
CLI_DATASET = "rmat:scale=8,ef=4"
CLI_RUNS = [  # (world, partitioner, algo, grid flag, variant, extra flags)
    (4, "metis", "2d", "2x2", "halo", []),
    (4, "random", "3d", "1x2x2", "-", ["--comm-dtype", "bf16", "--seed", "5"]),
]


@pytest.mark.parametrize("world,method,algo,grid,variant,extra", CLI_RUNS,
                         ids=[f"{r[2]}-{r[1]}-p{r[0]}" for r in CLI_RUNS])
def test_gnnpar_plan_predicts_what_gnnpar_train_logs(tmp_path, capsys, world, method, algo,
                                                     grid, variant, extra):
    log = tmp_path / "log.jsonl"
    flags = ["--dataset", CLI_DATASET, "--partitioner", method, "--layers", "3", "--hidden",
             "16"] + extra
    res = run_train("--algo", algo, "--grid", grid, "--nprocs", str(world), "--epochs", "1",
                    "--dropout", "0", "--quiet", "--log-json", str(log), *flags,
                    *(["--variant", variant] if variant != "-" else []), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    logged = json.loads(log.read_text().splitlines()[0])["comm_bytes_max_rank"]
    assert plan_main(["--world", str(world), "--json", *flags]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    row = next(r for r in rows if (r["algo"], r["grid"], r["variant"]) == (algo, grid, variant))
    assert row["comm_bytes_max_rank"] == pytest.approx(logged, rel=0.01)
    assert row["comm_bytes_max_rank"] == logged  # exact, in fact
    assert logged > 0 and np.isfinite(row["time_s"])
