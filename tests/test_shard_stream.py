"""The streaming shard builder gives the reference builder's arrays bit for bit, on every kind of
graph a user can hand it (weighted in float32 or float64, directed, self loops, repeated and
unsorted columns, isolated vertices, empty parts), in one process and in several, and the disk
writer stores exactly those arrays."""
import dataclasses
import os

import numpy as np
import pytest

from gnnpar.datasets import Graph, InputError, split_masks
from gnnpar.partitioners import Partition, load_shard, partition_graph, write_shards
from gnnpar.partitioners.shard_build import ShardBuilder
from gnnpar.partitioners.csr_rows import is_canonical, is_symmetric_canonical, pattern_facts
from gnnpar.partitioners.shard_kernels import kernels

from .graphs import random_graph
from .shard_reference import reference_shards

FIELDS = ("global_ids", "indptr", "indices", "raw_weight", "orig_edge", "halo_ids",
          "recv_counts", "send_counts", "send_local", "x", "y", "train_mask", "val_mask",
          "test_mask")


def assert_same(got, want):
    for name in FIELDS:
        a, b = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
        assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
        assert a.shape == b.shape and np.array_equal(a, b), name
    assert list(got.values) == list(want.values)
    for kind in want.values:
        a, b = np.asarray(got.values[kind]), np.asarray(want.values[kind])
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), kind  # the same bits


def messy_graph(n=40, seed=3, float64=False):
    """Unsorted rows, repeated columns (weights to be summed), self loops (one twice), a negative
    zero-degree row, isolated vertices: what ``Graph`` accepts but loaders never produce."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 9, n)
    deg[[5, 17]] = 0
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    indices = rng.integers(0, n, indptr[-1]).astype(np.int64)
    indices[indptr[3]:indptr[3] + 2] = 3  # row 3 holds its loop twice
    w = rng.uniform(0.25, 3.0, indptr[-1]).astype(np.float64 if float64 else np.float32)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = rng.integers(0, 3, n).astype(np.int64)
    y[:3] = np.arange(3)
    return Graph(indptr, indices, x, y, *split_masks(n, rng), num_classes=3, edge_weight=w,
                 name="messy").validate()


GRAPHS = {
    "plain": lambda: random_graph(n=60, avg_deg=5, seed=1),
    "weighted": lambda: random_graph(n=50, avg_deg=4, seed=2, weighted=True),
    "loops": lambda: random_graph(n=40, avg_deg=4, seed=3, self_loops=True),
    "directed-loops": lambda: random_graph(n=45, avg_deg=3, seed=4, directed=True,
                                           self_loops=True),
    "messy": lambda: messy_graph(),
    "messy-f64": lambda: messy_graph(seed=5, float64=True),
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("parts,method", [(1, "block"), (3, "random"), (4, "metis"),
                                          (6, "block")])
def test_same_arrays_as_reference(name, parts, method):
    g = GRAPHS[name]()
    part = partition_graph(g, parts, method, seed=1)
    norms = ("gcn", "mean", "sum")
    builder = ShardBuilder(g, part, norms)
    for rank, want in enumerate(reference_shards(g, part, norms)):
        assert_same(builder.build(rank), want)


def test_empty_parts_and_uneven_blocks():
    g = random_graph(n=7, avg_deg=2, seed=6)
    part = Partition.from_owner(np.array([0, 0, 0, 0, 0, 2, 2]), 5, method="given")
    builder = ShardBuilder(g, part)
    for rank, want in enumerate(reference_shards(g, part)):
        assert_same(builder.build(rank), want)


def test_forked_jobs_give_the_same_halos():
    g = random_graph(n=80, avg_deg=6, seed=7, weighted=True)
    part = partition_graph(g, 5, "random", seed=2)
    one, three = ShardBuilder(g, part, jobs=1), ShardBuilder(g, part, jobs=3)
    for rank in range(5):
        assert_same(three.build(rank), one.build(rank))
    for rank in (3, 0, 3):  # the reused scratch gives a part's halo again, in any order
        assert np.array_equal(one.halo_of(rank)[0], one.halo_ids[rank])


def test_negative_weight_refused_like_values_for():
    g = random_graph(n=30, avg_deg=3, seed=8, weighted=True)
    w = np.asarray(g.edge_weight).copy()
    w[4] = -0.5
    g = dataclasses.replace(g, edge_weight=w)
    part = partition_graph(g, 2, "block")
    with pytest.raises(InputError, match=r"the gcn normalisation needs edge weights >= 0.*"
                                         r"1 edge\(s\) have a negative weight"):
        ShardBuilder(g, part, ("gcn",))
    ShardBuilder(g, part, ("sum",))  # sum aggregation takes any weight


@pytest.mark.parametrize("jobs", [1, 2])
def test_written_shards_equal_reference(tmp_path, jobs):
    g = messy_graph(n=70, seed=9)
    part = partition_graph(g, 3, "random", seed=4)
    out = tmp_path / "shards"
    write_shards(g, part, str(out), norms=("gcn", "mean"), jobs=jobs, row_block=16)
    for rank, want in enumerate(reference_shards(g, part)):
        got = load_shard(str(out), rank, mmap=False)
        assert_same(got, want)


def test_report_from_the_passes_equals_report_from_s():
    from gnnpar.partitioners import report
    g = messy_graph(n=60, seed=11)
    part = partition_graph(g, 4, "random", seed=3)
    counts = ShardBuilder(g, part).quality_counts()
    assert report(g, part, counts=counts) == report(g, part)


@pytest.mark.parametrize("jobs", [1, 2])
def test_halos_made_by_the_writers_part_tasks(tmp_path, jobs):
    """gnnpar-partition's way: the writer's part tasks make the halos; the builder then holds
    the same halos and quality counts as one that made them up front."""
    from gnnpar.partitioners import report
    g = messy_graph(n=60, seed=12)
    part = partition_graph(g, 5, "random", seed=2)
    later = ShardBuilder(g, part, jobs=jobs, halos=False)
    with pytest.raises(ValueError, match="halos=False"):
        later.quality_counts()
    write_shards(g, part, str(tmp_path / "s"), builder=later)
    early = ShardBuilder(g, part)
    for a, b in zip(later.halo_ids, early.halo_ids):
        assert np.array_equal(a, b)
    assert report(g, part, counts=later.quality_counts()) == report(g, part)
    for rank, want in enumerate(reference_shards(g, part)):
        assert_same(load_shard(str(tmp_path / "s"), rank, mmap=False), want)


def _parhip64(path, indptr, indices, vweights):
    """KaMinPar's 64-bit ParHiP layout (every field 8 bytes): the reference for the 32-bit one."""
    n, m = indptr.shape[0] - 1, indices.shape[0]
    version = 1 | (0 if vweights is not None else 2)
    with open(path, "wb") as f:
        f.write(np.array([version, n, m], "<u8").tobytes())
        f.write((24 + 8 * (n + 1) + 8 * np.asarray(indptr, np.int64)).astype("<u8").tobytes())
        f.write(np.asarray(indices).astype("<u8").tobytes())
        if vweights is not None:
            f.write(np.asarray(vweights).astype("<i8").tobytes())


@pytest.mark.parametrize("balance", ["edges", "nodes"])
def test_kaminpar_reads_the_32_bit_file_as_the_64_bit_one(tmp_path, balance):
    kaminpar = pytest.importorskip("kaminpar")
    from gnnpar.partitioners.kaminpar_part import write_parhip
    from gnnpar.partitioners.metis import undirected_structure, vertex_weights
    g = random_graph(n=400, avg_deg=6, seed=12)
    indptr, indices = undirected_structure(g)
    vw = vertex_weights(indptr, balance)
    owners = []
    for name, writer in (("32", write_parhip), ("64", _parhip64)):
        path = str(tmp_path / f"g{name}.parhip")
        writer(path, indptr, indices, vw)
        kg = kaminpar.load_graph(path, kaminpar.GraphFileFormat.PARHIP)
        kaminpar.reseed(5)
        solver = kaminpar.KaMinPar(1, kaminpar.default_context())
        owners.append(np.asarray(solver.compute_partition(kg, 4, 0.03)))
    assert owners[0].size == g.num_nodes and np.array_equal(owners[0], owners[1])
    assert os.path.getsize(tmp_path / "g32.parhip") < os.path.getsize(tmp_path / "g64.parhip")


def test_symmetry_check_without_a_transpose():
    from gnnpar.partitioners.csr_rows import is_symmetric_canonical
    import scipy.sparse as sp
    for directed in (False, True):
        for seed in range(3):
            g = random_graph(n=120, avg_deg=4, seed=seed, directed=directed, self_loops=True)
            a = sp.csr_matrix((np.ones(g.num_edges), g.indices, g.indptr), shape=(120, 120))
            want = (a != a.T).nnz == 0
            assert is_symmetric_canonical(np.asarray(g.indptr), np.asarray(g.indices)) == want
    # a directed cycle: every in-degree equals the out-degree, yet no edge has its mirror
    n = 5
    indptr, indices = np.arange(n + 1), (np.arange(n) + 1) % n
    assert not is_symmetric_canonical(indptr, indices)
    assert is_symmetric_canonical(np.arange(n + 1), np.arange(n))  # loops only


@pytest.mark.parametrize("name", ["plain", "loops", "directed-loops"])
def test_unit_weight_degree_pass_equals_the_general_one(name):
    """Canonical graphs without weights take degree_pass_unit: same sums, bit for bit."""
    g = GRAPHS[name]()
    indptr, indices = np.asarray(g.indptr), np.asarray(g.indices)
    assert g.edge_weight is None and is_canonical(indptr, indices)
    n = g.num_nodes
    unit = [np.zeros(n) for _ in range(3)]
    general = [np.zeros(n) for _ in range(3)]
    k = kernels()
    m = int(np.diff(indptr).max()) + 1
    scratch = (np.empty(m, np.int64), np.empty(m), np.empty(m, np.int64), np.empty(m))
    nnz = k.degree_pass(indptr, indices, np.zeros(1), False, True, scratch, *general,
                        np.zeros((2, 4)))
    symmetric = is_symmetric_canonical(indptr, indices)
    assert symmetric == (name != "directed-loops")  # both branches of the unit pass are taken
    assert pattern_facts(g, symmetric=True) == {"canonical": True, "symmetric": symmetric}
    nnz_unit = k.degree_pass_unit(indptr, indices, symmetric, *unit)
    assert nnz_unit == nnz
    for a, b in zip(unit, general):
        np.testing.assert_array_equal(a.view(np.int64), b.view(np.int64))


@pytest.mark.parametrize("parts", [1, 3, 7, 70])
def test_halos_of_a_symmetric_graph_from_one_pass_equal_the_per_part_pass(parts):
    """The part-bits pass (canonical, symmetric pattern) gives each part's halo, receive
    counts, cut and non-zeros as the per-part pass does; 70 parts take two words a vertex,
    and several parts are empty."""
    g = random_graph(n=150, avg_deg=5, seed=13, self_loops=True)
    owner = np.random.default_rng(parts).integers(0, max(1, parts - 2), g.num_nodes)
    part = Partition.from_owner(owner, parts, method="given")
    assert pattern_facts(g, symmetric=True)["symmetric"]
    fast = ShardBuilder(g, part, halos=False)
    assert fast.halo_ids is not None  # made up front by the one pass
    for rank in range(parts):
        halo, recv, cut, nnz = fast.halo_of(rank)
        assert np.array_equal(fast.halo_ids[rank], halo)
        assert np.array_equal(fast.recv_counts[rank], recv)
        assert (fast.cut[rank], fast.part_nnz[rank]) == (cut, nnz)
    for rank, want in enumerate(reference_shards(g, part)):
        assert_same(fast.build(rank), want)


def test_pattern_facts_are_made_once_per_graph_and_again_for_new_arrays(monkeypatch):
    from gnnpar.partitioners import csr_rows
    g = random_graph(n=60, avg_deg=4, seed=1)
    calls = []
    real = csr_rows.is_symmetric_canonical
    monkeypatch.setattr(csr_rows, "is_symmetric_canonical", lambda *a: calls.append(1) or real(*a))
    assert pattern_facts(g) == {"canonical": True, "symmetric": None}
    assert pattern_facts(g, symmetric=True)["symmetric"] and pattern_facts(g, symmetric=True)["symmetric"]
    assert len(calls) == 1
    src, dst = g.edges()  # one edge dropped: no longer symmetric
    keep = np.ones(src.size, bool)
    keep[np.flatnonzero(src != dst)[0]] = False
    g2 = g._with_edges(src[keep], dst[keep], None)
    g.indptr, g.indices = g2.indptr, g2.indices
    assert pattern_facts(g, symmetric=True) == {"canonical": True, "symmetric": False}
