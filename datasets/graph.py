"""The graph container every part of gnnpar passes around.

A :class:`Graph` holds the adjacency in CSR form (row ``i``'s neighbours are
``indices[indptr[i]:indptr[i+1]]``; an edge ``i -> j`` in row ``i`` means *i aggregates from j*),
node features, labels and the three split masks. Arrays are numpy (possibly memory-mapped), so
partitioners and readers never need torch.

Structural changes are explicit steps that return a new graph: :meth:`Graph.symmetrize` and
:meth:`Graph.add_self_loops` / :meth:`Graph.remove_self_loops`. Nothing is symmetrised or
self-looped behind the user's back; the models' normalisations (``kernels.local``) add the
self loops GCN needs themselves.
"""
from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from .errors import InputError
from .limits import check_num_classes

#: bytes of one block that :func:`row_blocks` hands out
BLOCK_BYTES = 1 << 26


def row_blocks(arr: np.ndarray, nbytes: Optional[int] = None):
    """``(first row, block)`` over ``arr`` in blocks of about ``nbytes`` (default
    :data:`BLOCK_BYTES`), each a view (no copy: a copy of every block cost a pass over
    ``x`` as much again), so a pass over a large (memory-mapped) array needs one block of
    temporaries at most.

    A read-only memory map drops the pages read so far from this process after each block
    (``MADV_DONTNEED``; the page cache keeps them, and a view of them maps them again when
    read), so a pass over a file larger than memory does not grow the resident set by the
    file's size.
    """
    arr = arr if isinstance(arr, np.ndarray) else np.asarray(arr)
    row = max(1, arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64)))
    step = max(1, int(nbytes or BLOCK_BYTES) // row)
    mm = getattr(arr, "_mmap", None) if getattr(arr, "mode", None) == "r" else None
    release = getattr(mm, "madvise", None) if hasattr(mmap, "MADV_DONTNEED") else None
    for start in range(0, arr.shape[0], step):
        yield start, np.asarray(arr[start:start + step])
        if release is not None:
            try:
                release(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # a closed map, or madvise refused: only a hint
                release = None


@dataclass
class Graph:
    """CSR graph with node data.

    Shapes: ``indptr`` (n+1,) int64, ``indices`` (m,) int64, ``edge_weight`` (m,) float32 or
    None, ``x`` (n, f) float32, ``y`` (n,) int64, masks (n,) bool.
    """

    indptr: np.ndarray
    indices: np.ndarray
    x: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    edge_weight: Optional[np.ndarray] = None
    name: str = "graph"
    meta: dict = field(default_factory=dict)

    # ---------------------------------------------------------------- sizes
    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def degrees(self) -> np.ndarray:
        """In-degree of each row (number of stored neighbours), int64 (n,)."""
        return np.diff(np.asarray(self.indptr)).astype(np.int64)

    # ---------------------------------------------------------------- checks
    def validate(self) -> "Graph":
        """Check every invariant; raise :class:`InputError` naming exactly what is wrong."""
        indptr, indices = np.asarray(self.indptr), np.asarray(self.indices)
        if indptr.ndim != 1 or indptr.shape[0] < 1:
            raise InputError(f"indptr must be a 1-D array of length n+1, got shape {indptr.shape}")
        if (not np.issubdtype(indptr.dtype, np.integer)
                or not np.issubdtype(indices.dtype, np.integer)):
            raise InputError(f"indptr/indices must be integer arrays, "
                             f"got {indptr.dtype}/{indices.dtype}")
        n, m = indptr.shape[0] - 1, indices.shape[0]
        if indptr[0] != 0 or indptr[-1] != m:
            raise InputError(f"indptr must start at 0 and end at the edge count {m}, "
                             f"got {indptr[0]}..{indptr[-1]}")
        if n > 0 and np.any(np.diff(indptr) < 0):
            raise InputError("indptr must be non-decreasing")
        if m:
            ends = [(int(b.min()), int(b.max())) for _, b in row_blocks(self.indices) if b.size]
            lo, hi = min(e[0] for e in ends), max(e[1] for e in ends)
            if lo < 0 or hi >= n:
                raise InputError(f"edge endpoint {lo if lo < 0 else hi} is out of range [0, {n})")
        if self.edge_weight is not None:
            w = self.edge_weight
            w = w if isinstance(w, np.ndarray) else np.asarray(w)
            if w.shape != (m,):
                raise InputError(f"edge_weight must have shape ({m},), got {w.shape}")
            if not all(np.all(np.isfinite(b)) for _, b in row_blocks(w)):
                raise InputError("edge_weight contains NaN or inf")
        x = self.x if isinstance(self.x, np.ndarray) else np.asarray(self.x)
        if x.ndim != 2 or x.shape[0] != n:
            raise InputError(f"x must have shape (num_nodes={n}, F), got {x.shape}")
        if x.shape[1] < 1:
            raise InputError(f"x has no feature columns (shape {x.shape}): a GNN needs at least "
                             "one input feature (give a graph without features a column of ones)")
        if not np.issubdtype(x.dtype, np.floating):
            raise InputError(f"x must be a float array, got {x.dtype}")
        bad_rows, first_bad = 0, None
        for start, block in row_blocks(x):
            bad = ~np.isfinite(block).all(axis=1)
            if bad.any():
                bad_rows += int(bad.sum())
                first_bad = start + int(np.argmax(bad)) if first_bad is None else first_bad
        if bad_rows:
            raise InputError(f"x contains NaN or inf in {bad_rows} row(s), "
                             f"first at node {first_bad}")
        y = np.asarray(self.y)
        if y.shape != (n,):
            raise InputError(f"y must have shape ({n},), got {y.shape}")
        if not np.issubdtype(y.dtype, np.integer):
            raise InputError(f"y must be an integer array, got {y.dtype}")
        if self.num_classes < 1:
            raise InputError(f"num_classes must be >= 1, got {self.num_classes}")
        check_num_classes(int(self.num_classes), n)
        if n and (y.min() < 0 or y.max() >= self.num_classes):
            bad = int(y.min()) if y.min() < 0 else int(y.max())
            raise InputError(f"label {bad} is outside [0, num_classes={self.num_classes})")
        for name in ("train_mask", "val_mask", "test_mask"):
            mask = np.asarray(getattr(self, name))
            if mask.shape != (n,):
                raise InputError(f"{name} must have shape ({n},), got {mask.shape}")
            if mask.dtype != np.bool_:
                raise InputError(f"{name} must be boolean, got {mask.dtype}")
            if not mask.any():
                raise InputError(f"{name} selects no node")
        return self

    # ---------------------------------------------------------------- structure
    @staticmethod
    def csr_from_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int,
                       weight: Optional[np.ndarray] = None, dedup: bool = True):
        """CSR (indptr, indices, weight) with row = ``dst`` (the aggregating node), sorted columns.

        Duplicate edges are merged when ``dedup`` (weights summed).
        """
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        if num_nodes < 0:
            raise InputError(f"num_nodes must be >= 0, got {num_nodes}")
        if src.shape != dst.shape or src.ndim != 1:
            raise InputError(f"src and dst must be 1-D arrays of equal length, "
                             f"got {src.shape} and {dst.shape}")
        for ends in (src, dst):
            # an out-of-range id would silently land in a neighbouring row of the key encoding
            if ends.size and (ends.min() < 0 or ends.max() >= num_nodes):
                bad = int(ends.min()) if ends.min() < 0 else int(ends.max())
                raise InputError(f"edge endpoint {bad} is out of range [0, {num_nodes})")
        key = dst * num_nodes + src
        if weight is None:
            # no payload to carry: a plain sort is about twice as fast as argsort
            key = np.sort(key)
            w = None
        else:
            order = np.argsort(key, kind="stable")
            key = key[order]
            w = np.asarray(weight, dtype=np.float32)[order]
        if dedup and key.size:
            first = np.ones(key.size, dtype=bool)
            first[1:] = key[1:] != key[:-1]
            if w is not None:
                w = np.add.reduceat(w, np.nonzero(first)[0]).astype(np.float32)
            key = key[first]
        rows, cols = np.divmod(key, num_nodes) if num_nodes else (key, key)
        indptr = np.zeros(num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=num_nodes), out=indptr[1:])
        return indptr, cols.astype(np.int64), w

    def edges(self):
        """(src, dst) int64 arrays of every stored edge (dst = row)."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.degrees())
        return np.asarray(self.indices, dtype=np.int64), dst

    def _with_edges(self, src, dst, weight) -> "Graph":
        indptr, indices, w = self.csr_from_edges(src, dst, self.num_nodes, weight)
        return replace(self, indptr=indptr, indices=indices, edge_weight=w)

    def symmetrize(self) -> "Graph":
        """Add the reverse of every edge (duplicates merged; weights of a pair taken once each
        way)."""
        src, dst = self.edges()
        w = self.edge_weight
        if w is None:
            return self._with_edges(np.concatenate([src, dst]), np.concatenate([dst, src]), None)
        # keep the max weight of each direction's copies rather than summing the pair twice
        s2, d2 = np.concatenate([src, dst]), np.concatenate([dst, src])
        w2 = np.concatenate([w, w])
        key = d2 * self.num_nodes + s2
        order = np.lexsort((-w2, key))
        key, w2 = key[order], w2[order]
        first = np.ones(key.size, dtype=bool)
        first[1:] = key[1:] != key[:-1]
        d3, s3 = np.divmod(key[first], self.num_nodes)
        return self._with_edges(s3, d3, w2[first])

    def remove_self_loops(self) -> "Graph":
        src, dst = self.edges()
        keep = src != dst
        w = None if self.edge_weight is None else np.asarray(self.edge_weight)[keep]
        return self._with_edges(src[keep], dst[keep], w)

    def add_self_loops(self, fill: float = 1.0) -> "Graph":
        """Ensure every node has exactly one self loop (existing ones are kept, weight
        unchanged)."""
        g = self.remove_self_loops() if self.edge_weight is None else self
        src, dst = g.edges()
        loops = np.arange(self.num_nodes, dtype=np.int64)
        if self.edge_weight is None:
            return self._with_edges(np.concatenate([src, loops]), np.concatenate([dst, loops]),
                                    None)
        has = np.zeros(self.num_nodes, dtype=bool)
        has[src[src == dst]] = True
        new = loops[~has]
        w = np.concatenate([np.asarray(self.edge_weight), np.full(new.size, fill, np.float32)])
        return self._with_edges(np.concatenate([src, new]), np.concatenate([dst, new]), w)

    def is_symmetric(self) -> bool:
        src, dst = self.edges()
        a = np.sort(dst * self.num_nodes + src)
        b = np.sort(src * self.num_nodes + dst)
        return bool(np.array_equal(a, b))

    def to_scipy(self):
        """scipy.sparse.csr_matrix (n × n) with edge weights, or ones."""
        import scipy.sparse as sp
        data = (np.ones(self.num_edges, np.float32) if self.edge_weight is None
                else np.asarray(self.edge_weight))
        return sp.csr_matrix((data, np.asarray(self.indices), np.asarray(self.indptr)),
                             shape=(self.num_nodes, self.num_nodes))

    # ---------------------------------------------------------------- identity
    def fingerprint(self) -> str:
        """Stable hash of structure, features, labels and masks (hex, 16 chars)."""
        h = hashlib.sha256()
        for arr in (self.indptr, self.indices, self.edge_weight, self.x, self.y,
                    self.train_mask, self.val_mask, self.test_mask):
            if arr is None:
                h.update(b"none")
                continue
            a = arr if isinstance(arr, np.ndarray) else np.asarray(arr)
            h.update(str((a.dtype.str, a.shape)).encode())
            for _, block in row_blocks(a):  # the C-order bytes, a block of rows at a time
                h.update(memoryview(np.ascontiguousarray(block)).cast("B"))
        h.update(str(self.num_classes).encode())
        return h.hexdigest()[:16]

    def summary(self) -> str:
        return (f"{self.name}: n={self.num_nodes:,} m={self.num_edges:,} f={self.num_features} "
                f"classes={self.num_classes} train/val/test="
                f"{int(np.sum(self.train_mask))}/{int(np.sum(self.val_mask))}/{int(np.sum(self.test_mask))}")


def split_masks(n: int, rng: np.random.Generator, train: float = 0.6, val: float = 0.2):
    """Random disjoint train/val/test masks with the given fractions (each at least one node).

    The masks cover all ``n`` nodes; test gets the rest, ``1 - train - val``.
    """
    if n < 3:
        raise InputError(f"need at least 3 nodes to make train/val/test splits, got {n}")
    if not (0 < train < 1 and 0 < val < 1 and train + val < 1):
        raise InputError(f"split fractions need 0 < train, val and train + val < 1, "
                         f"got train={train} val={val}")
    perm = rng.permutation(n)
    # clamp so that each of the three parts keeps at least one node, whatever the rounding
    n_tr = min(n - 2, max(1, int(round(train * n))))
    n_va = min(n - n_tr - 1, max(1, int(round(val * n))))
    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    masks[0][perm[:n_tr]] = True
    masks[1][perm[n_tr:n_tr + n_va]] = True
    masks[2][perm[n_tr + n_va:]] = True
    return masks
