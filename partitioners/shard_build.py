"""One rank's shard in memory: the arrays :mod:`shards` writes and loads, built from a graph.

:class:`ShardBuilder` computes everything global once (the union structure S = A' + I, its values
for each norm on the *whole* graph, its transpose, each vertex's local id) and then cuts any
rank's shard from it, reading only that rank's rows (and, for send lists, its columns). The disk
writer and :func:`build_shard` both go through :meth:`ShardBuilder.build`, so an in-memory shard
and a loaded one are array-for-array equal.

Shapes for rank r with ``n_local`` owned vertices, ``n_halo`` halo vertices, ``nnz`` non-zeros:

- ``global_ids`` (n_local,) int64, ascending: local id -> global id;
- ``indptr`` (n_local+1,), ``indices`` (nnz,) int64: r's rows of S, columns renumbered
  ``[0, n_local)`` owned (local order), ``[n_local, n_local+n_halo)`` halo; sorted within a row;
- ``values[kind]`` (nnz,) float32 and ``raw_weight`` (nnz,) float32 (float64 when A's weights
  are) holding S's raw weights: 1.0 for an unweighted edge, the loop weight or 0.0 for an added
  loop; ``orig_edge`` (nnz,) bool: the entry
  is an edge of the original A (False only for the loops S adds);
- ``halo_ids`` (n_halo,) int64 ordered by owner rank, then ascending id; ``recv_counts`` (P,);
- ``send_local`` int64 local ids to send, grouped by destination rank (ascending), each group in
  ascending id = the order of the receiver's halo for this owner; ``send_counts`` (P,);
- ``x`` (n_local, f), ``y`` (n_local,), ``train_mask`` / ``val_mask`` / ``test_mask`` (n_local,).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gnnpar.datasets import Graph, InputError
from gnnpar.datasets.normalize import KINDS, union_structure, values_for

from .csr_rows import gather_rows, sorted_csr
from .partition import Partition

NODE_ARRAYS = ("x", "y", "train_mask", "val_mask", "test_mask")


class LocalRows:
    """Sizes shared by every rank-local slice of Â (a :class:`Shard`, a sampled block's
    shard): owned rows ``global_ids``, halo columns ``halo_ids``, CSR ``indices``."""

    @property
    def n_local(self) -> int:
        return int(self.global_ids.shape[0])

    @property
    def n_halo(self) -> int:
        return int(self.halo_ids.shape[0])

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    def column_ids(self) -> np.ndarray:
        """Global id of every local column, (n_local + n_halo,) int64."""
        return np.concatenate([np.asarray(self.global_ids), np.asarray(self.halo_ids)])


@dataclass
class Shard(LocalRows):
    """Everything rank ``rank`` of ``world_size`` needs (see module docstring for shapes)."""

    rank: int
    world_size: int
    n_global: int
    num_classes: int
    global_ids: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    values: dict
    raw_weight: np.ndarray
    orig_edge: np.ndarray
    halo_ids: np.ndarray
    recv_counts: np.ndarray
    send_counts: np.ndarray
    send_local: np.ndarray
    x: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    meta: dict = field(default_factory=dict)


    @staticmethod
    def _offsets(counts) -> np.ndarray:
        out = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=out[1:])
        return out

    @property
    def recv_offsets(self) -> np.ndarray:
        """(P+1,) start of each owner's rows inside the halo."""
        return self._offsets(self.recv_counts)

    @property
    def send_offsets(self) -> np.ndarray:
        """(P+1,) start of each destination's group inside ``send_local``."""
        return self._offsets(self.send_counts)


def check_norms(norms) -> tuple:
    norms = tuple(norms)
    for kind in norms:
        if kind not in KINDS:
            raise InputError(f"unknown normalisation {kind!r}; choose from {', '.join(KINDS)}")
    if len(set(norms)) != len(norms):
        raise InputError(f"norms must not repeat, got {norms}")
    return norms


class ShardBuilder:
    """Global precomputation once; :meth:`build` cuts one rank's :class:`Shard`."""

    def __init__(self, graph: Graph, partition: Partition, norms=("gcn", "mean")):
        partition.validate(graph.num_nodes)
        self.graph, self.partition = graph, partition
        self.norms = check_norms(norms)
        n = graph.num_nodes
        self.indptr, self.indices, raw = union_structure(graph)
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.indptr))
        self.values = {k: values_for(k, self.indptr, self.indices, raw) for k in self.norms}
        wide = graph.edge_weight is not None and np.asarray(graph.edge_weight).dtype == np.float64
        self.raw = raw.astype(np.float64 if wide else np.float32)
        is_loop = rows == self.indices
        has_loop = np.zeros(n, bool)
        src, dst = graph.edges()
        has_loop[src[src == dst]] = True
        self.orig = ~is_loop | has_loop[rows]
        del rows, is_loop, raw
        # columns of S: which rows read each vertex (for the send lists)
        import scipy.sparse as sp
        csc = sp.csr_matrix((np.ones(self.indices.shape[0], np.int8), self.indices, self.indptr),
                            shape=(n, n)).tocsc()
        self.t_indptr, self.t_rows = csc.indptr.astype(np.int64), csc.indices.astype(np.int64)
        del csc
        self.owner = partition.owner
        self.local_id = partition.local_index()

    @property
    def parts(self) -> int:
        return self.partition.num_parts

    def _rows(self, rank: int, owned: np.ndarray):
        """r's rows of S renumbered local + halo; the halo and its per-owner counts."""
        n, P = self.graph.num_nodes, self.parts
        entry, local_row, _ = gather_rows(self.indptr, owned)
        cols = self.indices[entry]
        col_owner = self.owner[cols].astype(np.int64)
        remote = col_owner != rank
        # key sorts the halo by owner rank, then global id
        key = col_owner[remote] * n + cols[remote]
        halo_key = np.unique(key)
        halo_ids = halo_key % max(n, 1)
        recv_counts = np.bincount(halo_key // max(n, 1), minlength=P).astype(np.int64)
        local_col = np.empty(cols.shape[0], np.int64)
        local_col[~remote] = self.local_id[cols[~remote]]
        local_col[remote] = owned.shape[0] + np.searchsorted(halo_key, key)
        order, indptr = sorted_csr(local_row, local_col, owned.shape[0])
        return entry[order], indptr, local_col[order], halo_ids, recv_counts

    def _sends(self, rank: int, owned: np.ndarray):
        """Local ids each other rank reads from r, grouped by destination, ascending inside."""
        P, n_local = self.parts, owned.shape[0]
        t_entry, local_v, _ = gather_rows(self.t_indptr, owned)
        dest = self.owner[self.t_rows[t_entry]].astype(np.int64)
        remote = dest != rank
        key = np.unique(dest[remote] * max(n_local, 1) + local_v[remote])
        dest_sorted, send_local = np.divmod(key, max(n_local, 1))
        return send_local.astype(np.int64), np.bincount(dest_sorted, minlength=P).astype(np.int64)

    def build(self, rank: int) -> Shard:
        P = self.parts
        if not 0 <= rank < P:
            raise InputError(f"rank {rank} is outside [0, {P}) for a partition into {P} parts")
        g = self.graph
        owned = self.partition.vertices(rank)
        entry, indptr, indices, halo_ids, recv_counts = self._rows(rank, owned)
        send_local, send_counts = self._sends(rank, owned)
        node = {name: np.asarray(getattr(g, name))[owned] for name in NODE_ARRAYS}
        return Shard(
            rank=rank, world_size=P, n_global=g.num_nodes, num_classes=int(g.num_classes),
            global_ids=owned.astype(np.int64), indptr=indptr, indices=indices,
            values={k: v[entry] for k, v in self.values.items()}, raw_weight=self.raw[entry],
            orig_edge=self.orig[entry], halo_ids=halo_ids.astype(np.int64),
            recv_counts=recv_counts, send_counts=send_counts, send_local=send_local,
            meta={"method": self.partition.method, "seed": self.partition.seed,
                  "parts": P, "norms": list(self.norms)},
            **node)


def build_shard(graph: Graph, partition: Partition, rank: int, norms=("gcn", "mean")) -> Shard:
    """Rank ``rank``'s :class:`Shard` in memory, identical to what :func:`load_shard` returns
    after :func:`write_shards` (for many ranks, build one :class:`ShardBuilder` and reuse it)."""
    return ShardBuilder(graph, partition, norms).build(rank)


def build_shards(graph: Graph, partition: Partition, norms=("gcn", "mean")) -> list:
    """Every rank's :class:`Shard` (in-memory tests; the writer streams instead)."""
    builder = ShardBuilder(graph, partition, norms)
    return [builder.build(r) for r in range(partition.num_parts)]
