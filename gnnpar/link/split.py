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

from gnnpar.datasets import Graph, InputError, parse_spec
from gnnpar.datasets.ogb import pick_split
from gnnpar.datasets.ogb_link import is_link_split, read_link_split

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


#: the npz keys of a dataset's own split: 2 × K global ids each (``*_neg`` optional), and
#: the optional K × R destinations each validation / test positive is ranked against
GIVEN_KEYS = ("train_pos", "val_pos", "test_pos", "val_neg", "test_neg")
RANKED_KEYS = ("val_neg_dst", "test_neg_dst")


def given_arrays(dataset: str) -> dict:
    """The split a dataset carries, read as given: an ``npz:`` file's :data:`GIVEN_KEYS` and
    :data:`RANKED_KEYS`, or an ``ogb:`` link-property folder's ``split/<name>/*.pt``
    (:mod:`gnnpar.datasets.ogb_link`); {} for another dataset, an npz file without
    ``train_pos`` or a node-property folder."""
    kind, keys = parse_spec(dataset)
    if kind == "ogb":
        split_dir = pick_split(keys["dir"], keys["split"])
        return read_link_split(split_dir) if is_link_split(split_dir) else {}
    if kind != "npz":
        return {}
    with np.load(keys["path"], allow_pickle=False) as z:
        if "train_pos" not in z.files:
            return {}
        missing = [k for k in GIVEN_KEYS[:3] if k not in z.files]
        if missing:
            raise InputError(f"{keys['path']} has train_pos but not {', '.join(missing)}: a "
                             "split needs train_pos, val_pos and test_pos")
        return {k: z[k] for k in GIVEN_KEYS + RANKED_KEYS if k in z.files}


def given_split(graph: Graph, arrays: dict, seed: int = 0, ranked: int = EVAL_RANKED,
                where: str = "the dataset") -> Tuple[Graph, LinkSplit]:
    """The training graph and split of a dataset's own split (``arrays``, checked: 2 × K
    integer ids in range, and K × R for the ranked destinations): every stored copy of a
    validation or test positive is removed from the message-passing graph; missing
    ``val_neg``/``test_neg`` are drawn as :func:`split_edges` draws them, and so are missing
    per-positive MRR destinations (``val_neg_dst``/``test_neg_dst``)."""
    n = graph.num_nodes
    pairs = {k: _checked_pairs(v, k, n, where) for k, v in arrays.items()
             if k not in RANKED_KEYS}
    ranked_given = {k: _checked_ranked(arrays[k], k, pairs[k[:-len("_neg_dst")] + "_pos"],
                                       n, where) for k in RANKED_KEYS if k in arrays}
    keys = undirected_edges(graph)
    held = np.concatenate([_keys(pairs["val_pos"], n), _keys(pairs["test_pos"], n)])
    train_keys = keys[~_member(keys, np.unique(held))]
    rng = np.random.default_rng([seed, _NEG_STREAM])
    every = np.unique(np.concatenate([keys, held, _keys(pairs["train_pos"], n)]))
    neg = {side: pairs.get(f"{side}_neg") if f"{side}_neg" in pairs else
           non_edges(rng, every, n, pairs[f"{side}_pos"].shape[1]) for side in ("val", "test")}
    dst = {k: ranked_given[k] if k in ranked_given else
           ranked_non_edges(rng, every, pairs[k[:-len("_neg_dst")] + "_pos"][0], n, ranked)
           for k in RANKED_KEYS}
    split = LinkSplit(pairs["train_pos"], pairs["val_pos"], pairs["test_pos"], neg["val"],
                      neg["test"], dst["val_neg_dst"], dst["test_neg_dst"])
    return training_graph(graph, train_keys), split


def _checked_ranked(a, key: str, pos: np.ndarray, n: int, where: str) -> np.ndarray:
    """A K × R array of destination ids, one row for each of the K positives ``pos``."""
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[0] != pos.shape[1] or a.shape[1] < 1 \
            or not np.issubdtype(a.dtype, np.integer):
        raise InputError(f"{where}: {key} must be a K x R integer array with K = "
                         f"{pos.shape[1]} (one row a positive), got shape {a.shape} dtype "
                         f"{a.dtype}")
    if a.size and (a.min() < 0 or a.max() >= n):
        bad = int(a.min()) if a.min() < 0 else int(a.max())
        raise InputError(f"{where}: {key} has vertex id {bad}, out of range for {n} vertices")
    return a.astype(np.int64)


def _checked_pairs(a, key: str, n: int, where: str) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[0] != 2 or not np.issubdtype(a.dtype, np.integer):
        raise InputError(f"{where}: {key} must be a 2 x K integer array of vertex ids, got "
                         f"shape {a.shape} dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() >= n):
        bad = int(a.min()) if a.min() < 0 else int(a.max())
        raise InputError(f"{where}: {key} has vertex id {bad}, out of range for {n} vertices")
    if key.endswith("_pos") and a.shape[1] == 0:
        raise InputError(f"{where}: {key} is empty")
    return a.astype(np.int64)


def _keys(pairs: np.ndarray, n: int) -> np.ndarray:
    return np.minimum(pairs[0], pairs[1]) * n + np.maximum(pairs[0], pairs[1])


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
