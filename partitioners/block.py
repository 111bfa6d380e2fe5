"""Block partitioner: contiguous ranges of global ids.

Part ``r`` owns ids ``[b[r], b[r+1])``. With ``balance='nodes'`` the ranges differ in length by
at most one (``b[r] = r*n // P``). With ``balance='edges'`` each vertex weighs the non-zeros of
its row in the propagation structure A' + I (its degree without self loops, plus one), and the
cut points are the prefix-sum positions nearest to ``r * W / P``; every part then weighs at most
``W / P + max vertex weight``. This is what a local SpMM's work is proportional to.

More parts than vertices is allowed and leaves the trailing parts empty.
"""
from __future__ import annotations

import numpy as np

from gnnpar.datasets import Graph, InputError

from .partition import Partition, check_parts

BALANCES = ("nodes", "edges")


def row_work(graph: Graph) -> np.ndarray:
    """Non-zeros of each row of A' + I: degree without self loops, plus one. (n,) int64."""
    indptr = np.asarray(graph.indptr)
    indices = np.asarray(graph.indices)
    n = graph.num_nodes
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    loops = np.bincount(rows[indices == rows], minlength=n)
    return np.diff(indptr).astype(np.int64) - loops + 1


def weighted_cuts(weights: np.ndarray, parts: int) -> np.ndarray:
    """Boundaries (parts+1,) of contiguous ranges whose weights are as equal as prefix sums
    allow."""
    n = weights.shape[0]
    cum = np.cumsum(weights, dtype=np.float64)
    total = cum[-1] if n else 0.0
    targets = total * np.arange(1, parts, dtype=np.float64) / parts
    # first index whose inclusive prefix reaches the target: cut before or after it, nearer wins
    idx = np.searchsorted(cum, targets, side="left")
    before = np.where(idx > 0, cum[np.maximum(idx - 1, 0)], 0.0)
    after = cum[np.minimum(idx, n - 1)] if n else np.zeros_like(targets)
    cut = np.where(targets - before <= after - targets, idx, idx + 1)
    cut = np.minimum(np.maximum.accumulate(cut), n)
    return np.concatenate([[0], cut, [n]]).astype(np.int64)


def block_partition(graph: Graph, parts: int, balance: str = "nodes") -> Partition:
    """Contiguous id ranges balanced by vertex count or by row non-zeros (see module docstring)."""
    parts = check_parts(parts)
    if balance not in BALANCES:
        raise InputError(f"unknown balance {balance!r}; choose one of {', '.join(BALANCES)}")
    n = graph.num_nodes
    if balance == "nodes":
        bounds = (np.arange(parts + 1, dtype=np.int64) * n) // parts
    else:
        bounds = weighted_cuts(row_work(graph), parts)
    owner = np.repeat(np.arange(parts, dtype=np.int32), np.diff(bounds))
    return Partition.from_owner(owner, parts, method="block", seed=0, info={"balance": balance})
