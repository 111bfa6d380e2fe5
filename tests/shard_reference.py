"""The shard builder gnnpar had before shards were built by streaming, kept as a test oracle.

It builds S = A' + I whole (``datasets/normalize.union_structure``), its values on the whole
graph (``values_for``) and its transpose (scipy), then cuts each rank's rows and send lists from
them: simple, and several copies of the graph in memory. ``partitioners/shard_build.py`` must
give the same arrays bit for bit (``tests/test_shard_stream.py``).
"""
from __future__ import annotations

import numpy as np

from gnnpar.datasets import Graph, InputError
from gnnpar.datasets.normalize import union_structure, values_for
from gnnpar.partitioners.csr_rows import gather_rows, sorted_csr
from gnnpar.partitioners.partition import Partition
from gnnpar.partitioners.shard_build import NODE_ARRAYS, Shard, check_norms


class ReferenceBuilder:
    """S, its values and its transpose built whole; :meth:`build` cuts one rank's shard."""

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


def reference_shards(graph: Graph, partition: Partition, norms=("gcn", "mean")) -> list:
    builder = ReferenceBuilder(graph, partition, norms)
    return [builder.build(r) for r in range(partition.num_parts)]
