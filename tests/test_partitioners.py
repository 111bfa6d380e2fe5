"""Vertex partitioners and the quality report (pure numpy/scipy, no process group)."""
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from gnnpar.datasets import Graph, InputError, split_masks
from gnnpar.datasets.normalize import union_structure
from gnnpar.partitioners import METHODS, Partition, halo_counts, partition_graph, report
from gnnpar.partitioners.block import row_work, weighted_cuts
from gnnpar.partitioners.csr_rows import is_canonical, is_symmetric_canonical
from gnnpar.partitioners.metis import undirected_structure, vertex_weights
from gnnpar.partitioners.random_part import hash_owner

from .graphs import random_graph

try:
    import kaminpar  # noqa: F401
    HAVE_KAMINPAR = True
except ImportError:
    HAVE_KAMINPAR = False

AVAILABLE = [m for m in METHODS if m != "kaminpar" or HAVE_KAMINPAR]


def graph_from_edges(src, dst, n, seed=0, f=4, classes=3):
    rng = np.random.default_rng(seed)
    indptr, indices, _ = Graph.csr_from_edges(np.r_[src, dst], np.r_[dst, src], n)
    x = rng.normal(size=(n, f)).astype(np.float32)
    y = rng.integers(0, classes, n).astype(np.int64)
    y[:classes] = np.arange(classes)
    return Graph(indptr, indices, x, y, *split_masks(n, rng), num_classes=classes).validate()


def sbm_graph(n=800, blocks=4, deg_in=8.0, deg_out=0.3, seed=0):
    """Planted blocks of consecutive-looking but shuffled ids (so block order is not the answer)."""
    rng = np.random.default_rng(seed)
    label = rng.permutation(np.arange(n) % blocks)
    members = [np.nonzero(label == b)[0] for b in range(blocks)]
    m_in, m_out = int(n * deg_in / 2), int(n * deg_out / 2)
    b = rng.integers(0, blocks, m_in)
    src = np.array([rng.choice(members[k]) for k in b])
    dst = np.array([rng.choice(members[k]) for k in b])
    s2, d2 = rng.integers(0, n, m_out), rng.integers(0, n, m_out)
    src, dst = np.r_[src, s2], np.r_[dst, d2]
    keep = src != dst
    return graph_from_edges(src[keep], dst[keep], n, seed)


def power_law_graph(n=600, m=3000, seed=0):
    """Chung-Lu style: vertex i has weight ~ (i+1)^-0.8, so low ids are hubs."""
    rng = np.random.default_rng(seed)
    p = (np.arange(n) + 1.0) ** -0.8
    p /= p.sum()
    src, dst = rng.choice(n, m, p=p), rng.choice(n, m, p=p)
    keep = src != dst
    return graph_from_edges(src[keep], dst[keep], n, seed)


def isolated_graph(n=97, seed=0):
    """Edges only among the first half; the rest are isolated vertices."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n // 2, 150), rng.integers(0, n // 2, 150)
    keep = src != dst
    return graph_from_edges(src[keep], dst[keep], n, seed)


def check_valid(part: Partition, n: int, parts: int):
    assert part.num_parts == parts and part.num_nodes == n
    assert np.array_equal(np.sort(part.perm), np.arange(n))           # every vertex exactly once
    assert int(part.sizes.sum()) == n
    assert np.array_equal(np.bincount(part.owner, minlength=parts), part.sizes)
    for r in range(parts):
        ids = part.vertices(r)
        assert np.all(part.owner[ids] == r)
        assert np.all(np.diff(ids) > 0)                               # ascending inside a part
    part.validate(n)


# ------------------------------------------------------------------ validity, odd sizes
@pytest.mark.parametrize("method", AVAILABLE)
@pytest.mark.parametrize("balance", ["nodes", "edges"])
@pytest.mark.parametrize("parts", [1, 3, 7])
def test_every_method_gives_a_valid_partition(method, balance, parts):
    g = random_graph(n=157, avg_deg=4, seed=1)                        # 157 % 3, 157 % 7 != 0
    part = partition_graph(g, parts, method, seed=5, balance=balance)
    check_valid(part, g.num_nodes, parts)
    assert part.method == method


@pytest.mark.parametrize("method", AVAILABLE)
def test_isolated_vertices_are_owned(method):
    g = isolated_graph()
    part = partition_graph(g, 4, method, seed=0)
    check_valid(part, g.num_nodes, 4)
    assert np.all(part.sizes > 0)


@pytest.mark.parametrize("method", ["block", "random"])
def test_more_parts_than_vertices_leaves_empty_parts(method):
    g = random_graph(n=5, avg_deg=2, seed=0)
    part = partition_graph(g, 9, method, seed=1)
    check_valid(part, 5, 9)
    assert np.count_nonzero(part.sizes == 0) >= 4


@pytest.mark.parametrize("method", [m for m in ("metis", "kaminpar") if m in AVAILABLE])
def test_graph_partitioners_refuse_more_parts_than_vertices(method):
    g = random_graph(n=5, avg_deg=2, seed=0)
    with pytest.raises(InputError, match="cannot split 5 vertices into 9 parts"):
        partition_graph(g, 9, method)


@pytest.mark.parametrize("bad", [dict(parts=0), dict(parts=2, method="spectral"),
                                 dict(parts=2, balance="bytes"), dict(parts=2, imbalance=0.0),
                                 dict(parts=2, imbalance=1.5)])
def test_bad_arguments_are_input_errors(bad):
    g = random_graph(n=30, seed=0)
    kw = {"method": "metis", **bad}
    with pytest.raises(InputError):
        partition_graph(g, **kw)


def test_kaminpar_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "kaminpar", None)                # import now raises
    with pytest.raises(InputError, match=r"pip install gnnpar\[kaminpar\]"):
        partition_graph(random_graph(n=30, seed=0), 2, "kaminpar")


# ------------------------------------------------------------------ balance promises
def test_block_nodes_sizes_differ_by_at_most_one():
    part = partition_graph(random_graph(n=101, seed=0), 7, "block")
    assert part.sizes.max() - part.sizes.min() <= 1
    assert np.array_equal(part.perm, np.arange(101))                  # block keeps id order


def test_block_edges_bound():
    g = power_law_graph()
    w = row_work(g)
    indptr, _, _ = union_structure(g)
    assert np.array_equal(w, np.diff(indptr))                         # row_work = row nnz of A'+I
    for parts in (2, 5, 16):
        part = partition_graph(g, parts, "block", balance="edges")
        loads = np.bincount(part.owner, weights=w, minlength=parts)
        assert loads.max() <= w.sum() / parts + w.max()
        nodes_part = partition_graph(g, parts, "block", balance="nodes")
        nodes_loads = np.bincount(nodes_part.owner, weights=w, minlength=parts)
        assert loads.max() < nodes_loads.max()                        # hubs at low ids: edges helps


def test_weighted_cuts_handles_zero_weight_and_more_parts():
    cuts = weighted_cuts(np.array([5, 0, 0, 5], np.int64), 2)
    assert list(cuts) in ([0, 1, 4], [0, 2, 4], [0, 3, 4])
    cuts = weighted_cuts(np.ones(3, np.int64), 5)
    assert cuts[0] == 0 and cuts[-1] == 3 and np.all(np.diff(cuts) >= 0)


@pytest.mark.parametrize("method", [m for m in ("metis", "kaminpar") if m in AVAILABLE])
@pytest.mark.parametrize("balance", ["nodes", "edges"])
def test_graph_partitioners_meet_their_tolerance(method, balance):
    g = power_law_graph(n=1200, m=6000, seed=2)
    indptr, _ = undirected_structure(g)
    vw = vertex_weights(indptr, balance)
    vw = np.ones(g.num_nodes) if vw is None else vw
    for parts in (4, 8):
        part = partition_graph(g, parts, method, seed=0, balance=balance, imbalance=0.05)
        loads = np.bincount(part.owner, weights=vw, minlength=parts)
        assert loads.max() <= 1.05 * vw.sum() / parts + vw.max()


def test_random_sizes_are_binomial():
    g = random_graph(n=4000, avg_deg=2, seed=0)
    part = partition_graph(g, 8, "random", seed=3)
    mean = 4000 / 8
    assert np.all(np.abs(part.sizes - mean) < 5 * np.sqrt(mean))


def test_metis_edge_balance_beats_node_balance_on_hubs():
    g = power_law_graph(n=1500, m=9000, seed=4)
    rep_nodes = report(g, partition_graph(g, 8, "metis", balance="nodes"))
    rep_edges = report(g, partition_graph(g, 8, "metis", balance="edges"))
    assert rep_edges["edge_balance"] < rep_nodes["edge_balance"]
    assert rep_edges["edge_balance"] < 2 * 1.03 + 0.1
    assert rep_edges["vertex_balance"] < 2 * 1.03 + 0.1


# ------------------------------------------------------------------ METIS input
def scipy_undirected(g: Graph):
    a = sp.csr_matrix((np.ones(g.num_edges), g.indices, g.indptr), shape=(g.num_nodes,) * 2)
    s = (a + a.T).tocsr()
    s.setdiag(0)
    s.eliminate_zeros()
    s.sort_indices()
    return s.indptr, s.indices


@pytest.mark.parametrize("case", ["symmetric", "directed", "loops", "unsorted"])
def test_undirected_structure_matches_scipy(case):
    g = random_graph(n=120, avg_deg=4, seed=6, directed=case == "directed", self_loops=case == "loops")
    if case == "unsorted":                                  # reverse each row: not canonical
        idx = g.indices.copy()
        for r in range(g.num_nodes):
            idx[g.indptr[r]:g.indptr[r + 1]] = idx[g.indptr[r]:g.indptr[r + 1]][::-1]
        g = Graph(g.indptr, idx, g.x, g.y, g.train_mask, g.val_mask, g.test_mask, g.num_classes)
    indptr, indices = undirected_structure(g)
    ref_indptr, ref_indices = scipy_undirected(g)
    assert np.array_equal(indptr, ref_indptr) and np.array_equal(indices, ref_indices)
    if case == "symmetric":                                 # used as it is, no copy
        assert indices is g.indices or np.shares_memory(indices, g.indices)


def test_canonical_and_symmetry_checks():
    indptr = np.array([0, 2, 4, 4, 6])                      # row 2 empty
    assert is_canonical(indptr, np.array([1, 3, 0, 3, 0, 1]))
    assert not is_canonical(indptr, np.array([3, 1, 0, 3, 0, 1]))
    assert not is_canonical(indptr, np.array([1, 1, 0, 3, 0, 1]))
    assert is_symmetric_canonical(indptr, np.array([1, 3, 0, 3, 0, 1]))
    assert not is_symmetric_canonical(indptr, np.array([1, 3, 0, 3, 0, 2]))


# ------------------------------------------------------------------ determinism
@pytest.mark.parametrize("method", AVAILABLE)
def test_deterministic_per_seed(method):
    g = sbm_graph(n=400, seed=1)
    a = partition_graph(g, 4, method, seed=7)
    b = partition_graph(g, 4, method, seed=7)
    assert np.array_equal(a.owner, b.owner) and np.array_equal(a.perm, b.perm)


def test_seed_changes_random_and_metis():
    g = random_graph(n=500, avg_deg=6, seed=0)
    for method in ("random", "metis"):
        a = partition_graph(g, 4, method, seed=1)
        b = partition_graph(g, 4, method, seed=2)
        assert not np.array_equal(a.owner, b.owner), method


def test_random_owner_is_a_pure_function_of_the_id():
    owner = partition_graph(random_graph(n=300, seed=0), 6, "random", seed=9).owner
    ids = np.array([299, 0, 17, 150])
    assert np.array_equal(hash_owner(ids, 6, seed=9), owner[ids])


def test_from_owner_rejects_bad_values():
    with pytest.raises(InputError, match="outside"):
        Partition.from_owner(np.array([0, 3, 1]), 3)
    part = Partition.from_owner(np.array([1, 0, 1, 0]), 2)
    assert list(part.perm) == [1, 3, 0, 2] and list(part.offsets) == [0, 2, 4]
    broken = Partition(part.owner, np.array([1, 1, 0, 2]), part.offsets, part.sizes)
    with pytest.raises(InputError, match="exactly once"):
        broken.validate()


# ------------------------------------------------------------------ quality
def direct_halo(g: Graph, owner: np.ndarray, parts: int) -> list:
    """Distinct remote columns of each part's rows, straight from scipy."""
    indptr, indices, _ = union_structure(g)
    s = sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(g.num_nodes,) * 2)
    out = []
    for r in range(parts):
        cols = np.unique(s[np.nonzero(owner == r)[0]].indices)
        out.append(int(np.count_nonzero(owner[cols] != r)))
    return out


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("method", ["block", "random", "metis"])
def test_halo_counts_match_scipy(method, directed):
    g = random_graph(n=211, avg_deg=3, seed=3, directed=directed)
    part = partition_graph(g, 5, method, seed=2)
    indptr, indices, _ = union_structure(g)
    assert list(halo_counts(indptr, indices, part.owner, 5)) == direct_halo(g, part.owner, 5)


def test_report_figures():
    g = sbm_graph(n=600, blocks=4, seed=2)
    part = partition_graph(g, 4, "metis", seed=0)
    rep = report(g, part, feat_width=16)
    s = g.to_scipy().tocoo()
    off = s.row != s.col
    cut = int(np.count_nonzero(part.owner[s.row[off]] != part.owner[s.col[off]]))
    assert rep["edge_cut"] == cut
    assert rep["edge_cut_fraction"] == pytest.approx(cut / np.count_nonzero(off))
    assert rep["halo"] == direct_halo(g, part.owner, 4)
    assert rep["halo_total"] == sum(rep["halo"]) and rep["halo_max"] == max(rep["halo"])
    assert rep["bytes_allgather"] == 3 * 600 * 16 * 4
    assert rep["bytes_halo"] == rep["halo_total"] * 16 * 4
    assert rep["vertex_balance"] == pytest.approx(part.sizes.max() / 150)


def test_metis_beats_random_on_planted_blocks():
    g = sbm_graph(n=800, blocks=4, seed=0)
    metis = report(g, partition_graph(g, 4, "metis", seed=0))
    rand = report(g, partition_graph(g, 4, "random", seed=0))
    assert metis["halo_total"] < 0.3 * rand["halo_total"]
    assert metis["edge_cut_fraction"] < 0.15


def test_partitioners_never_import_torch_distributed():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys, gnnpar.partitioners as gp, gnnpar.partitioners.shards, gnnpar.partitioners.grid; "
            "print('torch.distributed' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": root}, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
