"""Which remote feature rows a rank keeps locally (``--cache-frac``, ``--cache-policy``).

A rank caches ``round(frac × (n − n_local))`` rows of vertices it does not own, filled once at
setup by the same all-to-all the macrobatches use (phase ``setup``, not an epoch's
``feat_bytes``); memory: that many rows × f × 4 bytes. A row in the cache is never fetched
again, so the policy should pick the rows most often needed:

- ``degree``: the vertices that appear as a neighbour in most rows of Â (the column counts
  of the off-diagonal adjacency; for an undirected graph, the degree). A vertex with c
  in-rows is an input node of a minibatch whenever one of those rows is sampled, so high-c
  vertices dominate the fetched bytes on skewed graphs. Free to compute.
- ``presample``: sample ``probe_steps`` minibatches of this rank's seeds (a dedicated epoch
  tag, so training epochs draw differently) and keep the remote vertices that were input
  nodes most often. Costs that much sampling at setup; adapts to the fanouts and the seeds
  this rank actually owns.

Ties go to the smaller id, so every run picks the same rows.
"""
from __future__ import annotations

import numpy as np

from gnnpar.datasets import InputError

POLICIES = ("degree", "presample")

#: epoch tag of the pre-sampling pass (training epochs are 0, 1, …).
PRESAMPLE_EPOCH = 2 ** 31 - 1


def cache_size(frac: float, num_nodes: int, num_local: int) -> int:
    if not 0.0 <= frac <= 1.0:
        raise InputError(f"--cache-frac must be in [0, 1], got {frac}")
    return int(round(frac * (num_nodes - num_local)))


def top_remote(score: np.ndarray, is_remote: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` remote ids of highest ``score`` (ties: smaller id), sorted by id."""
    cand = np.flatnonzero(is_remote & (score > 0))
    if count <= 0 or cand.size == 0:
        return np.zeros(0, np.int64)
    # stable sort on −score keeps ascending ids among equal scores
    best = cand[np.argsort(-score[cand], kind="stable")[:count]]
    return np.sort(best).astype(np.int64)


def by_degree(topo, is_remote: np.ndarray, count: int) -> np.ndarray:
    """Remote ids that most rows of the adjacency point to."""
    return top_remote(topo.in_rows(), is_remote, count)


def by_presampling(sample_inputs, is_remote: np.ndarray, count: int) -> np.ndarray:
    """Remote ids most often among the input nodes of ``sample_inputs`` (an iterable of
    input-id arrays, e.g. the pre-sampled minibatches')."""
    hits = np.zeros(is_remote.shape[0], np.int64)
    for ids in sample_inputs:
        hits[ids] += 1  # input ids of one minibatch are distinct
    return top_remote(hits, is_remote, count)


def choose_cache(policy: str, topo, is_remote: np.ndarray, count: int, sample_inputs=None
                 ) -> np.ndarray:
    """Ids to cache under ``policy``; ``sample_inputs`` is needed for ``presample``."""
    if policy not in POLICIES:
        raise InputError(f"unknown --cache-policy {policy!r}; choose {', '.join(POLICIES)}")
    if count <= 0:
        return np.zeros(0, np.int64)
    if policy == "degree":
        return by_degree(topo, is_remote, count)
    return by_presampling(sample_inputs, is_remote, count)
