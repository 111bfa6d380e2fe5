"""The Graph container: CSR construction, structural steps, validation, fingerprint, splits."""
from dataclasses import replace

import numpy as np
import pytest

from gnnpar.datasets import Graph, InputError, split_masks


def small_graph(weighted=False):
    """4 nodes; directed edges src -> dst: 0->1, 1->2, 2->0, 3->3 (a self loop), 0->1 again."""
    src = np.array([0, 1, 2, 3, 0])
    dst = np.array([1, 2, 0, 3, 1])
    w = np.array([1.0, 2.0, 3.0, 4.0, 0.5], np.float32) if weighted else None
    indptr, indices, w = Graph.csr_from_edges(src, dst, 4, w)
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    y = np.array([0, 1, 0, 1])
    masks = [np.array(m) for m in ([1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1])]
    return Graph(indptr, indices, x, y, *(m.astype(bool) for m in masks), num_classes=2, edge_weight=w)


def edge_set(g):
    src, dst = g.edges()
    return sorted(zip(src.tolist(), dst.tolist()))


def test_csr_rows_are_targets_sorted_and_deduplicated():
    g = small_graph()
    # row = dst: row 0 holds 2 (2->0), row 1 holds 0 (0->1 twice, merged), row 2 holds 1, row 3 holds 3
    assert g.indptr.tolist() == [0, 1, 2, 3, 4]
    assert g.indices.tolist() == [2, 0, 1, 3]
    assert g.indptr.dtype == np.int64 and g.indices.dtype == np.int64
    assert g.degrees().tolist() == [1, 1, 1, 1]
    assert edge_set(g) == [(0, 1), (1, 2), (2, 0), (3, 3)]


def test_csr_duplicate_weights_are_summed():
    g = small_graph(weighted=True)
    assert g.edge_weight.dtype == np.float32
    assert g.edge_weight.tolist() == [3.0, 1.5, 2.0, 4.0]  # 0->1 twice: 1.0 + 0.5


def test_csr_columns_sorted_within_row():
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 30, 400), rng.integers(0, 30, 400)
    indptr, indices, _ = Graph.csr_from_edges(src, dst, 30)
    for r in range(30):
        row = indices[indptr[r]:indptr[r + 1]]
        assert np.all(np.diff(row) > 0)
    assert set(zip(indices.tolist(), np.repeat(np.arange(30), np.diff(indptr)).tolist())) == set(
        zip(src.tolist(), dst.tolist()))


@pytest.mark.parametrize("src,dst,msg", [([0, 4], [1, 1], "endpoint 4 is out of range [0, 4)"),
                                         ([0, 1], [-1, 1], "endpoint -1 is out of range")])
def test_csr_rejects_out_of_range_ids(src, dst, msg):
    with pytest.raises(InputError, match=msg.replace("[", r"\[").replace(")", r"\)")):
        Graph.csr_from_edges(np.array(src), np.array(dst), 4)


def test_csr_rejects_negative_node_count():
    with pytest.raises(InputError, match="num_nodes must be >= 0"):
        Graph.csr_from_edges(np.zeros(0, int), np.zeros(0, int), -1)


def test_symmetrize_and_is_symmetric():
    g = small_graph()
    assert not g.is_symmetric()
    s = g.symmetrize()
    assert s.is_symmetric()
    assert edge_set(s) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1), (3, 3)]


def test_symmetrize_weighted_keeps_larger_weight_each_way():
    src, dst = np.array([0, 1]), np.array([1, 0])
    indptr, indices, w = Graph.csr_from_edges(src, dst, 3, np.array([2.0, 5.0], np.float32))
    g = replace(small_graph(), indptr=indptr, indices=indices, edge_weight=w,
                x=np.zeros((3, 2), np.float32), y=np.zeros(3, np.int64),
                train_mask=np.array([1, 0, 0], bool), val_mask=np.array([0, 1, 0], bool),
                test_mask=np.array([0, 0, 1], bool))
    s = g.symmetrize()
    assert edge_set(s) == [(0, 1), (1, 0)]
    assert s.edge_weight.tolist() == [5.0, 5.0]


def test_self_loop_steps():
    g = small_graph()
    no = g.remove_self_loops()
    assert (3, 3) not in edge_set(no) and no.num_edges == 3
    with_loops = g.add_self_loops()
    assert [(i, i) in edge_set(with_loops) for i in range(4)] == [True] * 4
    assert with_loops.num_edges == 3 + 4  # the existing loop at 3 is not doubled


def test_add_self_loops_weighted_keeps_existing_weight():
    g = small_graph(weighted=True).add_self_loops(fill=9.0)
    src, dst = g.edges()
    loops = {int(s): float(w) for s, d, w in zip(src, dst, g.edge_weight) if s == d}
    assert loops == {0: 9.0, 1: 9.0, 2: 9.0, 3: 4.0}


def test_to_scipy_matches_edges():
    g = small_graph(weighted=True)
    dense = g.to_scipy().toarray()
    expect = np.zeros((4, 4), np.float32)
    for (s, d), w in zip(zip(*g.edges()), g.edge_weight):
        expect[d, s] = w
    np.testing.assert_array_equal(dense, expect)


def test_validate_accepts_good_graph():
    assert small_graph().validate().num_nodes == 4


@pytest.mark.parametrize("change,msg", [
    (dict(indptr=np.array([0, 1, 2, 3, 5])), "end at the edge count 4"),
    (dict(indptr=np.array([0, 2, 1, 3, 4])), "non-decreasing"),
    (dict(indices=np.array([2, 0, 1, 7])), "endpoint 7 is out of range"),
    (dict(indices=np.array([2.0, 0, 1, 3])), "integer arrays"),
    (dict(edge_weight=np.ones(3, np.float32)), "edge_weight must have shape"),
    (dict(edge_weight=np.array([1, np.nan, 1, 1], np.float32)), "edge_weight contains NaN"),
    (dict(x=np.zeros((3, 2), np.float32)), "x must have shape"),
    (dict(x=np.zeros((4, 2), np.int64)), "x must be a float array"),
    (dict(x=np.array([[0, 0], [0, np.inf], [0, 0], [np.nan, 0]], np.float32)), "2 row\\(s\\), first at node 1"),
    (dict(y=np.array([0, 1, 0])), "y must have shape"),
    (dict(y=np.array([0, 1, 0, 2])), "label 2 is outside"),
    (dict(y=np.array([0, -1, 0, 1])), "label -1 is outside"),
    (dict(y=np.array([0.0, 1, 0, 1])), "y must be an integer array"),
    (dict(num_classes=0), "num_classes must be >= 1"),
    (dict(train_mask=np.zeros(4, bool)), "train_mask selects no node"),
    (dict(val_mask=np.ones(4, np.int64)), "val_mask must be boolean"),
    (dict(test_mask=np.ones(3, bool)), "test_mask must have shape"),
])
def test_validate_names_the_problem(change, msg):
    with pytest.raises(InputError, match=msg):
        replace(small_graph(), **change).validate()


def test_fingerprint_is_stable_and_sensitive():
    a, b = small_graph(), small_graph()
    assert a.fingerprint() == b.fingerprint() and len(a.fingerprint()) == 16
    flipped = replace(a, test_mask=np.array([0, 0, 1, 1], bool))
    assert flipped.fingerprint() != a.fingerprint()
    assert replace(a, num_classes=3).fingerprint() != a.fingerprint()
    assert small_graph(weighted=True).fingerprint() != a.fingerprint()


@pytest.mark.parametrize("n", [3, 4, 5, 10, 1001])
def test_split_masks_disjoint_cover_nonempty(n):
    tr, va, te = split_masks(n, np.random.default_rng(0))
    total = tr.astype(int) + va + te
    assert np.all(total == 1)
    assert tr.any() and va.any() and te.any()
    if n >= 100:
        assert abs(tr.sum() - 0.6 * n) <= 1 and abs(va.sum() - 0.2 * n) <= 1


def test_split_masks_extreme_fractions_keep_every_part():
    tr, va, te = split_masks(10, np.random.default_rng(0), train=0.95, val=0.04)
    assert (tr.sum(), va.sum(), te.sum()) == (8, 1, 1)


@pytest.mark.parametrize("n,kw,msg", [(2, {}, "at least 3 nodes"),
                                      (10, dict(train=0.8, val=0.3), "train \\+ val < 1"),
                                      (10, dict(train=0.0), "0 < train")])
def test_split_masks_rejects_bad_arguments(n, kw, msg):
    with pytest.raises(InputError, match=msg):
        split_masks(n, np.random.default_rng(0), **kw)


def test_summary_mentions_sizes():
    assert small_graph().summary() == "graph: n=4 m=4 f=2 classes=2 train/val/test=2/1/1"
