"""Cost model without any process group: estimates agree with exact counts where both are
exact, planning works at papers100M scale, and configuration errors are InputErrors."""
import numpy as np
import pytest

from gnnpar.datasets import InputError
from gnnpar.kernels.build import grid_shape
from gnnpar.kernels.comm import Comm
from gnnpar.kernels.cost_model import (ALGOS, Structure, epoch_traffic, estimate_traffic,
                                       param_count, rank_algorithms, spmm_widths)
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.kernels.spmm_4d import build_4d_ops

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
    assert {r["algo"] for r in rows} == set(ALGOS) - {"4d"}
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
        grid_shape("1.5d", 6, replication=4)
    with pytest.raises(InputError, match="2d needs"):
        grid_shape("2d", 6, (1, 2, 3))
    assert grid_shape("1.5d", 8, replication=2) == {"row": 4, "replica": 2}
    assert grid_shape("4d", 8, (2, 2, 2)) == {"data": 1, "row": 2, "col": 2, "depth": 2}
