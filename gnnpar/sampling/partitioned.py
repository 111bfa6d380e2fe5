"""The sampling structure partitioned (``--no-replicate-graph``): each rank keeps its own rows.

A rank holds the off-diagonal rows of Â for the vertices it owns (columns as global ids,
ascending within a row — the same canonical order as the replicated
:class:`~gnnpar.sampling.topology.Topology`) plus the few per-vertex vectors a sampler needs
for *any* row: the degree, Â_ii per kind, and the owner map shared with the feature store.

Memory per rank (e_r ≈ e/p own entries, K kinds, n vertices):

    partitioned:  8(n_r+1) + e_r·(4 + 4K) + 8n (degree) + 4nK (Â_ii) + 8n (owner map)
    replicated:   8(n+1)   + e·(4 + 4K)   + 4nK                      + 8n (owner map)

(4 → 8 bytes per column id from 2³¹ vertices). On ``rmat:scale=17,ef=16`` with K = 1 at 4
ranks: ≈ 9.3 MB against ≈ 31.4 MB per rank.

Sampling a layer: the chooser draws positions from degrees alone, so the draws are exactly
those of the replicated structure; then one *lookup*: rows this rank owns are read in
place, the other kept entries are asked of their owners — a count all-to-all, one
all-to-all of (row at the owner, position) pairs (16 B per kept entry) and two of the
answers (column 8 B, value 4 B), counted in phase ``sampling``. The bulk sampler does one
lookup per layer for a whole macrobatch. Lookups are collectives: every rank's sampler runs
the same number of layers of the same number of (mini/macro)batches, in the same order.

Shapes: lookup rows ``dst`` (R,), ``k`` (R,), ``pos`` (Σk,) → cols (Σk,) int64, vals float32.
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np
import torch

from gnnpar.datasets import InputError
from gnnpar.kernels.dist_op import shard_values
from gnnpar.kernels.local import as_tensor

from gnnpar.sampling.topology import _check_kinds, index_dtype


class PartitionedTopology:
    """This rank's rows plus the replicated per-vertex vectors (see module docstring)."""

    replicated = False

    def __init__(self, indptr: np.ndarray, entries: np.ndarray, degree: np.ndarray,
                 self_values: Dict[str, np.ndarray], in_rows: np.ndarray, owner: np.ndarray,
                 local_index: np.ndarray, rank: int):
        self.indptr, self.entries, self.degree = indptr, entries, degree
        self.self_values, self._in_rows = self_values, in_rows
        self.owner, self.local_index, self.rank = owner, local_index, int(rank)

    @property
    def num_nodes(self) -> int:
        return int(self.degree.shape[0])

    @property
    def kinds(self) -> tuple:
        return tuple(self.self_values)

    def check_kind(self, kind: str) -> None:
        if kind not in self.self_values:
            raise InputError(f"the sampling topology holds normalisations {list(self.kinds)}, "
                             f"not {kind!r}")

    def in_rows(self) -> np.ndarray:
        """How many rows of the whole adjacency list each vertex, (n,) int64."""
        return self._in_rows

    def nbytes(self) -> int:
        """Bytes of the sampling structure on this rank (the owner map is the feature store's)."""
        arrays = [self.indptr, self.entries, self.degree, *self.self_values.values()]
        return int(sum(a.nbytes for a in arrays))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_shard(cls, shard, comm, axes, kinds: Sequence[str], owner: np.ndarray,
                   local_index: np.ndarray, rank: int) -> "PartitionedTopology":
        """From this rank's shard; the per-vertex vectors by all-gathers (setup traffic)."""
        kinds = _check_kinds(kinds)
        values = {k: shard_values(shard, k) for k in kinds}  # refuses a kind it lacks
        n, n_local = int(shard.n_global), shard.n_local
        ids = np.asarray(shard.global_ids, np.int64)
        indptr = np.asarray(shard.indptr, np.int64)
        rows = np.repeat(np.arange(n_local, dtype=np.int64), np.diff(indptr))
        cols = shard.column_ids()[np.asarray(shard.indices)]
        diag = cols == ids[rows]
        own_self = {}
        for k in kinds:
            sv = np.zeros(n_local, np.float32)
            sv[rows[diag]] = values[k][diag]
            own_self[k] = sv
        off = np.flatnonzero(~diag)
        off = off[np.lexsort((cols[off], rows[off]))]
        own_indptr = np.zeros(n_local + 1, np.int64)
        np.cumsum(np.bincount(rows[off], minlength=n_local), out=own_indptr[1:])
        fields = [("col", index_dtype(n))] + [(k, np.float32) for k in kinds]
        entries = np.empty(off.shape[0], fields)
        entries["col"] = cols[off]
        for k in kinds:
            entries[k] = values[k][off]
        # per-vertex vectors: every rank's part, placed by the owner map (ids ascending per rank)
        by_rank = np.argsort(owner, kind="stable")
        cuts = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=comm.grid.size(axes)))])
        sizes = np.diff(cuts).tolist()

        def replicate(mine: np.ndarray, dtype) -> np.ndarray:
            parts = comm.all_gather(as_tensor(mine, dtype), axes, sizes)
            out = np.empty(n, dtype)
            for r, part in enumerate(parts):
                out[by_rank[cuts[r]:cuts[r + 1]]] = part.numpy()
            return out

        degree = replicate(np.diff(own_indptr), np.int64)
        self_values = {k: replicate(own_self[k], np.float32) for k in kinds}
        in_rows = torch.as_tensor(np.bincount(cols[off], minlength=n).astype(np.int64))
        comm.all_reduce(in_rows, axes)
        return cls(own_indptr, entries, degree, self_values, in_rows.numpy(), owner,
                   local_index, rank)

    # ------------------------------------------------------------------ sampling
    def lookup(self, dst: np.ndarray, k: np.ndarray, pos: np.ndarray, kind: str, comm, axes):
        """Columns and values of the kept entries (row dst[i] keeps positions pos of its
        k[i] slots), in row order — the same arrays the replicated structure reads."""
        row = np.repeat(np.asarray(dst, np.int64), k)
        own = self.owner[row].astype(np.int64)
        cols = np.empty(row.shape[0], np.int64)
        vals = np.empty(row.shape[0], np.float32)
        here = np.flatnonzero(own == self.rank)
        kept = self.entries[self.indptr[self.local_index[row[here]]] + pos[here]]
        cols[here], vals[here] = kept["col"], kept[kind]
        far = np.flatnonzero(own != self.rank)
        far = far[np.argsort(own[far], kind="stable")]
        size = len(comm.grid.ranks_of(axes))
        send_counts = np.bincount(own[far], minlength=size)
        with comm.in_phase("sampling"):
            recv_counts = comm.all_to_all(torch.as_tensor(send_counts).reshape(size, 1),
                                          [1] * size, [1] * size, axes).reshape(-1).numpy()
            ask = np.stack([self.local_index[row[far]].astype(np.int64), pos[far]], axis=1)
            asked = comm.all_to_all(torch.from_numpy(ask), send_counts, recv_counts,
                                    axes).numpy()
            found = self.entries[self.indptr[asked[:, 0]] + asked[:, 1]]
            got_cols = comm.all_to_all(torch.from_numpy(found["col"].astype(np.int64)),
                                       recv_counts, send_counts, axes)
            got_vals = comm.all_to_all(torch.from_numpy(np.ascontiguousarray(found[kind])),
                                       recv_counts, send_counts, axes)
        cols[far], vals[far] = got_cols.numpy(), got_vals.numpy()
        return cols, vals
