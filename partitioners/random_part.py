"""Random partitioner: a seeded hash of the global id.

``owner(v) = splitmix64(v + seed * 0x9E3779B97F4A7C15) mod P``. Because the owner of any id is a
pure function of (id, seed, P), a process can compute it for the ids it needs without ever
holding the whole owner array, and the same seed gives the same parts on every machine.

Parts are balanced only in expectation: each size is Binomial(n, 1/P), so the largest part
exceeds ``n/P`` by a few ``sqrt(n/P)``. More parts than vertices leaves some parts empty.
"""
from __future__ import annotations

import numpy as np

from gnnpar.datasets import Graph

from .partition import Partition, check_parts

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser applied elementwise to a uint64 array (wrapping arithmetic)."""
    z = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def hash_owner(ids: np.ndarray, parts: int, seed: int = 0) -> np.ndarray:
    """Owner in ``[0, parts)`` of each global id in ``ids`` for this ``seed``; int32 array."""
    ids = np.asarray(ids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        salt = np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF) * _GOLDEN
        h = splitmix64(ids + salt)
    return (h % np.uint64(parts)).astype(np.int32)


def random_partition(graph: Graph, parts: int, seed: int = 0) -> Partition:
    """Every vertex goes to the part its seeded hash picks (see module docstring)."""
    parts = check_parts(parts)
    owner = hash_owner(np.arange(graph.num_nodes, dtype=np.uint64), parts, seed)
    return Partition.from_owner(owner, parts, method="random", seed=seed)
