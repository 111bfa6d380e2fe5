"""The graph as the samplers read it: Â split into its diagonal and its off-diagonal rows.

Â is the propagation matrix of ``gnnpar.datasets.normalize`` (values computed once on the
*whole* graph, the same numbers full-batch training uses) on the structure S = A' + I. A
sampler keeps every destination's diagonal entry Â_ii exactly and samples among the
off-diagonal entries of its row (its neighbours), so:

- ``indptr`` (n+1,) int64 over the off-diagonal entries of S, columns ascending within a row
  (the canonical order: however the topology was built — from a :class:`Graph` or gathered
  from shards — the same seed draws the same neighbours);
- ``entries`` (e,) records: field ``col`` int32 (int64 when n ≥ 2³¹), the neighbour's global
  id, and one float32 field per normalisation kept, Â of that entry. A record keeps an
  entry's column and value in one 8-byte slot, so a sampled entry costs one random memory
  access instead of two (the gathers are most of a sampler's time); ``indices`` and
  ``values[kind]`` are strided views of it;
- ``self_values[kind]`` (n,) float32: Â_ii (for ``mean`` it is 0 unless A has a self loop).

Memory of a replicated topology, per rank: 8(n+1) + e·(4 or 8) + 4e·K + 4n·K bytes for K kinds
(``rmat:scale=17,ef=16``, K = 1: 1.0 + 14.9 + 14.9 + 0.5 MB ≈ 31 MB). :func:`gather_topology`
builds it from the ranks' shards with all-gathers, so every rank needs that much once more
transiently; the partitioned alternative (each rank keeps its rows only, e/p entries) is
:class:`~gnnpar.sampling.partitioned.PartitionedTopology`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Sequence

import numpy as np
import torch

from gnnpar.datasets import Graph, InputError
from gnnpar.datasets.normalize import KINDS, union_structure, values_for
from gnnpar.kernels.dist_op import shard_values
from gnnpar.kernels.local import as_tensor


def index_dtype(n: int):
    """Narrowest integer type that holds every node id of an ``n``-node graph."""
    return np.int32 if n < 2 ** 31 else np.int64


@dataclass
class Topology:
    """Off-diagonal CSR of Â plus its diagonal (see module docstring for shapes)."""

    replicated = True
    indptr: np.ndarray
    entries: np.ndarray
    self_values: Dict[str, np.ndarray]
    _degree: np.ndarray = field(default=None, repr=False)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def indices(self) -> np.ndarray:
        return self.entries["col"]

    @property
    def values(self) -> Dict[str, np.ndarray]:
        return {k: self.entries[k] for k in self.kinds}

    @property
    def degree(self) -> np.ndarray:
        """Neighbours of every row (self excluded), (n,) int64."""
        if self._degree is None:
            self._degree = np.diff(self.indptr)
        return self._degree

    @property
    def kinds(self) -> tuple:
        return tuple(self.self_values)

    def in_rows(self) -> np.ndarray:
        """How many rows list each vertex as a neighbour (column counts), (n,) int64."""
        return np.bincount(self.indices, minlength=self.num_nodes)

    def nbytes(self) -> int:
        """Bytes this topology holds (the per-rank cost of a replicated graph)."""
        arrays = [self.indptr, self.entries, *self.self_values.values()]
        return int(sum(a.nbytes for a in arrays))

    def check_kind(self, kind: str) -> None:
        if kind not in self.self_values:
            raise InputError(f"the sampling topology holds normalisations {list(self.kinds)}, "
                             f"not {kind!r}")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_graph(cls, graph: Graph, kinds: Sequence[str] = ("gcn",)) -> "Topology":
        """From a whole graph (serial runs, tests)."""
        kinds = _check_kinds(kinds)
        indptr, indices, raw = union_structure(graph)
        vals = {k: values_for(k, indptr, indices, raw) for k in kinds}
        n = graph.num_nodes
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        return cls._split(n, rows, indices, vals)

    @classmethod
    def from_entries(cls, n: int, rows: np.ndarray, cols: np.ndarray,
                     values: Dict[str, np.ndarray]) -> "Topology":
        """From the entries of S in any order (each (row, col) once): global ids, (nnz,)."""
        rows = np.asarray(rows, np.int64)
        cols = np.asarray(cols, np.int64)
        order = np.argsort(rows * max(n, 1) + cols, kind="stable")
        return cls._split(n, rows[order], cols[order],
                          {k: np.asarray(v, np.float32)[order] for k, v in values.items()})

    @classmethod
    def _split(cls, n: int, rows, cols, vals) -> "Topology":
        """Entries sorted by (row, col) → diagonal vectors and off-diagonal CSR."""
        diag = rows == cols
        self_values = {}
        for k, v in vals.items():
            sv = np.zeros(n, np.float32)
            sv[rows[diag]] = v[diag]
            self_values[k] = sv
        off = ~diag
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(rows[off], minlength=n), out=indptr[1:])
        entries = np.empty(int(np.count_nonzero(off)),
                           [("col", index_dtype(n))] + [(k, np.float32) for k in vals])
        entries["col"] = cols[off]
        for k, v in vals.items():
            entries[k] = v[off]
        return cls(indptr, entries, self_values)

def _check_kinds(kinds) -> tuple:
    kinds = tuple(dict.fromkeys(kinds))
    for k in kinds:
        if k not in KINDS:
            raise InputError(f"unknown normalisation {k!r}; choose from {', '.join(KINDS)}")
    return kinds


def gather_topology(shard, comm, axes, kinds: Sequence[str] = ("gcn",)) -> Topology:
    """The replicated topology on every rank, all-gathered from each rank's shard rows.

    Counted in ``comm``'s current phase (callers use ``setup``): every rank sends its
    ``nnz`` entries (column id 8 B + 4 B per kind) and its row ids and counts to all others.
    """

    kinds = _check_kinds(kinds)
    values = {k: shard_values(shard, k) for k in kinds}  # refuses a kind it lacks
    indptr = np.asarray(shard.indptr, np.int64)
    counts = torch.as_tensor(np.diff(indptr))
    row_ids = as_tensor(shard.global_ids, np.int64)
    cols = torch.as_tensor(shard.column_ids()[np.asarray(shard.indices)])
    sizes = [int(t) for t in torch.cat(comm.all_gather(torch.tensor([row_ids.shape[0],
                                                                     cols.shape[0]]), axes))]
    n_rows, n_ent = sizes[0::2], sizes[1::2]
    rows_all = torch.cat(comm.all_gather(row_ids, axes, n_rows)).numpy()
    counts_all = torch.cat(comm.all_gather(counts, axes, n_rows)).numpy()
    cols_all = torch.cat(comm.all_gather(cols, axes, n_ent)).numpy()
    vals = {k: torch.cat(comm.all_gather(as_tensor(values[k], np.float32), axes,
                                         n_ent)).numpy() for k in kinds}
    rows = np.repeat(rows_all, counts_all)
    return Topology.from_entries(int(shard.n_global), rows, cols_all, vals)
