"""The one result type every partitioner returns.

A :class:`Partition` of ``n`` vertices into ``P`` parts stores

- ``owner`` (n,) int32: the part of every vertex;
- ``perm`` (n,) int64: *new position -> old (global) id*. Part ``r``'s vertices occupy positions
  ``[offsets[r], offsets[r+1])`` and, inside a part, appear in ascending global id. This is the
  vertex order of every shard (local id ``i`` of part ``r`` is global id ``perm[offsets[r] + i]``);
- ``offsets`` (P+1,) int64 and ``sizes`` (P,) int64.

Empty parts are allowed (``block`` and ``random`` with more parts than vertices produce them);
``metis`` and ``kaminpar`` refuse ``P > n`` (see their modules). ``owner`` alone determines the
rest, so :meth:`Partition.from_owner` is the only constructor the methods use.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gnnpar.datasets import InputError


def check_parts(parts, n: int | None = None) -> int:
    """``parts`` as an int >= 1, or :class:`InputError`."""
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)) or parts < 1:
        raise InputError(f"the part count must be a positive integer, got {parts!r}")
    return int(parts)


@dataclass(frozen=True)
class Partition:
    """Owner of every vertex plus the part-contiguous vertex order.

    Shapes: ``owner`` (n,) int32, ``perm`` (n,) int64, ``offsets`` (P+1,) int64,
    ``sizes`` (P,) int64.
    """

    owner: np.ndarray
    perm: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    method: str = "unknown"
    seed: int = 0
    info: dict = field(default_factory=dict, compare=False)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_owner(cls, owner, parts: int, method: str = "unknown", seed: int = 0,
                   info: dict | None = None) -> "Partition":
        """Build the order, offsets and sizes from ``owner`` (n,), values in ``[0, parts)``."""
        parts = check_parts(parts)
        owner = np.asarray(owner)
        if owner.ndim != 1:
            raise InputError(f"owner must be a 1-D array, got shape {owner.shape}")
        if owner.size and not np.issubdtype(owner.dtype, np.integer):
            raise InputError(f"owner must be an integer array, got {owner.dtype}")
        if owner.size and (owner.min() < 0 or owner.max() >= parts):
            bad = int(owner.min()) if owner.min() < 0 else int(owner.max())
            raise InputError(f"owner value {bad} is outside [0, parts={parts})")
        owner = owner.astype(np.int32, copy=False)
        # stable sort by part keeps ascending global id inside each part
        perm = np.argsort(owner, kind="stable").astype(np.int64)
        sizes = np.bincount(owner, minlength=parts).astype(np.int64)
        offsets = np.zeros(parts + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(owner, perm, offsets, sizes, method, int(seed), dict(info or {}))

    # ---------------------------------------------------------------- views
    @property
    def num_parts(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def num_nodes(self) -> int:
        return int(self.owner.shape[0])

    def vertices(self, rank: int) -> np.ndarray:
        """Global ids owned by part ``rank``, ascending (n_local,) int64."""
        return self.perm[self.offsets[rank]:self.offsets[rank + 1]]

    def positions(self) -> np.ndarray:
        """Inverse of ``perm``: position of every global id in the part order, (n,) int64."""
        pos = np.empty(self.num_nodes, np.int64)
        pos[self.perm] = np.arange(self.num_nodes, dtype=np.int64)
        return pos

    def local_index(self) -> np.ndarray:
        """Local id of every global id inside its own part, (n,) int64."""
        return self.positions() - self.offsets[self.owner]

    # ---------------------------------------------------------------- checks
    def validate(self, n: int | None = None) -> "Partition":
        """Check every invariant (each vertex exactly once, contiguous ascending parts)."""
        P, N = self.num_parts, self.num_nodes
        if n is not None and N != n:
            raise InputError(f"partition covers {N} vertices but the graph has {n}")
        if self.perm.shape != (N,) or self.offsets.shape != (P + 1,):
            raise InputError(f"partition arrays have inconsistent shapes: perm {self.perm.shape}, "
                             f"offsets {self.offsets.shape}, sizes {self.sizes.shape}")
        if N and (self.owner.min() < 0 or self.owner.max() >= P):
            raise InputError(f"owner values must lie in [0, {P})")
        if np.any(self.sizes < 0) or int(self.sizes.sum()) != N:
            raise InputError(f"part sizes must be non-negative and sum to n={N}, "
                             f"got sum {int(self.sizes.sum())}")
        if self.offsets[0] != 0 or np.any(np.diff(self.offsets) != self.sizes):
            raise InputError("offsets must be the prefix sums of sizes")
        seen = np.zeros(N, np.int64)
        np.add.at(seen, self.perm, 1)
        if np.any(seen != 1):
            raise InputError(f"perm must list every vertex exactly once "
                             f"({int(np.sum(seen != 1))} do not)")
        part_of_pos = np.repeat(np.arange(P, dtype=np.int32), self.sizes)
        if not np.array_equal(self.owner[self.perm], part_of_pos):
            raise InputError("perm does not place every vertex inside its owner's range")
        if N > 1:
            same_part = part_of_pos[1:] == part_of_pos[:-1]
            if np.any(self.perm[1:][same_part] <= self.perm[:-1][same_part]):
                raise InputError("vertices inside a part must be in ascending global id")
        return self

    def balance(self, weights=None) -> float:
        """max / mean of the part weights (vertex count when ``weights`` is None); 1.0 = perfect."""
        w = (self.sizes.astype(np.float64) if weights is None
             else np.bincount(self.owner, weights=np.asarray(weights, np.float64),
                              minlength=self.num_parts))
        mean = w.sum() / self.num_parts
        return float(w.max() / mean) if mean > 0 else 1.0

    def describe(self) -> dict:
        """JSON-ready summary (method, seed, parts, sizes)."""
        return {"method": self.method, "seed": self.seed, "parts": self.num_parts,
                "sizes": [int(s) for s in self.sizes], **self.info}
