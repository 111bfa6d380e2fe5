"""Cost model: estimates agree with exact counts where both are exact, planning works at
papers100M scale, configuration errors are InputErrors; the ranking follows the busiest rank,
and the padded bytes it predicts are what the collectives really move (4 spawned ranks)."""
import numpy as np
import pytest
import torch

from gnnpar.datasets import InputError
from gnnpar.training.distributed import EPOCH_PHASES, DistRuntime
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.algorithms import ALGORITHMS, cost_names, get, make_grid
from gnnpar.kernels.comm import Comm
from gnnpar.kernels.cost_model import (Machine, Structure, epoch_traffic, epoch_work,
                                       estimate_traffic, param_count, predict, rank_algorithms,
                                       spmm_widths)
from gnnpar.kernels.cost_terms import (Cost, LinearCounts, gather_padding, per_feature,
                                       reduce_padding)
from gnnpar.kernels.entry import Algorithm
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.kernels.spmm_1d import build_1d, row_axis
from gnnpar.kernels.spmm_4d import build_4d_ops
from gnnpar.nn.models import GNN
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.launcher.spawn import spawn

from .graphs import random_graph

WIDTHS = [6, 7, 7, 3]


def even_structure(n, p, directed=False):
    g = random_graph(n=n, f=6, classes=3, seed=2, directed=directed)
    return Structure.from_graph(g, np.arange(n) % p, p)


def test_spmm_widths_and_params():
    assert spmm_widths("gcn", [6, 7, 7, 3]) == [(6, False), (7, True), (3, True)]
    assert spmm_widths("gcn", [9, 4]) == [(4, True)]
    assert param_count("gcn", [6, 7, 3]) == 6 * 7 + 7 + 7 * 3 + 3
    assert param_count("sage", [6, 3]) == 2 * 6 * 3 + 3


@pytest.mark.parametrize("algo,dims", [("1d", None), ("2d", (2, 3)), ("2d", (3, 2)),
                                       ("1.5d", 2), ("1.5d", 3)])
def test_dense_estimates_equal_exact_on_even_blocks(algo, dims):
    """Dense (bcast/all-gather) traffic depends only on block sizes: with p | n and equal
    parts the average-rank estimate is the exact mean."""
    n, p = 60, 6
    s = even_structure(n, p)
    exact = epoch_traffic(s, algo, "gcn", WIDTHS, dims, "bcast")
    est = estimate_traffic(n, int(s.rows.shape[0]), p, algo, "gcn", WIDTHS, dims, "bcast")
    assert est["bytes"] == pytest.approx(exact["bytes"].mean(), rel=1e-12)
    if algo != "1.5d":  # 1.5d's holder/non-holder message split is averaged
        assert est["messages"] == pytest.approx(exact["messages"].mean())


def test_halo_never_exceeds_dense_exactly():
    s = even_structure(60, 6, directed=True)
    for algo, dims in (("2d", (2, 3)), ("1.5d", 2), ("1.5d", 3)):
        halo = epoch_traffic(s, algo, "sage", WIDTHS, dims, "halo")["bytes"]
        dense = epoch_traffic(s, algo, "sage", WIDTHS, dims, "bcast")["bytes"]
        assert (halo <= dense).all(), algo
    assert (epoch_traffic(s, "1d-halo", "gcn", WIDTHS)["bytes"]
            <= epoch_traffic(s, "1d", "gcn", WIDTHS)["bytes"]).all()


def test_3d_exact_grows_with_depth_axis_a_traffic():
    """The A pieces gathered over the third (depth) role are part of the count. With feature
    widths 0 nothing but A moves: a grid whose depth role is 1 moves no bytes at all, and
    every rank's A bytes grow with the depth (1 < 2 < 4); real widths add to that floor."""
    s = even_structure(48, 4)
    zero = [0, 0, 0, 0]
    a_only = {dims: epoch_traffic(s, "3d", "gcn", zero, dims, rotate=False)["bytes"]
              for dims in ((4, 1, 1), (1, 4, 1), (2, 1, 2), (1, 1, 4))}
    assert a_only[(4, 1, 1)].tolist() == [0] * 4 and a_only[(1, 4, 1)].tolist() == [0] * 4
    assert (a_only[(2, 1, 2)] > 0).all() and (a_only[(1, 1, 4)] > a_only[(2, 1, 2)]).all()
    full = epoch_traffic(s, "3d", "gcn", WIDTHS, (1, 1, 4), rotate=False)["bytes"]
    assert (full > a_only[(1, 1, 4)]).all()


@pytest.mark.parametrize("world", [64, 256, 1024])
def test_plan_papers100m_scale(world):
    n, m = 111_059_956, 1_615_685_872
    rows = rank_algorithms(n, m, [128, 256, 256, 172], world, mem_cap=80e9)
    assert {r["algo"] for r in rows} == set(cost_names()) - {"4d"}
    fits = [r for r in rows if r["fits"]]
    assert fits and all(r["memory"] <= 80e9 for r in fits)
    assert [r["time_s"] for r in fits] == sorted(r["time_s"] for r in fits)
    assert rows.index(fits[-1]) == len(fits) - 1  # over-cap rows come last
    one_d = next(r for r in rows if r["algo"] == "1d")
    # 1d all-gathers every H: ≈ (p-1)/p · n · Σf · 4 bytes forward alone
    assert one_d["bytes"] > (world - 1) / world * n * (128 + 256 + 172) * 4


def test_cut_fraction_lowers_halo_bytes():
    kw = dict(n=10**6, m=2 * 10**7, p=64, kind="gcn", widths=[64, 64, 8])
    rand = estimate_traffic(algo="1d-halo", **kw)["bytes"]
    metis = estimate_traffic(algo="1d-halo", cut_fraction=0.05, **kw)["bytes"]
    assert metis < rand / 5


def test_4d_full_batch_needs_d1():
    grid = ProcessGrid.create({"data": 2, "row": 1, "col": 1, "depth": 2}, world_size=4, rank=0)
    with pytest.raises(InputError, match="d = 1"):
        build_4d_ops(None, Comm(grid), None)


def test_grid_shape_errors():
    with pytest.raises(InputError, match="must divide"):
        get("1.5d").grid(6, replication=4)
    with pytest.raises(InputError, match="2d needs"):
        get("2d").grid(6, (1, 2, 3))
    assert get("1.5d").grid(8, replication=2) == {"row": 4, "replica": 2}
    assert get("4d").grid(8, (2, 2, 2)) == {"data": 1, "row": 2, "col": 2, "depth": 2}


# ----------------------------------------------------------------- the busiest rank decides
def _fake(name, rows):
    """A registry entry whose every rank sends ``rows[r]`` rows per feature each way (one
    message each way), whose estimate is the average rank's."""
    rows = np.asarray(rows, np.int64)
    msgs = np.ones_like(rows)
    mean = float(rows.mean())
    return Algorithm(name=name, axes=("row",), shape=row_axis, builder=build_1d,
                     cost=Cost(lambda s, d, v, l, r: LinearCounts((rows, rows), (msgs, msgs)),
                               lambda s, d, v: per_feature(mean, mean, 1, 1, mean),
                               candidates=lambda p: [(None, "-")]))


def test_ranking_follows_the_busiest_rank_not_the_mean(monkeypatch):
    """'skewed' moves less on average (3 rows per feature) but 12 on one rank; 'even' moves 5
    on every rank. The average-rank estimate prefers skewed, the per-rank model even."""
    monkeypatch.setitem(ALGORITHMS, "skewed", _fake("skewed", [0, 0, 0, 12]))
    monkeypatch.setitem(ALGORITHMS, "even", _fake("even", [5, 5, 5, 5]))
    s = even_structure(40, 4)
    kw = dict(n=40, m=int(s.rows.shape[0]), widths=[64, 64, 64, 8], world=4,
              machine=Machine(bandwidth=1e6), algos=("skewed", "even"))
    by_mean = rank_algorithms(**kw)
    by_max = rank_algorithms(structure=s, **kw)
    assert [r["algo"] for r in by_mean] == ["skewed", "even"]
    assert [r["algo"] for r in by_max] == ["even", "skewed"]
    even, skewed = by_max
    assert skewed["bytes"] > even["bytes"] > skewed["bytes_mean"]


def test_time_model_sums_the_busiest_ranks_compute_and_communication():
    s = even_structure(60, 6)
    m = Machine(bandwidth=1e8, latency=1e-4, spmm_rate=1e9, dense_rate=1e10,
                elementwise_rate=1e8, step_overhead=2e-3, layer_overhead=5e-4)
    got = predict(s, "1d", "gcn", WIDTHS, m)
    t = epoch_traffic(s, "1d", "gcn", WIDTHS)
    w = epoch_work(s, "1d", "gcn", WIDTHS)
    comm = (t["messages"] * 1e-4 + t["padded"] / 1e8).max()
    compute = (w["spmm_flops"] / 1e9 + w["dense_flops"] / 1e10
               + s.sizes * sum(WIDTHS) / 1e8).max()
    fixed = 2e-3 + 3 * 5e-4  # a step and three layers, on every rank
    assert got["fixed_s"] == pytest.approx(fixed)
    assert got["time_s"] == pytest.approx(comm + compute + fixed)
    # 1d: every rank multiplies the non-zeros of its own rows
    nnz = np.bincount(s.owner[s.rows], minlength=6)
    f_sum = sum(f * (2 if back else 1) for f, back in spmm_widths("gcn", WIDTHS))
    assert w["spmm_flops"].tolist() == (2.0 * nnz * f_sum).tolist()
    assert w["spmm_flops"].sum() == 2.0 * s.rows.shape[0] * f_sum


# ----------------------------------------------------------------- padded bytes
def test_padding_rules_from_sizes():
    """What comm.py pads, from the member sizes: all-gather (g−1)·(max − mine), reduce-scatter
    (g−1)·max − (total − mine); two groups of different sizes."""
    sizes = np.array([3, 5, 2, 4, 4])
    group = np.array([0, 0, 0, 1, 1])
    assert gather_padding(sizes, group).tolist() == [4, 0, 6, 0, 0]
    assert reduce_padding(sizes, group).tolist() == [2 * 5 - 7, 2 * 5 - 5, 2 * 5 - 8, 0, 0]


PAD_CASES = [("1d", "1d", None, 1, {}), ("1d-halo", "1d-halo", None, 1, {}),
             ("2d-2x2-bcast", "2d", (2, 2), 1, {"variant": "bcast"}),
             ("2d-2x2-halo", "2d", (2, 2), 1, {"variant": "halo"}),
             ("2d-4x1-bcast", "2d", (4, 1), 1, {"variant": "bcast"}),
             ("1.5d-c2-bcast", "1.5d", None, 2, {"variant": "bcast"}),
             ("1.5d-c2-halo", "1.5d", None, 2, {"variant": "halo"}),
             ("3d-2x1x2", "3d", (2, 1, 2), 1, {"layers": 3}),
             ("3d-1x2x2", "3d", (1, 2, 2), 1, {"layers": 3}),
             ("3d-1x1x4", "3d", (1, 1, 4), 1, {"layers": 3})]
PAD_N = 45


def padded_counts(rank, world, cases, n):
    """Rank body: this rank's logical and padded bytes and messages of one training step
    (forward, backward, gradient sum) of a 3-layer GCN, per case."""
    g = random_graph(n=n, f=6, classes=3, seed=5, directed=True)
    shard = build_shard(g, partition_graph(g, world, "random", seed=1), rank, norms=("gcn",))
    out = {}
    for label, algo, dims, replication, kw in cases:
        rt = DistRuntime(make_grid(algo, world, dims, replication), shard, algorithm(algo), "gcn", **kw)
        torch.manual_seed(0)
        model = GNN("gcn", 6, 7, 3, layers=3, dropout=0.0)
        rt.comm.reset()
        model(rt.op, rt.x).square().sum().backward()
        rt.sync_grads(list(model.parameters()))
        c = rt.comm
        out[label] = [sum(v for (_, ph), v in d.items() if ph in EPOCH_PHASES)
                      for d in (c.bytes, c.padded, c.messages)]
    return out


@pytest.fixture(scope="module")
def padded_measured():
    return spawn(padded_counts, 4, args=(PAD_CASES, PAD_N), timeout_s=240)


@pytest.mark.parametrize("case", PAD_CASES, ids=[c[0] for c in PAD_CASES])
def test_padded_bytes_are_what_the_collectives_move(padded_measured, case):
    label, algo, dims, replication, kw = case
    g = random_graph(n=PAD_N, f=6, classes=3, seed=5, directed=True)
    part = partition_graph(g, 4, "random", seed=1)
    s = Structure.from_graph(g, part.owner, 4)
    assert len(set(s.sizes.tolist())) > 1  # uneven blocks: padding is not zero
    model_dims = replication if algo == "1.5d" else dims
    want = epoch_traffic(s, algo, "gcn", WIDTHS, model_dims, kw.get("variant", "halo"),
                         kw.get("layers", 0))
    got = np.array([out[label] for out in padded_measured])
    assert got[:, 0].tolist() == want["bytes"].tolist(), "logical bytes"
    assert got[:, 2].tolist() == want["messages"].tolist(), "messages"
    assert got[:, 1].tolist() == want["padded"].tolist(), "padded bytes"
    if algo in ("1d", "3d") or kw.get("variant") == "bcast":
        assert (want["padded"] > want["bytes"]).any()  # the case tests some padding
