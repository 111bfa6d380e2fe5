"""Link prediction (gnnpar/link): the edge split without leakage, the counter-based
negatives, the metrics against brute force, the loop's no-leakage check, and every
full-batch algorithm's training equal to the serial loop's at 2, 3 and 4 ranks."""
import numpy as np
import pytest
import torch

from gnnpar.datasets import Graph, InputError
from gnnpar.datasets.graph import split_masks
from gnnpar.link.decoders import DotDecoder, MLPDecoder, build_decoder, summed_link_loss
from gnnpar.link.metrics import auc, hits_at, mrr
from gnnpar.link.negatives import negatives
from gnnpar.link.loop import evaluate_link, fit_link
from gnnpar.link.split import parse_fractions, split_edges, undirected_edges
from gnnpar.nn.models import GNN
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn
from gnnpar.training.trainer import TrainConfig

from .link_cases import MODELS, exchange_bytes, link_all, reference
from .predict_cases import cases


def random_graph(n=300, edges=1500, f=16, seed=0, loops=False):
    """A random undirected graph with random features: no signal a model could learn."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, edges), rng.integers(0, n, edges)
    if loops:
        src, dst = np.r_[src, np.arange(5)], np.r_[dst, np.arange(5)]
    indptr, indices, _ = Graph.csr_from_edges(src, dst, n)
    tr, va, te = split_masks(n, rng)
    g = Graph(indptr, indices, rng.standard_normal((n, f)).astype(np.float32),
              rng.integers(0, 2, n), tr, va, te, 2)
    return g.symmetrize()


def keys_of(pairs, n):
    return set((np.minimum(*pairs) * n + np.maximum(*pairs)).tolist())


def test_split_keeps_both_directions_together_and_held_out_edges_out():
    g = random_graph(loops=True)
    n = g.num_nodes
    train_g, split = split_edges(g, (0.7, 0.1, 0.2), seed=3)
    all_keys = set(undirected_edges(g).tolist())
    tr, va, te = (keys_of(p, n) for p in (split.train_pos, split.val_pos, split.test_pos))
    assert tr | va | te == all_keys and not (tr & va or tr & te or va & te)
    assert len(va) == round(0.1 * len(all_keys)) and len(te) == round(0.2 * len(all_keys))
    src, dst = train_g.edges()
    kept = src != dst
    assert keys_of((src[kept], dst[kept]), n) == tr  # no held-out edge, both copies of each
    assert train_g.is_symmetric()
    g_src, g_dst = g.edges()
    assert int((src == dst).sum()) == int((g_src == g_dst).sum()) >= 5  # self loops stay
    for neg in (split.val_neg, split.test_neg):
        assert not keys_of(neg, n) & all_keys and (neg[0] != neg[1]).all()
    for pos, dst_ in ((split.val_pos, split.val_neg_dst), (split.test_pos, split.test_neg_dst)):
        s = np.repeat(pos[0], dst_.shape[1])
        assert not keys_of((s, dst_.reshape(-1)), n) & all_keys
    again = split_edges(g, (0.7, 0.1, 0.2), seed=3)[1]
    other = split_edges(g, (0.7, 0.1, 0.2), seed=4)[1]
    assert np.array_equal(again.test_pos, split.test_pos)
    assert not np.array_equal(other.test_pos, split.test_pos)


@pytest.mark.parametrize("text", ["0,0.5,0.5", "0.8,0.1", "0.9,0.2,0.1", "a,b,c", "1,-0.1,0.1"])
def test_bad_fractions(text):
    with pytest.raises(InputError, match="--link-split"):
        parse_fractions(text)


def test_graph_too_small_for_the_split():
    g = random_graph(n=6, edges=4)
    with pytest.raises(InputError, match="too few"):
        split_edges(g, (0.98, 0.01, 0.01))


def test_negatives_do_not_depend_on_how_positives_are_split():
    pos = np.stack([np.arange(10), np.arange(10) + 5])
    whole = negatives(pos, np.arange(10), 1000, 3, seed=7, epoch=2)
    parts = np.concatenate([negatives(pos[:, a:b], np.arange(a, b), 1000, 3, 7, 2)
                            for a, b in ((0, 4), (4, 7), (7, 10))], axis=1)
    assert np.array_equal(whole, parts)
    assert np.array_equal(whole[0], np.repeat(pos[0], 3))
    assert (whole[1] >= 0).all() and (whole[1] < 1000).all()
    assert not np.array_equal(whole, negatives(pos, np.arange(10), 1000, 3, 7, 3))
    with pytest.raises(InputError, match="--neg-ratio"):
        negatives(pos, np.arange(10), 1000, 0, 7, 2)


def test_negatives_are_uniform():
    pos = np.zeros((2, 20000), np.int64)
    d = negatives(pos, np.arange(20000), 10, 1, 0, 0)[1]
    counts = np.bincount(d, minlength=10)
    assert counts.min() > 1800 and counts.max() < 2200  # 2000 ± ~4.5 sigma


def test_auc_equals_pairwise_count():
    rng = np.random.default_rng(0)
    pos = rng.integers(0, 5, 40).astype(float)  # ties on purpose
    neg = rng.integers(0, 5, 30).astype(float)
    brute = np.mean([(p > q) + 0.5 * (p == q) for p in pos for q in neg])
    assert auc(pos, neg) == pytest.approx(brute, abs=1e-12)


def test_mrr_and_hits_by_hand():
    pos = np.array([3.0, 1.0])
    neg = np.array([[4.0, 2.0, 3.0], [0.0, 0.5, 0.9]])
    # positive 0: one above, two at or above -> rank 2.5; positive 1: rank 1
    assert mrr(pos, neg) == pytest.approx((1 / 2.5 + 1) / 2)
    shared = np.array([5.0, 2.0, 1.5, 0.1])
    assert hits_at(pos, shared, 2) == 0.5  # 2nd best negative 2.0: only 3.0 beats it
    assert hits_at(pos, shared, 5) == 1.0  # fewer negatives than K


def test_decoders_and_loss():
    zu, zv = torch.randn(6, 4), torch.randn(6, 4)
    assert torch.allclose(DotDecoder()(zu, zv), (zu * zv).sum(1))
    mlp = MLPDecoder(4)
    assert torch.allclose(mlp(zu, zv), mlp(zv, zu)) and mlp(zu, zv).shape == (6,)
    with pytest.raises(InputError, match="decoder"):
        build_decoder("cosine", 4)
    pos, neg = torch.tensor([2.0, -1.0]), torch.tensor([0.5])
    expect = (-torch.log(torch.sigmoid(pos))).sum() - torch.log(1 - torch.sigmoid(neg)).sum()
    assert summed_link_loss(pos, neg) == pytest.approx(float(expect), rel=1e-6)


def _train(graph_for_messages, split, epochs=30):
    torch.manual_seed(0)
    encoder = GNN("gcn", graph_for_messages.num_features, 32, 32, 2, 0.0)
    decoder = DotDecoder()
    rt = SerialRuntime(graph_for_messages, encoder.norm)
    hist = fit_link(encoder, decoder, rt, split, TrainConfig(epochs=epochs, lr=0.01),
                    graph_for_messages.num_nodes, neg_ratio=1, seed=0)
    return hist[-1]


def test_no_leakage_test_auc_near_half_and_leaked_edges_raise_it():
    g = random_graph(n=600, edges=3000, seed=1)
    train_g, split = split_edges(g, seed=0)
    clean = _train(train_g, split)
    assert abs(clean["test_auc"] - 0.5) < 0.1, clean
    # the leak the split prevents: held-out edges back in the message-passing graph
    leaked = _train(g, split)
    assert leaked["test_auc"] > clean["test_auc"] + 0.15, (clean, leaked)


def test_fit_link_repeats_and_reports_every_metric():
    g = random_graph(n=300, edges=1500, seed=2)
    train_g, split = split_edges(g, seed=1)
    a, b = _train(train_g, split, epochs=5), _train(train_g, split, epochs=5)
    assert a["loss"] == b["loss"] and a["test_auc"] == b["test_auc"]
    assert set(a) >= {"val_auc", "test_auc", "val_mrr", "test_mrr", "test_hits@20",
                      "test_hits@50", "test_hits@100"}
    rt = SerialRuntime(train_g, "gcn")
    enc = GNN("gcn", g.num_features, 8, 8, 2, 0.0)
    m = evaluate_link(enc, DotDecoder(), rt, split)
    assert 0.0 <= m["test_mrr"] <= 1.0 and 0.0 <= m["test_auc"] <= 1.0


# ---------------------------------------------------------------- distributed == serial
_RUNS = {}


def distributed(world):
    if world not in _RUNS:
        _RUNS[world] = spawn(link_all, world, timeout_s=400)
    return _RUNS[world]


LINK_CASES = [(w, c[0], k, d) for w in (2, 3, 4) for c in cases(w) for k, d in MODELS]


@pytest.mark.slow
@pytest.mark.parametrize("world,label,kind,decoder", LINK_CASES,
                         ids=[f"p{w}-{lab}-{k}-{d}" for w, lab, k, d in LINK_CASES])
def test_distributed_link_training_equals_serial(world, label, kind, decoder):
    """Every rank's losses, metrics and trained parameters equal the serial loop's (dropout
    0, the same negatives: they do not depend on the partition)."""
    losses, metrics, params = reference(kind, decoder)
    for rank_result in distributed(world):
        got_losses, got_metrics, got_params = rank_result[f"{label}-{kind}-{decoder}"]
        np.testing.assert_allclose(got_losses, losses, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_params, params, rtol=1e-5, atol=1e-5)
        assert got_metrics.keys() == metrics.keys()
        for k in metrics:
            assert got_metrics[k] == pytest.approx(metrics[k], abs=1e-5), k


@pytest.mark.parametrize("world", [2, 3])
def test_scoring_exchange_bytes_predicted_exactly(world):
    out = spawn(exchange_bytes, world, timeout_s=300)
    predicted = out[0][1]
    assert [o[0] for o in out] == predicted and sum(predicted) > 0


def write_npz_split(path, g, split, drop=()):
    """``g`` as an npz dataset with ``split``'s positives (and negatives) as its own keys."""
    src, dst = g.edges()
    arrays = dict(edge_index=np.stack([src, dst]), x=g.x, y=g.y, train_mask=g.train_mask,
                  val_mask=g.val_mask, test_mask=g.test_mask, train_pos=split.train_pos,
                  val_pos=split.val_pos, test_pos=split.test_pos, val_neg=split.val_neg,
                  test_neg=split.test_neg)
    np.savez(path, **{k: v for k, v in arrays.items() if k not in drop})


def test_a_dataset_split_is_read_as_given(tmp_path):
    from gnnpar.training.shard_source import load_graph
    from gnnpar.cli.spec import RunSpec
    g = random_graph(n=200, edges=900, seed=3)
    _, split = split_edges(g, (0.6, 0.2, 0.2), seed=9)
    path = tmp_path / "own.npz"
    write_npz_split(path, g, split, drop=("val_neg",))
    loaded = load_graph(RunSpec.of(task="link", dataset=f"npz:{path}", reorder="none"))
    got = loaded.meta["link_split"]
    assert np.array_equal(got.train_pos, split.train_pos)
    assert np.array_equal(got.test_neg, split.test_neg)  # given: kept
    assert got.val_neg.shape == split.val_pos.shape  # not given: drawn, non-edges
    assert not keys_of(got.val_neg, 200) & set(undirected_edges(g).tolist())
    src, dst = loaded.edges()
    kept = keys_of((src[src != dst], dst[src != dst]), 200)
    assert not kept & (keys_of(split.val_pos, 200) | keys_of(split.test_pos, 200))
    assert kept == keys_of(split.train_pos, 200)
    with pytest.raises(InputError, match="own split"):
        load_graph(RunSpec.of(task="link", dataset=f"npz:{path}", link_split="0.5,0.25,0.25"))


def test_a_dataset_split_with_bad_ids_is_refused(tmp_path):
    from gnnpar.training.shard_source import load_graph
    from gnnpar.cli.spec import RunSpec
    g = random_graph(n=50, edges=200, seed=4)
    _, split = split_edges(g, seed=1)
    bad = split.test_pos.copy()
    bad[1, 0] = 50
    path = tmp_path / "bad.npz"
    write_npz_split(path, g, split.__class__(**{**vars(split), "test_pos": bad}))
    with pytest.raises(InputError, match="test_pos has vertex id 50, out of range for 50"):
        load_graph(RunSpec.of(task="link", dataset=f"npz:{path}"))
