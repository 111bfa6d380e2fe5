"""The edge split for link prediction, without leakage.

An undirected edge {u, v} (u ≠ v) is the unit: every stored copy of it (u → v, v → u) goes to
the same side. The *training graph*, the one messages pass over in training **and** in
evaluation, keeps the training edges' stored copies (weights unchanged) and the graph's self
loops, and nothing of a validation or test edge. Positives are (2, K) int64 arrays, one
column per undirected edge, smaller id first.

Evaluation negatives are fixed by the seed and never true edges of the whole graph (held-out
ones included): ``*_neg`` (2, K) pairs shared by all positives (OGB collab's Hits@K and the
AUC), and ``*_neg_dst`` (K, R) destinations each positive is ranked against with its own
source (OGB citation2's MRR).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np

from gnnpar.datasets import Graph, InputError

#: the default ``--link-split``: train, validation, test shares of the undirected edges
DEFAULT_FRACTIONS = (0.85, 0.05, 0.10)
#: destinations each evaluation positive is ranked against for the MRR
EVAL_RANKED = 100
_SPLIT_STREAM, _NEG_STREAM = 0x5EED_0001, 0x5EED_0002


@dataclass(frozen=True)
class LinkSplit:
    """Positive pairs of each side and the evaluation negatives (module docstring)."""

    train_pos: np.ndarray
    val_pos: np.ndarray
    test_pos: np.ndarray
    val_neg: np.ndarray
    test_neg: np.ndarray
    val_neg_dst: np.ndarray
    test_neg_dst: np.ndarray


def parse_fractions(text: str) -> Tuple[float, float, float]:
    """``TRAIN,VAL,TEST`` shares (each ≥ 0, summing to 1, train > 0); InputError otherwise."""
    try:
        parts = tuple(float(p) for p in str(text).split(","))
    except ValueError:
        raise InputError(f"--link-split wants three shares TRAIN,VAL,TEST, got {text!r}") from None
    if len(parts) != 3 or any(not np.isfinite(p) or p < 0 for p in parts):
        raise InputError(f"--link-split wants three shares TRAIN,VAL,TEST >= 0, got {text!r}")
    if abs(sum(parts) - 1.0) > 1e-6:
        raise InputError(f"--link-split shares must sum to 1, got {text!r} (sum {sum(parts):g})")
    if parts[0] <= 0:
        raise InputError(f"--link-split leaves no training share: {text!r}")
    return parts


def undirected_edges(graph: Graph) -> np.ndarray:
    """The graph's undirected edges {u, v}, u < v, as a sorted int64 key array u·n + v."""
    src, dst = graph.edges()
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    keep = lo != hi
    return np.unique(lo[keep] * graph.num_nodes + hi[keep])


def split_edges(graph: Graph, fractions=DEFAULT_FRACTIONS, seed: int = 0,
                ranked: int = EVAL_RANKED) -> Tuple[Graph, LinkSplit]:
    """The training graph and the split of ``graph``'s undirected edges (module docstring),
    seeded by ``seed``. InputError when a side with a positive share would get no edge."""
    train_f, val_f, test_f = parse_fractions(",".join(str(f) for f in fractions))
    n = graph.num_nodes
    keys = undirected_edges(graph)
    total = keys.shape[0]
    n_val, n_test = int(round(val_f * total)), int(round(test_f * total))
    n_train = total - n_val - n_test
    short = [name for name, share, count in (("train", train_f, n_train), ("val", val_f, n_val),
                                             ("test", test_f, n_test)) if share > 0 and count < 1]
    if short:
        raise InputError(f"the graph has {total} undirected edges, too few for --link-split "
                         f"{train_f:g},{val_f:g},{test_f:g}: no {' or '.join(short)} edge")
    order = np.random.default_rng([seed, _SPLIT_STREAM]).permutation(total)
    val_keys = np.sort(keys[order[:n_val]])
    test_keys = np.sort(keys[order[n_val:n_val + n_test]])
    train_keys = np.sort(keys[order[n_val + n_test:]])
    rng = np.random.default_rng([seed, _NEG_STREAM])
    pairs = [_pairs(k, n) for k in (train_keys, val_keys, test_keys)]
    split = LinkSplit(*pairs,
                      val_neg=non_edges(rng, keys, n, n_val),
                      test_neg=non_edges(rng, keys, n, n_test),
                      val_neg_dst=ranked_non_edges(rng, keys, pairs[1][0], n, ranked),
                      test_neg_dst=ranked_non_edges(rng, keys, pairs[2][0], n, ranked))
    return training_graph(graph, train_keys), split


def training_graph(graph: Graph, train_keys: np.ndarray) -> Graph:
    """``graph`` with only the stored copies of ``train_keys``' edges and its self loops."""
    src, dst = graph.edges()
    n = graph.num_nodes
    key = np.minimum(src, dst) * n + np.maximum(src, dst)
    keep = (src == dst) | _member(key, train_keys)
    w = None if graph.edge_weight is None else np.asarray(graph.edge_weight)[keep]
    return graph._with_edges(src[keep], dst[keep], w)


def non_edges(rng: np.random.Generator, keys: np.ndarray, n: int, count: int) -> np.ndarray:
    """``count`` uniform pairs (u, v), u ≠ v, none an edge of the graph (``keys``), (2, count)."""
    out = np.empty((2, 0), np.int64)
    while out.shape[1] < count:
        u = rng.integers(0, n, 2 * (count - out.shape[1]) + 16)
        v = rng.integers(0, n, u.shape[0])
        ok = (u != v) & ~_member(np.minimum(u, v) * n + np.maximum(u, v), keys)
        out = np.concatenate([out, np.stack([u[ok], v[ok]])], axis=1)
    return out[:, :count]


def ranked_non_edges(rng: np.random.Generator, keys: np.ndarray, src: np.ndarray, n: int,
                     ranked: int) -> np.ndarray:
    """(K, ``ranked``) destinations for each source in ``src``, uniform, none the source
    itself or one of its neighbours in the whole graph."""
    out = rng.integers(0, n, (src.shape[0], ranked))
    for _ in range(64):
        s = np.broadcast_to(src[:, None], out.shape)
        bad = (out == s) | _member(np.minimum(s, out) * n + np.maximum(s, out), keys)
        if not bad.any():
            return out
        out[bad] = rng.integers(0, n, int(bad.sum()))
    raise InputError("could not draw evaluation negatives: the graph is nearly complete")


def _pairs(keys: np.ndarray, n: int) -> np.ndarray:
    return np.stack(np.divmod(keys, n)).astype(np.int64)


def _member(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is in ``sorted_keys`` (sorted, unique)."""
    if sorted_keys.shape[0] == 0:
        return np.zeros(values.shape, bool)
    at = np.minimum(np.searchsorted(sorted_keys, values), sorted_keys.shape[0] - 1)
    return sorted_keys[at] == values


def save_split(path: str, split: LinkSplit) -> None:
    """``split``'s arrays into the npz file ``path`` (what launched ranks read)."""
    np.savez(path, **{f: getattr(split, f) for f in LinkSplit.__dataclass_fields__})


def load_split(path: str) -> LinkSplit:
    with np.load(path, allow_pickle=False) as z:
        return LinkSplit(**{f: z[f] for f in LinkSplit.__dataclass_fields__})
