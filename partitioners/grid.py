"""2D and 3D block layouts of the propagation matrix Â for grid algorithms (SUMMA, 3D).

A layout fixes a *grid vertex order* ``order`` (n,) (grid position -> global id) and, for every
grid axis ``a`` of size ``dims[a]``, position boundaries ``bounds[a]`` (dims[a]+1,). Block
``(i, j)`` of Â for the orientation (row axis ``a``, column axis ``b``) is the sub-matrix with
rows at positions ``[bounds[a][i], bounds[a][i+1])`` and columns at
``[bounds[b][j], bounds[b][j+1])`` of ``Â[order][:, order]``. The same order is used for rows and
columns, so a layer's output rows are in the order its next layer's columns expect.

Order and boundaries:

- ``permute=False``: the partition's order (``Partition.perm``; identity without a partition).
  Boundaries follow part boundaries: axis ``a`` groups ``P / dims[a]`` consecutive parts (the grid
  size always equals the part count), so with METIS the diagonal blocks hold the dense parts.
- ``permute=True``: a seeded uniformly random vertex order with even boundaries
  (``k * n // dims[a]``). This spreads the hubs of a skewed graph over all blocks, which balances
  non-zeros per block (Plexus reports max/mean 7.7 -> 1.001); :func:`nnz_balance` measures it.

Ranks and orientations. Ranks are row-major grid coordinates: 2D ``rank = i*pc + j``, 3D
``rank = (x*py + y)*pz + z``. An orientation ``(a, b)`` names the row axis and the column axis;
it is written with the axis letters (2D: ``r``, ``c``; 3D: ``x``, ``y``, ``z``), e.g. ``"rc"`` or
``"yx"``. In 2D the rank at (i, j) holds block (coord[a], coord[b]) whole. In 3D the third axis
``c`` shards that block by rows: its row range is split evenly into ``dims[c]`` pieces and the
rank holds piece ``coord[c]`` (so an all-gather over axis ``c`` rebuilds the block and each rank
keeps m/p non-zeros). Defaults: 2D ``("rc",)``; 3D all six orientations, so a kernel that rotates
axes from layer to layer finds every block it needs (a memory-mapped load only touches the ones it
reads).

On-disk sub-format (written by :func:`gnnpar.partitioners.shards.write_shards` with ``grid=``):

- ``meta.json["grid"]``: ``dims``, ``axes`` (letters), ``permute``, ``seed``, ``orientations``,
  ``bounds`` (one list of positions per axis);
- ``OUT/grid/order.npy`` int64 (n,): position -> global id, plus ``x.npy``, ``y.npy``,
  ``train_mask.npy``, ``val_mask.npy``, ``test_mask.npy`` *in grid order*, so a rank memory-maps
  and reads only the rows of its own H block;
- ``OUT/part-0000k/grid/<orientation>/``: ``indptr.npy`` int64 (rows+1,), ``indices.npy`` int64
  (nnz,) column positions relative to the block's first column, sorted within each row, and
  ``values_<kind>.npy`` float32 (nnz,) per norm (taken from the whole-graph values, so bit-equal
  to the serial matrix); the block's ``row_range`` / ``col_range`` (grid positions, half-open)
  are in that part's ``part.json``. Row global ids are ``order[row_range]``, column ids
  ``order[col_range]``.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import numpy as np

from gnnpar.datasets import InputError

from .csr_rows import gather_rows, sorted_csr

AXES_2D = ("r", "c")
AXES_3D = ("x", "y", "z")


def _orientation_name(axes, a: int, b: int) -> str:
    return axes[a] + axes[b]


@dataclass(frozen=True)
class GridSpec:
    """Grid shape and options. ``dims`` (pr, pc) or (px, py, pz); ``orientations`` as names."""

    dims: tuple
    permute: bool = False
    seed: int = 0
    orientations: tuple = field(default=())

    def __post_init__(self):
        dims = tuple(int(d) for d in self.dims)
        if len(dims) not in (2, 3) or any(d < 1 for d in dims):
            raise InputError(f"a grid has 2 or 3 positive sizes (AxB or AxBxC), got {self.dims!r}")
        object.__setattr__(self, "dims", dims)
        axes = self.axes
        valid = [_orientation_name(axes, a, b) for a, b in itertools.permutations(range(len(dims)), 2)]
        names = tuple(self.orientations) or (("rc",) if len(dims) == 2 else tuple(valid))
        for name in names:
            if name not in valid:
                raise InputError(f"unknown orientation {name!r} for a {len(dims)}D grid; choose from {valid}")
        object.__setattr__(self, "orientations", names)

    @classmethod
    def parse(cls, text: str, permute: bool = False, seed: int = 0) -> "GridSpec":
        """``"2x3"`` or ``"2x2x2"`` -> GridSpec."""
        if not re.fullmatch(r"\d+x\d+(x\d+)?", str(text).strip()):
            raise InputError(f"--grid must look like AxB or AxBxC (e.g. 2x3), got {text!r}")
        return cls(tuple(int(t) for t in str(text).strip().split("x")), permute, seed)

    @property
    def axes(self) -> tuple:
        return AXES_2D if len(self.dims) == 2 else AXES_3D

    @property
    def size(self) -> int:
        return int(np.prod(self.dims))

    def axis_pair(self, name: str):
        """(row axis, column axis, shard axis or None) of an orientation name."""
        a, b = self.axes.index(name[0]), self.axes.index(name[1])
        rest = [k for k in range(len(self.dims)) if k not in (a, b)]
        return a, b, (rest[0] if rest else None)

    def coords(self, rank: int) -> tuple:
        return tuple(int(c) for c in np.unravel_index(rank, self.dims))

    def rank_of(self, coords) -> int:
        return int(np.ravel_multi_index(tuple(coords), self.dims))

    def to_json(self) -> dict:
        return {"dims": list(self.dims), "axes": list(self.axes), "permute": self.permute,
                "seed": self.seed, "orientations": list(self.orientations)}


def even_bounds(n: int, k: int) -> np.ndarray:
    return (np.arange(k + 1, dtype=np.int64) * n) // k


@dataclass(frozen=True)
class GridLayout:
    """A spec applied to one graph: ``order`` (n,) position -> id, ``bounds`` per axis."""

    spec: GridSpec
    order: np.ndarray
    bounds: tuple

    def positions(self) -> np.ndarray:
        """Inverse of ``order``: grid position of each global id, (n,) int64."""
        pos = np.empty(self.order.shape[0], np.int64)
        pos[self.order] = np.arange(self.order.shape[0], dtype=np.int64)
        return pos

    def ranges(self, rank: int, name: str):
        """((row_start, row_stop), (col_start, col_stop)) in positions of ``rank``'s block."""
        a, b, c = self.spec.axis_pair(name)
        coords = self.spec.coords(rank)
        r0, r1 = int(self.bounds[a][coords[a]]), int(self.bounds[a][coords[a] + 1])
        if c is not None:
            k, pieces = coords[c], self.spec.dims[c]
            r0, r1 = r0 + (r1 - r0) * k // pieces, r0 + (r1 - r0) * (k + 1) // pieces
        col = (int(self.bounds[b][coords[b]]), int(self.bounds[b][coords[b] + 1]))
        return (r0, r1), col

    def to_json(self) -> dict:
        return {**self.spec.to_json(), "bounds": [[int(v) for v in b] for b in self.bounds]}


def make_layout(n: int, spec: GridSpec, partition=None) -> GridLayout:
    """The layout of ``spec`` over ``n`` vertices on top of ``partition``'s order (or identity)."""
    if partition is not None and partition.num_parts != spec.size:
        raise InputError(f"grid {'x'.join(map(str, spec.dims))} has {spec.size} ranks but the "
                         f"partition has {partition.num_parts} parts; they must be equal")
    if spec.permute:
        order = np.random.default_rng(spec.seed).permutation(n).astype(np.int64)
        bounds = tuple(even_bounds(n, d) for d in spec.dims)
    elif partition is not None:
        order = np.asarray(partition.perm, dtype=np.int64)
        bounds = tuple(np.asarray(partition.offsets[::spec.size // d], np.int64) for d in spec.dims)
    else:
        order = np.arange(n, dtype=np.int64)
        bounds = tuple(even_bounds(n, d) for d in spec.dims)
    return GridLayout(spec, order, bounds)


@dataclass
class LocalBlock:
    """One block of Â as a local CSR. ``indptr`` (rows+1,), ``indices`` (nnz,) relative to
    ``col_range[0]``, ``values`` kind -> (nnz,) float32; ranges are grid positions."""

    name: str
    row_range: tuple
    col_range: tuple
    indptr: np.ndarray
    indices: np.ndarray
    values: dict

    @property
    def shape(self) -> tuple:
        return (self.row_range[1] - self.row_range[0], self.col_range[1] - self.col_range[0])


def extract_block(indptr, indices, values: dict, layout: GridLayout, positions: np.ndarray,
                  row_range, col_range, name: str = "") -> LocalBlock:
    """Block of the whole-graph matrix (indptr, indices, values) at the given position ranges.

    Only the block's rows are read, so the cost is that of its rows, not of the matrix.
    """
    rows = layout.order[row_range[0]:row_range[1]]
    entry, local_row, _ = gather_rows(indptr, rows)
    col_pos = positions[np.asarray(indices)[entry]]
    keep = (col_pos >= col_range[0]) & (col_pos < col_range[1])
    entry, local_row, col = entry[keep], local_row[keep], col_pos[keep] - col_range[0]
    order, block_indptr = sorted_csr(local_row, col, rows.shape[0])
    vals = {kind: np.asarray(v)[entry[order]] for kind, v in values.items()}
    return LocalBlock(name, tuple(row_range), tuple(col_range), block_indptr,
                      col[order].astype(np.int64), vals)


def nnz_per_rank(indptr, indices, layout: GridLayout, name: str = None) -> np.ndarray:
    """Non-zeros each rank holds for orientation ``name`` (default: the first), (P,) int64."""
    spec = layout.spec
    name = name or spec.orientations[0]
    a, b, c = spec.axis_pair(name)
    pos = layout.positions()
    n = pos.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(np.asarray(indptr)))
    row_pos, col_pos = pos[rows], pos[np.asarray(indices)]
    # row pieces: each row block of axis a split into dims[c] pieces (one piece in 2D)
    pieces = spec.dims[c] if c is not None else 1
    lo, hi = layout.bounds[a][:-1], layout.bounds[a][1:]
    k = np.arange(pieces + 1, dtype=np.int64)
    piece_bounds = (lo[:, None] + (hi - lo)[:, None] * k[None, :] // pieces)[:, :-1].ravel()
    piece = np.searchsorted(piece_bounds, row_pos, side="right") - 1
    # blocks with empty pieces share a bound; searchsorted picks the last (non-empty) one
    ia, ic = np.divmod(piece, pieces)
    ib = np.searchsorted(layout.bounds[b], col_pos, side="right") - 1
    coords = [None] * len(spec.dims)
    coords[a], coords[b] = ia, ib
    if c is not None:
        coords[c] = ic
    rank = np.ravel_multi_index(tuple(coords), spec.dims)
    return np.bincount(rank, minlength=spec.size).astype(np.int64)


def nnz_balance(indptr, indices, n: int, spec: GridSpec, partition=None, seed: int = 0) -> dict:
    """max/mean non-zeros per rank without and with the random permutation, for ``spec``."""
    out = {}
    for label, permute in (("before", False), ("after", True)):
        s = GridSpec(spec.dims, permute, seed, spec.orientations)
        counts = nnz_per_rank(indptr, indices, make_layout(n, s, partition))
        mean = counts.mean() if counts.size else 0.0
        out[label] = {"max": int(counts.max()), "mean": float(mean),
                      "max_over_mean": float(counts.max() / mean) if mean > 0 else 1.0}
    return out
