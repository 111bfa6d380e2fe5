"""Samplers, blocks, seeds and the macrobatch service on one process (no process group).

Everything is checked against the graph itself: the propagation matrix Â of
``gnnpar.datasets.normalize`` and its rows, not against numbers written down here.
"""
import numpy as np
import pytest
import torch

from gnnpar.datasets.normalize import propagation_matrix
from gnnpar.nn.models import GNN
from gnnpar.sampling import (BulkSampler, EpochPlan, FeatureStore, MacrobatchService,
                             NeighborSampler, SamplerConfig, SamplingStats, ServiceConfig, Topology,
                             batch_rng)
from gnnpar.sampling import fast, row_gather
from gnnpar.sampling.blocks import Relabeler, assemble_block, assemble_block_numpy
from gnnpar.sampling.cache import by_degree, by_presampling
from gnnpar.sampling.choose import choose_positions, draw_count, floyd_subsets
from gnnpar.sampling.neighbor import sample_entries, sample_entries_numpy
from gnnpar.training.serial import SerialRuntime

from .graphs import random_graph


def dense_hat(graph, kind):
    indptr, indices, values = propagation_matrix(graph, kind)
    n = graph.num_nodes
    a = np.zeros((n, n))
    np.add.at(a, (np.repeat(np.arange(n), np.diff(indptr)), indices), values.astype(np.float64))
    return a


def block_entries(block):
    """(dst global, src global, value) of every stored entry."""
    rows = np.repeat(np.arange(block.num_dst), np.diff(block.indptr))
    return block.dst_ids[rows], block.src_ids[block.indices], block.values


def same_blocks(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.num_dst == y.num_dst
        for name in ("indptr", "indices", "values", "src_ids"):
            assert np.array_equal(getattr(x, name), getattr(y, name)), name


GRAPH = random_graph(n=300, avg_deg=6, f=8, classes=4, seed=5)
DIRECTED = random_graph(n=200, avg_deg=5, f=8, classes=4, seed=6, directed=True, weighted=True)


# ---------------------------------------------------------------- position choosers
def test_floyd_subsets_distinct_in_range_and_uniform():
    rng = np.random.default_rng(0)
    trials, d, k = 20000, 7, 3
    picks = floyd_subsets(np.full(trials, d), k, rng.random((trials, k)))
    assert picks.min() >= 0 and picks.max() < d
    assert all(len(set(row)) == k for row in picks[:500])
    # every k-subset of [0, d) equally likely: 35 subsets, ~571 each
    counts = {}
    for row in map(lambda r: tuple(sorted(r)), picks):
        counts[row] = counts.get(row, 0) + 1
    assert len(counts) == 35
    expect = trials / 35
    chi2 = sum((c - expect) ** 2 / expect for c in counts.values())
    assert chi2 < 70, chi2  # 34 degrees of freedom: p < 1e-3 above ~65


def test_choose_positions_bounds_and_replacement():
    rng = np.random.default_rng(1)
    deg = np.array([0, 1, 3, 5, 9, 40])
    k, pos = choose_positions(deg, 5, False, rng.random((2, 5)))
    assert k.tolist() == [0, 1, 3, 5, 5, 5]
    rows = np.repeat(np.arange(6), k)
    assert np.all(pos < deg[rows]) and np.all(pos >= 0)
    for r in range(6):
        assert len(set(pos[rows == r])) == k[r]
    k, pos = choose_positions(deg, 4, True, rng.random((5, 4)))
    assert k.tolist() == [0, 4, 4, 4, 4, 4]
    assert np.all(pos < deg[np.repeat(np.arange(6), k)])
    k, pos = choose_positions(deg, -1, False)
    assert k.tolist() == deg.tolist()
    with pytest.raises(ValueError):
        choose_positions(deg, 5, False, rng.random((3, 5)))


# ---------------------------------------------------------------- blocks
@pytest.mark.parametrize("kind", ["gcn", "mean"])
@pytest.mark.parametrize("replace", [False, True])
def test_blocks_are_sampled_rows_of_a_hat(kind, replace):
    graph = GRAPH
    a = dense_hat(graph, kind)
    topo = Topology.from_graph(graph, (kind,))
    fanouts = (4, 3, 2)
    seeds = np.array([0, 7, 19, 44, 100, 299])
    blocks = NeighborSampler(topo, SamplerConfig(fanouts, kind, replace)).sample(
        seeds, batch_rng(3, 0, 0, 0))
    assert np.array_equal(blocks[-1].dst_ids, seeds)
    for outer, inner in zip(blocks[:-1], blocks[1:]):
        assert np.array_equal(outer.dst_ids, inner.src_ids)  # layers chain
    deg = topo.degree
    for block, fanout in zip(blocks, fanouts):
        assert np.array_equal(block.src_ids[:block.num_dst], block.dst_ids)
        assert len(set(block.src_ids.tolist())) == block.num_src
        dst, src, val = block_entries(block)
        assert np.all(a[dst, src] != 0), "a sampled entry is not an edge of Â"
        off = dst != src
        per_row = np.bincount(np.repeat(np.arange(block.num_dst), np.diff(block.indptr))[off],
                              minlength=block.num_dst)
        d = deg[block.dst_ids]
        want = np.where(d > 0, fanout, 0) if replace else np.minimum(d, fanout)
        assert np.array_equal(per_row, want)
        assert block.num_sampled == int(want.sum())
        if not replace:
            pairs = dst * graph.num_nodes + src
            assert np.unique(pairs).size == pairs.size, "duplicate edge without replacement"
        # values: Â_ij scaled by d_i / k_i, the diagonal exact
        k = np.maximum(want, 1)[np.repeat(np.arange(block.num_dst), np.diff(block.indptr))]
        scale = np.where(off, deg[dst] / k, 1.0)
        np.testing.assert_allclose(val, a[dst, src] * scale, rtol=1e-6)


def test_mean_values_are_the_sampled_mean():
    topo = Topology.from_graph(GRAPH, ("mean",))
    blocks = NeighborSampler(topo, SamplerConfig((3,), "mean")).sample(
        np.arange(50), batch_rng(0, 0, 0, 0))
    m = blocks[0].to_scipy().toarray()
    rows = m.sum(axis=1)
    has = topo.degree[:50] > 0
    np.testing.assert_allclose(rows[has], 1.0, rtol=1e-6)
    nz = m[m != 0]
    kept = np.minimum(topo.degree[:50], 3)
    assert np.allclose(np.sort(np.unique(nz)), np.sort(np.unique(1.0 / kept[has])))


def test_sampled_aggregation_is_unbiased():
    graph = DIRECTED
    a = dense_hat(graph, "gcn")
    topo = Topology.from_graph(graph, ("gcn",))
    seeds = np.arange(0, 200, 9)
    h = np.random.default_rng(2).normal(size=(graph.num_nodes, 3))
    sampler = NeighborSampler(topo, SamplerConfig((2,), "gcn"))
    acc = np.zeros((seeds.size, 3))
    trials = 3000
    for t in range(trials):
        b = sampler.sample(seeds, batch_rng(1, t, 0, 0))[0]
        acc += b.to_scipy() @ h[b.src_ids]
    exact = a[seeds] @ h
    err = np.abs(acc / trials - exact).max()
    assert err < 0.05 * np.abs(exact).max(), err


@pytest.mark.parametrize("graph", [GRAPH, DIRECTED], ids=["undirected", "directed"])
@pytest.mark.parametrize("kind", ["gcn", "mean"])
def test_fanout_all_gives_full_rows(graph, kind):
    a = dense_hat(graph, kind)
    topo = Topology.from_graph(graph, (kind,))
    seeds = np.array([3, 4, 50, 51, 120])
    blocks = NeighborSampler(topo, SamplerConfig((-1, -1), kind)).sample(seeds,
                                                                         batch_rng(0, 0, 0, 0))
    for b in blocks:
        got = b.to_scipy().toarray()
        np.testing.assert_array_equal(got, a[np.ix_(b.dst_ids, b.src_ids)].astype(np.float32))
        # every neighbour of a destination is among the sources
        assert np.all(a[b.dst_ids][:, np.setdiff1d(np.arange(graph.num_nodes), b.src_ids)] == 0)


@pytest.mark.parametrize("model_kind", ["gcn", "sage"])
@pytest.mark.parametrize("graph", [GRAPH, DIRECTED], ids=["undirected", "directed"])
def test_all_neighbour_step_equals_full_batch_gradient(model_kind, graph):
    seeds = np.flatnonzero(graph.train_mask)[::3]
    torch.manual_seed(0)
    model = GNN(model_kind, graph.num_features, 16, graph.num_classes, layers=3, dropout=0.0)
    rt = SerialRuntime(graph, model.norm)
    y = rt.y[torch.from_numpy(seeds)]

    model.zero_grad()
    out = model(rt.op, rt.x)[torch.from_numpy(seeds)]
    torch.nn.functional.cross_entropy(out, y).backward()
    full = [p.grad.clone() for p in model.parameters()]

    topo = Topology.from_graph(graph, (model.norm,))
    blocks = NeighborSampler(topo, SamplerConfig((-1, -1, -1), model.norm)).sample(
        seeds, batch_rng(0, 0, 0, 0))
    model.zero_grad()
    out_mb = model([b.operator() for b in blocks], rt.x[torch.from_numpy(blocks[0].src_ids)])
    torch.nn.functional.cross_entropy(out_mb, y).backward()
    torch.testing.assert_close(out_mb, out, rtol=1e-5, atol=1e-6)
    for (name, p), g in zip(model.named_parameters(), full):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-7, msg=name)


def test_relabeler_orders_and_cleans_up():
    rl = Relabeler(20)
    src, local = rl(np.array([5, 2, 9]), np.array([9, 17, 3, 17, 2, 0]))
    assert src.tolist() == [5, 2, 9, 0, 3, 17]
    assert local.tolist() == [2, 5, 4, 5, 1, 3]
    assert np.all(rl.slot == -1) and not rl.mark.any()
    big = Relabeler(10 ** 6)  # sort path: graph much larger than the block
    src, local = big(np.array([5, 2]), np.array([999_999, 5, 7]))
    assert src.tolist() == [5, 2, 7, 999_999] and local.tolist() == [3, 0, 2]
    assert rl.union([np.array([4, 1]), np.array([1, 19])]).tolist() == [1, 4, 19]


# ---------------------------------------------------------------- compiled kernels
@pytest.mark.parametrize("graph,kinds,kind", [
    (GRAPH, ("gcn",), "gcn"), (GRAPH, ("mean",), "mean"), (DIRECTED, ("gcn",), "gcn"),
    (GRAPH, ("gcn", "mean"), "mean")])  # the last: 12-byte records, the field-wise gather
@pytest.mark.parametrize("replace", [False, True])
def test_compiled_sampling_equals_the_numpy_reference(graph, kinds, kind, replace):
    """The numba kernels give the vectorised numpy path's arrays bit for bit: positions,
    columns, scaled values, local numbering and block layout (self entries first)."""
    assert fast.available()
    topo = Topology.from_graph(graph, kinds)
    rng = np.random.default_rng(11)
    n = graph.num_nodes
    # repeated rows (a bulk layer stacks minibatches), rows without neighbours, hubs
    rows = np.concatenate([rng.permutation(n)[:120], rng.integers(0, n, 40),
                           np.flatnonzero(topo.degree == 0)[:3],
                           np.argsort(topo.degree)[-5:]]).astype(np.int64)
    relabelers = [Relabeler(n), Relabeler(n), Relabeler(10 ** 6)]  # table scan, sort of new ids
    for fanout in (-1, 0, 1, 3, 8, 40):
        u = (None if fanout < 0 else
             rng.random((draw_count(topo.degree[rows], fanout, replace), fanout)))
        got = sample_entries(topo, kind, rows, fanout, replace, u)
        want = sample_entries_numpy(topo, kind, rows, fanout, replace, u)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w)
        k, cols, vals = want
        dst = rows[:120]  # a block's destinations are distinct
        e = int(k[:120].sum())
        args = (dst, k[:120], cols[:e], vals[:e], topo.self_values[kind][dst])
        ref = assemble_block_numpy(*args, relabelers[0])
        for rl in relabelers[1:]:
            blk = assemble_block(*args, rl)
            same_blocks([blk], [ref])
            assert blk.num_sampled == ref.num_sampled and blk.indices.dtype == np.int64
            assert np.all(rl.slot == -1)
    if kind == "gcn":
        assert np.any(topo.self_values[kind] != 0)  # the self-entry layout was exercised
    with pytest.raises(ValueError, match="u must have shape"):
        sample_entries(topo, kind, rows, 3, replace, np.zeros((1, 3)))


def test_sampler_kernels_switch_off_through_the_environment(monkeypatch):
    monkeypatch.setenv(fast.ENV, "numpy")
    assert not fast.available()
    monkeypatch.setenv(fast.ENV, "numba")
    assert fast.available()


# ---------------------------------------------------------------- determinism
@pytest.mark.parametrize("replace", [False, True])
def test_bulk_equals_node_wise_and_runs_repeat(replace):
    topo = Topology.from_graph(GRAPH, ("gcn",))
    cfg = SamplerConfig((5, 3), "gcn", replace)
    seeds = [np.arange(i * 20, i * 20 + 17) for i in range(6)]
    rngs = lambda: [batch_rng(4, 1, 0, s) for s in range(6)]  # noqa: E731
    bulk = BulkSampler(topo, cfg).sample(seeds, rngs())
    again = BulkSampler(topo, cfg).sample(seeds, rngs())
    for b, s in enumerate(seeds):
        one = NeighborSampler(topo, cfg).sample(s, batch_rng(4, 1, 0, b))
        same_blocks(bulk[b], one)
        same_blocks(bulk[b], again[b])
    other = NeighborSampler(topo, cfg).sample(seeds[0], batch_rng(5, 1, 0, 0))
    assert any(not np.array_equal(x.indices, y.indices) for x, y in zip(bulk[0], other))


def _service_run(topo, graph, fanouts, workers, macro, bulk, epochs=2):
    seeds = np.flatnonzero(graph.train_mask)
    plan = EpochPlan(seeds, [seeds.size], 0, 23, seed=7)
    svc = MacrobatchService(topo, FeatureStore.local(graph.x), plan, SamplerConfig(fanouts, "gcn"),
                            ServiceConfig(macrobatch=macro, workers=workers, prefetch=2, bulk=bulk,
                                          seed=7), torch.as_tensor(graph.y))
    svc.start(0, epochs)
    out, stats = [], []
    try:
        for e in range(epochs):
            st = SamplingStats()
            out += list(svc.epoch(e, st))
            stats.append(st)
    finally:
        svc.close()
    return out, stats


def test_service_same_batches_for_any_workers_macrobatch_and_sampler():
    graph = GRAPH
    topo = Topology.from_graph(graph, ("gcn",))
    ref, ref_stats = _service_run(topo, graph, (4, 3), workers=1, macro=1, bulk=False)
    assert len(ref) == 2 * -(-int(graph.train_mask.sum()) // 23)
    x = torch.as_tensor(graph.x)
    for workers, macro, bulk in [(2, 1, True), (1, 4, True), (3, 3, True), (2, 5, False)]:
        got, stats = _service_run(topo, graph, (4, 3), workers, macro, bulk)
        assert len(got) == len(ref)
        for a, b in zip(ref, got):
            assert (a.epoch, a.step) == (b.epoch, b.step)
            assert np.array_equal(a.seeds, b.seeds)
            same_blocks(a.blocks, b.blocks)
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        for s, r in zip(stats, ref_stats):
            assert s.sampled_edges == r.sampled_edges and s.input_nodes == r.input_nodes
            assert s.unique_input_nodes <= r.unique_input_nodes  # shared inputs counted once
    for b in ref:  # inputs and labels are the graph's rows
        assert torch.equal(b.x, x[torch.from_numpy(b.blocks[0].src_ids)])
        assert torch.equal(b.y, torch.as_tensor(graph.y)[torch.from_numpy(b.seeds)])
    # every training seed once per epoch
    for e in range(2):
        seen = np.concatenate([b.seeds for b in ref if b.epoch == e])
        assert np.array_equal(np.sort(seen), np.flatnonzero(graph.train_mask))


def test_service_reports_a_worker_failure():
    graph = GRAPH
    topo = Topology.from_graph(graph, ("gcn",))
    seeds = np.flatnonzero(graph.train_mask)
    plan = EpochPlan(seeds, [seeds.size], 0, 50)
    bad_labels = torch.zeros(3, dtype=torch.int64)  # too short: indexing fails in the worker
    svc = MacrobatchService(topo, FeatureStore.local(graph.x), plan, SamplerConfig((2,), "gcn"),
                            ServiceConfig(), bad_labels)
    svc.start(0, 1)
    with pytest.raises(RuntimeError, match="sampler worker failed"):
        list(svc.epoch(0, SamplingStats()))
    svc.close()


# ---------------------------------------------------------------- seeds per step
@pytest.mark.parametrize("counts", [[30, 10], [7, 0, 12], [5]])
def test_epoch_plan_equal_steps_and_global_counts(counts):
    batch = 6
    ids = np.arange(sum(counts))
    cuts = np.cumsum([0] + counts)
    plans = [EpochPlan(ids[cuts[r]:cuts[r + 1]], counts, r, batch, seed=3)
             for r in range(len(counts))]
    steps = max(1, -(-max(counts) // batch))
    for epoch in range(2):
        per_rank = [p.minibatches(epoch) for p in plans]
        for p, mbs in zip(plans, per_rank):
            assert p.steps == steps and len(mbs) == steps
            assert max(m.size for m in mbs) <= batch
            assert np.array_equal(np.sort(np.concatenate(mbs)), p.seeds)
        for s in range(steps):
            assert plans[0].global_count(s) == sum(mbs[s].size for mbs in per_rank)
    if steps > 1:  # epochs shuffle differently
        assert not all(np.array_equal(a, b) for a, b in zip(plans[0].minibatches(0),
                                                           plans[0].minibatches(1)))


# ---------------------------------------------------------------- features and cache
def test_local_feature_store_and_cache_choice():
    graph = GRAPH
    store = FeatureStore.local(graph.x)
    ids = np.array([3, 8, 100, 250])
    table, stats = store.fetch(ids)
    assert stats.unique == 4 and stats.remote == 0 and stats.moved_rows == 0
    assert torch.equal(table.gather(np.array([100, 3])), torch.as_tensor(graph.x[[100, 3]]))
    topo = Topology.from_graph(graph, ("gcn",))
    remote = np.ones(graph.num_nodes, bool)
    remote[:150] = False
    top = by_degree(topo, remote, 10)
    cols = np.bincount(topo.indices, minlength=graph.num_nodes)
    assert top.size == 10 and np.all(top >= 150)
    assert cols[top].min() >= np.sort(cols[150:])[-10]
    freq = by_presampling([np.array([160, 170, 3]), np.array([170, 5])], remote, 1)
    assert freq.tolist() == [170]


@pytest.mark.parametrize("f", [8, 16, 20, 128])  # 16 and 128: non-temporal stores
@pytest.mark.parametrize("kernels", ["numba", "numpy"])
def test_row_gather_equals_index_select(f, kernels, monkeypatch):
    monkeypatch.setenv(fast.ENV, kernels)
    rng = np.random.default_rng(f)
    x = torch.randn(500, f)
    index = rng.permutation(500).astype(np.int32)
    lists = [rng.integers(0, 500, 300), np.zeros(0, np.int64), rng.integers(0, 500, 901),
             np.array([7, 7, 7, 499, 0])]
    for idx in (None, index):
        rows = [torch.from_numpy(ids if idx is None else idx[ids].astype(np.int64))
                for ids in lists]
        got = row_gather.gather_groups(x, lists, idx)
        assert [tuple(g.shape) for g in got] == [(len(ids), f) for ids in lists]
        for g, r, ids in zip(got, rows, lists):
            assert torch.equal(g, x.index_select(0, r))
            assert torch.equal(row_gather.gather_rows(x, ids, idx), x.index_select(0, r))
        for shift in (0, 1):  # an aligned output and one 4·f bytes in (unaligned for f=20)
            out = torch.full((1200, f), -1.0)
            at = rng.permutation(1200 - shift)[:901]
            row_gather.gather_rows(x, lists[2], idx, out[shift:], at)
            want = torch.full((1200, f), -1.0)
            want[shift:][torch.from_numpy(at)] = x.index_select(0, rows[2])
            assert torch.equal(out, want)
    assert row_gather.compiled_for(x) == (kernels == "numba")
    big = torch.randn(100_000, f)  # far more rows than entries: bucketed, not exact, order
    few = [rng.integers(0, 100_000, 40) for _ in range(3)]
    for g, ids in zip(row_gather.gather_groups(big, few), few):
        assert torch.equal(g, big[torch.from_numpy(ids)])
    with pytest.raises(IndexError):
        row_gather.gather_rows(x, np.array([3, 500]))
    if kernels == "numba":
        with pytest.raises(IndexError):
            row_gather.gather_groups(x, [np.array([1]), np.array([-1])])
        with pytest.raises(IndexError):
            row_gather.gather_rows(x, np.array([1, 2]), None, torch.empty(4, f), np.array([0, 4]))


def test_output_pool_reuses_only_buffers_nothing_holds():
    x = torch.randn(400, 16)
    pool = row_gather.OutputPool(limit=3)
    a = pool.take(x, [100, 50, 120])
    mem = {t.data_ptr() for t in a}
    b = pool.take(x, [100, 50])  # all three held: fresh ones, not kept (the pool is full)
    assert not mem & {t.data_ptr() for t in b} and len(pool.buffers) == 3
    view = a[0][10:20]  # a view keeps a's first buffer busy
    keep = a[2].numpy()  # so does a numpy array over it
    del a
    c = pool.take(x, [100, 50, 120, 20])
    assert c[1].data_ptr() in mem  # the only free one
    assert not ({c[0].data_ptr(), c[2].data_ptr(), c[3].data_ptr()} & mem)
    assert [tuple(t.shape) for t in c] == [(100, 16), (50, 16), (120, 16), (20, 16)]
    view.fill_(1.0)
    keep[:] = 2.0
    for t in c:  # written while the others are held: nothing shared
        t.fill_(3.0)
    assert bool((view == 1).all()) and bool((torch.from_numpy(keep) == 2).all())
    del c, view, keep
    d = pool.take(x, [20])  # every kept buffer is over twice too big: one is replaced
    assert d[0].shape == (20, 16)
    assert len(pool.buffers) == 3 and 22 * 16 * 4 in [b.nbytes for b in pool.buffers]
    # the rows of repeated gathers stay right while earlier outputs are held or let go
    rng = np.random.default_rng(0)
    held = []
    for i in range(6):
        lists = [rng.integers(0, 400, k) for k in (30, 90, 60)]
        got = row_gather.gather_groups(x, lists)
        for g, ids in zip(got, lists):
            assert torch.equal(g, x[torch.from_numpy(ids)])
        held.append((got[i % 3], lists[i % 3]))
    for g, ids in held:  # not overwritten by the later gathers
        assert torch.equal(g, x[torch.from_numpy(ids)])


def test_macro_features_gather_all_equals_gather():
    """A store of the even rows with the odd ones cached (rows of another rank), and the
    serial store: every minibatch's rows are the graph's, whichever path copies them."""
    rng = np.random.default_rng(3)
    x = torch.randn(300, 32)
    n = x.shape[0]
    owner = (np.arange(n) % 2).astype(np.int32)
    local_index = (np.arange(n) // 2).astype(np.int32)
    mine = np.arange(0, n, 2)
    split = FeatureStore(x[mine], mine, owner, local_index, rank=0)
    split.set_cache(np.arange(1, n, 2), x[1::2])
    lists = [np.unique(rng.integers(0, n, k)) for k in (50, 120, 1, 80)]
    union = np.unique(np.concatenate(lists))
    for store in (FeatureStore.local(x), split):
        table, stats = store.fetch(union)
        assert stats.unique == union.size
        assert stats.cache_hits == (0 if store.all_local else int((union % 2 == 1).sum()))
        got = table.gather_all(lists)
        for g, ids in zip(got, lists):
            assert torch.equal(g, x[torch.from_numpy(ids)])
            assert torch.equal(table.gather(ids), g)


def test_fanouts_parse_and_errors():
    from gnnpar.datasets import InputError
    from gnnpar.sampling import parse_fanouts
    assert parse_fanouts("15,10,-1") == (15, 10, -1)
    for bad in ("", "a,b", "3,-2"):
        with pytest.raises(InputError):
            parse_fanouts(bad)
    assert parse_fanouts([1, 2]) == (1, 2)
