"""Non-zeros per rank of the 2D/3D kernels' blocks, computed on the whole graph for the quality
report (``partitioners/grid.py``): they follow the kernels' own rules (checked against the cost
model's per-rank counts here and against the built operators in ``tests/test_balance.py``), and
the balanced layout balances a skewed graph where blocks cut along the parts do not."""
import numpy as np
import pytest

from gnnpar.datasets import InputError
from gnnpar.datasets.normalize import union_structure
from gnnpar.kernels.blocks import Ownership
from gnnpar.kernels.cost_model import Structure
from gnnpar.kernels.spmm_3d import CubeCounts
from gnnpar.partitioners import GridSpec, balanced_owner, partition_graph
from gnnpar.partitioners.grid import nnz_balance, nnz_per_rank

from .graphs import random_graph
from .test_partitioners import power_law_graph


def test_parse_and_refuse():
    assert GridSpec.parse("2x3").dims == (2, 3) and GridSpec.parse("1x2x3").size == 6
    assert GridSpec.parse(" 2x2x2 ").text == "2x2x2"
    for bad in ("2", "2x", "ax2", "2x2x2x2", "0x4"):
        with pytest.raises(InputError):
            GridSpec.parse(bad)


def test_grid_size_must_equal_parts():
    g = random_graph(n=40, seed=0)
    indptr, indices, _ = union_structure(g)
    with pytest.raises(InputError, match="must be equal"):
        nnz_balance(indptr, indices, GridSpec((2, 3)), partition_graph(g, 4, "block"))


def test_balanced_owner_is_seeded_balanced_and_the_kernels_own():
    a, b, c = balanced_owner(101, 6, 3), balanced_owner(101, 6, 3), balanced_owner(101, 6, 4)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    sizes = np.bincount(a, minlength=6)
    assert sizes.sum() == 101 and sizes.max() - sizes.min() <= 1
    own = Ownership.permuted_over(101, 6, 3)                  # what the 2D/3D kernels use
    assert np.array_equal(own.owner, a) and own.permuted


@pytest.mark.parametrize("dims", [(2, 3), (3, 1), (1, 4), (2, 2, 2), (1, 2, 3), (3, 1, 2)])
@pytest.mark.parametrize("layout", ["parts", "balanced"])
def test_counts_follow_the_kernels_rules(dims, layout):
    g = random_graph(n=61, avg_deg=4, seed=2, directed=True)          # 61: no grid size divides it
    P = int(np.prod(dims))
    part = partition_graph(g, P, "metis", seed=1)
    owner = part.owner if layout == "parts" else balanced_owner(g.num_nodes, P, 5)
    indptr, indices, _ = union_structure(g)
    s = Structure.from_graph(g, owner, P)
    if len(dims) == 2:                     # rank (i, j): u's owner in row i, v's in column j
        ou, ov = s.owner[s.rows], s.owner[s.cols]
        want = [np.bincount((ou // dims[1]) * dims[1] + ov % dims[1], minlength=P)]
    else:                                  # the cost model's exact 3d counts, per orientation
        want = [o["nnz"] for o in CubeCounts(s, dims, 3, True).orients]
    for k, w in enumerate(want):
        got = nnz_per_rank(indptr, indices, owner, dims, k)
        assert got.tolist() == list(w) and got.sum() == indices.size


def test_balanced_layout_balances_nonzeros_on_a_skewed_graph():
    g = power_law_graph(n=2000, m=12000, seed=1)
    indptr, indices, _ = union_structure(g)
    # ~750 non-zeros per rank: one hub's row is a visible share of a 3D piece, hence 1.6
    for dims, limit in (((4, 4), 1.3), ((2, 2, 4), 1.6)):
        bal = nnz_balance(indptr, indices, GridSpec(dims), partition_graph(g, 16, "block"))
        assert bal["parts"]["max_over_mean"] > 3.0                  # hubs sit in low ids
        assert bal["balanced"]["max_over_mean"] < limit
        assert bal["parts"]["mean"] == pytest.approx(indices.size / 16)
