"""Where the 2D/3D kernels put Â's non-zeros, computed on the whole graph (for the quality
report): non-zeros per grid rank under the shards' parts and under the balanced block layout.

The kernels (``kernels/spmm_2d.py``, ``kernels/spmm_3d.py``) cut their blocks themselves at
setup, from the 1D shards, with one all-to-all of the non-zeros; no block is written to disk.
Both start from an *owner* of every vertex (``owner[v]`` = the rank whose rows hold v):

- ``parts``: the partition (rank q owns part q);
- ``balanced``: :func:`balanced_owner`, a seeded random balanced assignment (what
  ``gnnpar-train`` runs; ``kernels/blocks.Ownership.permuted_over`` is built from it).

Ranks are row-major grid coordinates: 2D ``rank = i·pc + j``, 3D ``rank = (x·py + y)·pz + z``.
2D: rank (i, j) holds non-zero (u, v) when u's owner is in row i and v's owner in column j.
3D orientation (X, Y, Z) (the axes (0, 1, 2) rotated by the layer index): the block
Â[R_x, C_y] (u's owner at X = x, v's owner at Y = y) is split by rows into Z pieces of even
size, the rows of R_x ordered by their owner's (Y, Z) coordinates, then by id; rank (x, y, z)
holds piece z. :func:`nnz_per_rank` follows those rules; ``tests/test_balance.py`` checks it
against the operators' own ``local_nnz``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gnnpar.datasets import InputError


@dataclass(frozen=True)
class GridSpec:
    """Grid shape ``dims`` (pr, pc) or (px, py, pz); ``seed`` of the balanced layout."""

    dims: tuple
    seed: int = 0

    def __post_init__(self):
        dims = tuple(int(d) for d in self.dims)
        if len(dims) not in (2, 3) or any(d < 1 for d in dims):
            raise InputError(f"a grid has 2 or 3 positive sizes (AxB or AxBxC), got {self.dims!r}")
        object.__setattr__(self, "dims", dims)

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "GridSpec":
        """``"2x3"`` or ``"2x2x2"`` -> GridSpec."""
        if not re.fullmatch(r"\d+x\d+(x\d+)?", str(text).strip()):
            raise InputError(f"--grid must look like AxB or AxBxC (e.g. 2x3), got {text!r}")
        return cls(tuple(int(t) for t in str(text).strip().split("x")), seed)

    @property
    def size(self) -> int:
        return int(np.prod(self.dims))

    @property
    def text(self) -> str:
        return "x".join(map(str, self.dims))


def balanced_owner(n: int, p: int, seed: int) -> np.ndarray:
    """(n,) int64: a seeded random balanced assignment of n vertices to p ranks (sizes differ
    by at most one). Every rank computes the same one without communication."""
    perm = np.random.default_rng(seed).permutation(n).astype(np.int64)
    bounds = (np.arange(p + 1, dtype=np.int64) * n) // p
    owner = np.empty(n, np.int64)
    owner[perm] = np.repeat(np.arange(p, dtype=np.int64), np.diff(bounds))
    return owner


def _local_index(owner: np.ndarray, p: int) -> np.ndarray:
    """Index of each vertex among its owner's vertices, ascending id."""
    order = np.argsort(owner, kind="stable")
    first = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=p))])[:-1]
    local = np.empty(owner.shape[0], np.int64)
    local[order] = np.arange(owner.shape[0], dtype=np.int64) - first[owner[order]]
    return local


def nnz_per_rank(indptr, indices, owner: np.ndarray, dims, orientation: int = 0) -> np.ndarray:
    """Non-zeros each rank of grid ``dims`` holds (P,) int64 (see module docstring); 3D: in
    ``orientation`` 0, 1 or 2."""
    dims = tuple(int(d) for d in dims)
    p = int(np.prod(dims))
    owner = np.asarray(owner, np.int64)
    n = owner.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(np.asarray(indptr)))
    ou, ov = owner[rows], owner[np.asarray(indices, np.int64)]
    coords = np.unravel_index(np.arange(p), dims)
    if len(dims) == 2:
        dest = coords[0][ou] * dims[1] + coords[1][ov]
        return np.bincount(dest, minlength=p).astype(np.int64)
    X, Y, Z = (np.arange(3) + orientation) % 3
    sizes = np.bincount(owner, minlength=p)
    key = coords[X] * (dims[Y] * dims[Z]) + coords[Y] * dims[Z] + coords[Z]  # R_x order
    by_key = np.argsort(key, kind="stable")
    start = np.empty(p, np.int64)
    cum = np.concatenate([[0], np.cumsum(sizes[by_key])])
    slice_first = cum[(coords[X][by_key]) * dims[Y] * dims[Z]]
    start[by_key] = cum[:-1] - slice_first
    R = np.bincount(coords[X], weights=sizes, minlength=dims[X]).astype(np.int64)
    pos = start[ou] + _local_index(owner, p)[rows]
    r = R[coords[X][ou]]
    piece = np.zeros_like(pos)
    for k in range(1, dims[Z]):            # last bound <= pos (empty pieces: the later one)
        piece += (r * k) // dims[Z] <= pos
    dest = np.ravel_multi_index(tuple({X: coords[X][ou], Y: coords[Y][ov], Z: piece}[a]
                                      for a in range(3)), dims)
    return np.bincount(dest, minlength=p).astype(np.int64)


def nnz_balance(indptr, indices, spec: GridSpec, partition) -> dict:
    """{"parts": ..., "balanced": ...}: max, mean and max/mean non-zeros per rank of ``spec``
    (3D: the worst of the three orientations) under the partition and the balanced layout."""
    if partition.num_parts != spec.size:
        raise InputError(f"grid {spec.text} has {spec.size} ranks but the partition has "
                         f"{partition.num_parts} parts; they must be equal")
    n = partition.owner.shape[0]
    out = {}
    for label, owner in (("parts", partition.owner),
                         ("balanced", balanced_owner(n, spec.size, spec.seed))):
        worst = None
        for k in range(3 if len(spec.dims) == 3 else 1):
            counts = nnz_per_rank(indptr, indices, owner, spec.dims, k)
            mean = float(counts.mean()) if counts.size else 0.0
            ratio = float(counts.max() / mean) if mean > 0 else 1.0
            if worst is None or ratio > worst["max_over_mean"]:
                worst = {"max": int(counts.max()), "mean": mean, "max_over_mean": ratio}
        out[label] = worst
    return out
