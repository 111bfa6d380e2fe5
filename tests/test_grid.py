"""2D/3D grid layouts: blocks tile Â exactly, ranks hold what the docstring says, permutation balances."""
import numpy as np
import pytest

from gnnpar.datasets import InputError
from gnnpar.datasets.normalize import union_structure, values_for
from gnnpar.partitioners import GridSpec, make_layout, partition_graph
from gnnpar.partitioners.grid import extract_block, nnz_balance, nnz_per_rank
from gnnpar.partitioners.shard_build import ShardBuilder

from .graphs import random_graph
from .test_partitioners import power_law_graph


def matrix(g, kind="gcn"):
    indptr, indices, raw = union_structure(g)
    return indptr, indices, {kind: values_for(kind, indptr, indices, raw)}


def block_entries(block, layout):
    """(global row, global col, value) triples of a block, keyed row*n+col."""
    n = layout.order.shape[0]
    rows = np.repeat(np.arange(block.shape[0]), np.diff(block.indptr)) + block.row_range[0]
    cols = np.asarray(block.indices) + block.col_range[0]
    return layout.order[rows] * n + layout.order[cols], np.asarray(block.values["gcn"])


def test_parse_and_refuse():
    assert GridSpec.parse("2x3").dims == (2, 3)
    assert GridSpec.parse("1x2x3").orientations == ("xy", "xz", "yx", "yz", "zx", "zy")
    assert GridSpec.parse("2x2").orientations == ("rc",)
    for bad in ("2", "2x", "ax2", "2x2x2x2", "0x4"):
        with pytest.raises(InputError):
            GridSpec.parse(bad)
    with pytest.raises(InputError, match="orientation"):
        GridSpec((2, 2), orientations=("xy",))


def test_grid_size_must_equal_parts():
    g = random_graph(n=40, seed=0)
    part = partition_graph(g, 4, "block")
    with pytest.raises(InputError, match="must be equal"):
        make_layout(g.num_nodes, GridSpec((2, 3)), part)


@pytest.mark.parametrize("dims", [(2, 3), (3, 1), (2, 2, 2), (1, 2, 3)])
@pytest.mark.parametrize("permute", [False, True])
def test_blocks_tile_the_matrix_exactly(dims, permute):
    g = random_graph(n=61, avg_deg=4, seed=2, directed=True)          # 61: no grid size divides it
    P = int(np.prod(dims))
    part = partition_graph(g, P, "metis" if P <= 8 else "block", seed=1)
    spec = GridSpec(dims, permute=permute, seed=4)
    layout = make_layout(g.num_nodes, spec, part)
    indptr, indices, values = matrix(g)
    n = g.num_nodes
    full_rows = np.repeat(np.arange(n), np.diff(indptr))
    want_keys = full_rows * n + indices
    want = dict(zip(want_keys.tolist(), values["gcn"].tolist()))
    pos = layout.positions()
    for name in spec.orientations:
        keys, vals = [], []
        for rank in range(P):
            rows, cols = layout.ranges(rank, name)
            block = extract_block(indptr, indices, values, layout, pos, rows, cols, name)
            assert np.all(np.diff(block.indptr) >= 0) and block.indptr[-1] == block.indices.size
            for r in range(block.shape[0]):                            # sorted columns per row
                assert np.all(np.diff(block.indices[block.indptr[r]:block.indptr[r + 1]]) > 0)
            k, v = block_entries(block, layout)
            keys.append(k)
            vals.append(v)
        keys, vals = np.concatenate(keys), np.concatenate(vals)
        assert keys.size == want_keys.size and np.unique(keys).size == keys.size   # each once
        assert all(want[k] == v for k, v in zip(keys.tolist(), vals.tolist()))       # bit-equal
        counts = nnz_per_rank(indptr, indices, layout, name)
        got = [extract_block(indptr, indices, values, layout, pos, *layout.ranges(r, name)).indices.size
               for r in range(P)]
        assert list(counts) == got


def test_3d_rank_holds_one_row_piece_of_its_block():
    spec = GridSpec((2, 3, 2))
    layout = make_layout(50, spec)
    (r0, r1), (c0, c1) = layout.ranges(spec.rank_of((1, 2, 1)), "xy")
    # x block 1 = rows [25, 50), split over z (2 pieces): piece 1 = [37, 50); y block 2 = [33, 50)
    assert (r0, r1, c0, c1) == (37, 50, 33, 50)
    (r0, r1), (c0, c1) = layout.ranges(spec.rank_of((1, 2, 1)), "zx")
    # z block 1 = [25, 50), split over y (3 pieces): piece 2 = [41, 50); x block 1 = [25, 50)
    assert (r0, r1, c0, c1) == (41, 50, 25, 50)


def test_unpermuted_bounds_follow_parts():
    g = random_graph(n=70, seed=1)
    part = partition_graph(g, 6, "metis", seed=0)
    layout = make_layout(g.num_nodes, GridSpec((2, 3)), part)
    assert np.array_equal(layout.order, part.perm)
    assert list(layout.bounds[0]) == [0, part.offsets[3], 70]
    assert list(layout.bounds[1]) == [0, part.offsets[2], part.offsets[4], 70]


def test_permutation_is_seeded():
    a = make_layout(100, GridSpec((2, 2), permute=True, seed=3))
    b = make_layout(100, GridSpec((2, 2), permute=True, seed=3))
    c = make_layout(100, GridSpec((2, 2), permute=True, seed=4))
    assert np.array_equal(a.order, b.order) and not np.array_equal(a.order, c.order)
    assert np.array_equal(np.sort(a.order), np.arange(100))


def test_random_permutation_balances_nonzeros_on_a_skewed_graph():
    g = power_law_graph(n=2000, m=12000, seed=1)
    indptr, indices, _ = union_structure(g)
    part = partition_graph(g, 16, "block")
    bal = nnz_balance(indptr, indices, g.num_nodes, GridSpec((4, 4)), part, seed=0)
    assert bal["before"]["max_over_mean"] > 3.0                       # hubs sit in block (0, 0)
    assert bal["after"]["max_over_mean"] < 1.5
    assert bal["before"]["mean"] == pytest.approx(indices.size / 16)


def test_builder_blocks_match_direct_extraction():
    g = random_graph(n=45, seed=5)
    part = partition_graph(g, 4, "random", seed=0)
    builder = ShardBuilder(g, part, norms=("gcn",), grid=(2, 2))
    indptr, indices, values = matrix(g)
    layout = builder.layout
    for rank in range(4):
        blk = builder.grid_blocks(rank)["rc"]
        ref = extract_block(indptr, indices, values, layout, layout.positions(), *layout.ranges(rank, "rc"))
        assert np.array_equal(blk.indptr, ref.indptr) and np.array_equal(blk.indices, ref.indices)
        assert np.array_equal(blk.values["gcn"], ref.values["gcn"])
