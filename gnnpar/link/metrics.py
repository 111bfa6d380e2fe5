"""Link-prediction metrics on pair scores (higher = more likely an edge).

- :func:`auc`: the probability that a positive outscores a negative, ties counting one half
  (the Mann–Whitney statistic over all positive/negative pairs);
- :func:`mrr`: each positive ranked against its own negatives, rank = 1 + (number of
  negatives above it + number at or above it) / 2, the mean of 1 / rank (OGB's citation2
  evaluator);
- :func:`hits_at`: the share of positives above the K-th best of the negatives shared by all
  positives; 1 when there are fewer than K negatives (OGB's collab evaluator).
"""
from __future__ import annotations

import numpy as np

HITS = (20, 50, 100)


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    pos, neg = np.asarray(pos, np.float64).ravel(), np.asarray(neg, np.float64).ravel()
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    scores = np.concatenate([pos, neg])
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(scores.size, np.float64)
    s = scores[order]
    first = np.r_[True, s[1:] != s[:-1]]
    start = np.flatnonzero(first)
    ends = np.r_[start[1:], s.size]
    mean_rank = (start + ends - 1) / 2.0 + 1.0  # 1-based mean rank of each tie group
    ranks[order] = np.repeat(mean_rank, ends - start)
    k, m = pos.size, neg.size
    return float((ranks[:k].sum() - k * (k + 1) / 2.0) / (k * m))


def reciprocal_ranks(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """1 / rank of positive i among row i of ``neg`` (``pos`` (K,), ``neg`` (K, R))."""
    pos = np.asarray(pos, np.float64).reshape(-1, 1)
    if pos.shape[0] == 0:
        return np.zeros(0)
    neg = np.asarray(neg, np.float64).reshape(pos.shape[0], -1)
    optimistic = (neg > pos).sum(axis=1)
    pessimistic = (neg >= pos).sum(axis=1)
    return 1.0 / (0.5 * (optimistic + pessimistic) + 1.0)


def mrr(pos: np.ndarray, neg: np.ndarray) -> float:
    """``pos`` (K,), ``neg`` (K, R): positive i against row i of ``neg``."""
    return float(np.mean(reciprocal_ranks(pos, neg))) if np.size(pos) else float("nan")


def hits_at(pos: np.ndarray, neg: np.ndarray, k: int) -> float:
    pos, neg = np.asarray(pos, np.float64).ravel(), np.asarray(neg, np.float64).ravel()
    if pos.size == 0:
        return float("nan")
    if neg.size < k:
        return 1.0
    kth = np.partition(neg, neg.size - k)[neg.size - k]
    return float(np.mean(pos > kth))
