"""One rank's shard in memory: the arrays :mod:`shards` writes and loads, built from a graph.

:class:`ShardBuilder` makes three passes over the graph's CSR (``partitioners/shard_kernels.py``)
in O(n) memory, never holding S = A' + I, its values or its transpose:

1. the degree pass: each vertex's normalisation sums, so each value of Â is computed from its
   row and column alone, the same bits as ``datasets/normalize.values_for`` on the whole S;
2. the halo pass, part by part: each part's halo (the columns its rows read from other parts),
   sorted by owner rank then id, its cut entries and its non-zeros. Send lists come from the
   other parts' halos (what q reads from r is q's halo segment owned by r): no transpose.
   For a canonical CSR with a symmetric pattern (and at most :data:`MAX_BITS_PARTS` parts)
   every part's halo comes from one sequential pass instead (``shard_kernels.halo_bits_pass``:
   each vertex's own row names the parts that read it; ``parts / 64`` words a vertex, freed
   after). Otherwise the per-part pass is made for all parts up front, or (``halos=False``,
   the disk writer) by each part's task just before that part's rows
   (:meth:`ShardBuilder.rows_with_halo`), the send lists written once every task is done;
3. :meth:`ShardBuilder.structure`, one part at a time: its rows with local columns, values, raw
   weights and ``orig_edge``.

Passes 2 and 3 may run in several forked processes (``jobs``, ``partitioners/part_pool.py``),
each reading the same (memory-mapped) graph. Node data is gathered by :meth:`ShardBuilder.build`
for in-memory use; the disk writer streams ``x`` in row blocks instead (``shards.write_shards``).
The disk writer and :func:`build_shard` both go through :meth:`ShardBuilder.structure`, so an
in-memory shard and a loaded one are array-for-array equal; ``tests/test_shard_stream.py`` holds
them to a reference that builds S whole (``tests/shard_reference.py``).

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

import os
import time
from dataclasses import dataclass, field

import numpy as np

from gnnpar.datasets import Graph, InputError
from gnnpar.datasets.normalize import KINDS, sum_values

from .csr_rows import pattern_facts
from .part_pool import map_parts
from .node_stream import release
from .partition import Partition
from .shard_kernels import GROUP_SHIFT, kernels

NODE_ARRAYS = ("x", "y", "train_mask", "val_mask", "test_mask")
#: parts up to which a symmetric graph's halos come from one pass of per-vertex part bits
#: (``words = parts / 64`` uint64 a vertex: 32 bytes a vertex at most)
MAX_BITS_PARTS = 256


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
    """Global O(n) precomputation over ``graph``'s CSR (see module docstring); :meth:`build` and
    :meth:`structure` cut one rank's shard."""

    def __init__(self, graph: Graph, partition: Partition, norms=("gcn", "mean"), jobs: int = 1,
                 progress=None, halos: bool = True):
        partition.validate(graph.num_nodes)
        self.graph, self.partition = graph, partition
        self.norms = check_norms(norms)
        self.jobs = max(1, int(jobs))
        say = progress or (lambda msg: None)
        n = graph.num_nodes
        self.indptr = np.asarray(graph.indptr)
        self.indices = np.asarray(graph.indices)
        ew = graph.edge_weight
        self.weighted = ew is not None
        self.weight = np.asarray(ew) if self.weighted else np.zeros(1, np.float64)
        wide = self.weighted and self.weight.dtype == np.float64
        self.raw_dtype = np.float64 if wide else np.float32
        facts = pattern_facts(graph)  # made once per graph: the partitioner may have asked
        self.canonical = facts["canonical"]
        self.symmetric = bool(facts["symmetric"])  # False when not known: sums made the long way
        deg = np.diff(self.indptr)
        self.scratch_len = int(deg.max()) + 1 if n else 1
        del deg
        t0 = time.perf_counter()
        self._degrees()
        self.release()
        say(f"normalisation sums of {n:,} vertices ({time.perf_counter() - t0:.1f} s)")
        self.owner = partition.owner
        self.local_id = partition.local_index()
        self.halo_ids = None
        t0 = time.perf_counter()
        if self.canonical and self.symmetric and self.parts <= MAX_BITS_PARTS:
            self._halos_from_bits()  # one sequential pass for all parts: always worth it
        elif halos:
            self.take_halos(map_parts(self, ShardBuilder.halo_of, range(self.parts), self.jobs,
                                      before_fork=kernels))
        if self.halo_ids is not None:
            self.release()
            say(f"halos of {self.parts} parts: {int(sum(h.size for h in self.halo_ids)):,} rows "
                f"({time.perf_counter() - t0:.1f} s)")

    # ---------------------------------------------------------------- global passes
    @property
    def parts(self) -> int:
        return self.partition.num_parts

    def _scratch(self):
        m = self.scratch_len
        return (np.empty(m, np.int64), np.empty(m, np.float64), np.empty(m, np.int64),
                np.empty(m, np.float64))

    def _degrees(self) -> None:
        n = self.graph.num_nodes
        rowsum_gcn, colsum_gcn, rowsum_raw = np.zeros(n), np.zeros(n), np.zeros(n)
        first_neg = np.zeros((2, 4), np.float64)
        if self.canonical and not self.weighted:  # unit weights: integer sums, no S rows
            self.nnz_total = int(kernels().degree_pass_unit(
                self.indptr, self.indices, self.symmetric, rowsum_gcn, colsum_gcn, rowsum_raw))
        else:
            self.nnz_total = int(kernels().degree_pass(
                self.indptr, self.indices, self.weight, self.weighted, self.canonical,
                self._scratch(), rowsum_gcn, colsum_gcn, rowsum_raw, first_neg))
        why = {"gcn": (0, "D^-1/2 (A+I) D^-1/2 takes each weighted degree's square root"),
               "mean": (1, "D^-1 A divides by each weighted degree")}
        for kind in self.norms:
            if kind in why and first_neg[why[kind][0], 0]:
                count, row, col, value = first_neg[why[kind][0]]
                raise InputError(f"the {kind} normalisation needs edge weights >= 0 "
                                 f"({why[kind][1]}); {int(count):,} edge(s) have a negative "
                                 f"weight, the first {int(col)} -> {int(row)} ({value:g}); only "
                                 "'sum' aggregation takes negative weights")
        # the divisions of datasets/normalize.values_for, on the same sums
        self.rinv = np.divide(1.0, np.sqrt(rowsum_gcn), out=np.zeros(n), where=rowsum_gcn > 0)
        self.cinv = np.divide(1.0, np.sqrt(colsum_gcn), out=np.zeros(n), where=colsum_gcn > 0)
        self.inv = np.divide(1.0, rowsum_raw, out=np.zeros(n), where=rowsum_raw != 0)

    def _per_vertex(self):
        """(seen, found, table): n-long scratch arrays of this process, made once and reused
        by every part it builds: ``seen`` is -1 except while a part's halo pass marks it (and
        clears its marks after), and a part reads ``table`` (rows_pass's column table) only at
        its own rows' columns, which it has just written."""
        if getattr(self, "_scratch_pid", None) != os.getpid():  # a forked job makes its own
            n = max(self.graph.num_nodes, 1)
            self._vertex_scratch = (np.full(n, -1, np.int32), np.empty(n, np.int64),
                                    np.empty((n, 2), np.int64))
            self._scratch_pid = os.getpid()
        return self._vertex_scratch

    def release(self) -> None:
        """Hand the graph's mapped structure pages back to the page cache after a pass, so a
        pass over a memory-mapped graph does not leave all of it in the resident set."""
        for arr in (self.indptr, self.indices, self.weight):
            release(arr)

    def take_halos(self, results) -> None:
        """Every part's :meth:`halo_of`, in part order: what :meth:`structure`'s send lists
        and :meth:`quality_counts` need. Made in ``__init__``, or (``halos=False``) by the
        disk writer's part tasks, each beside its part's rows (:meth:`rows_with_halo`)."""
        results = list(results)
        self.halo_ids = [r[0] for r in results]
        self.recv_counts = [r[1] for r in results]
        self.cut = np.array([r[2] for r in results], np.int64)
        self.part_nnz = np.array([r[3] for r in results], np.int64)

    def _halos_from_bits(self) -> None:
        """Every part's :meth:`halo_of` at once, for a canonical CSR with a symmetric pattern
        (``shard_kernels.halo_bits_pass``): one pass over the rows in order instead of a pass
        a part with a random read per entry."""
        n, P = self.graph.num_nodes, self.parts
        words = (P + 63) // 64
        bits = np.zeros((max(n, 1), words), np.uint64)
        cut, nnz = np.zeros(P, np.int64), np.zeros(P, np.int64)
        owner = self.owner.astype(np.int8 if P <= 127 else np.int16)  # small: stays in cache
        kernels().halo_bits_pass(self.indptr, self.indices, owner, bits, cut, nnz)
        offsets, recv = np.zeros(P + 1, np.int64), np.zeros((P, P), np.int64)
        perm = self.partition.perm
        kernels().halo_lists(perm, bits, owner, offsets, np.zeros(0, np.int64), recv)
        flat = np.empty(max(int(offsets[-1]), 1), np.int64)
        kernels().halo_lists(perm, bits, owner, offsets, flat, recv)
        self.take_halos((flat[offsets[p]:offsets[p + 1]], recv[p], int(cut[p]), int(nnz[p]))
                        for p in range(P))

    def work_estimate(self) -> np.ndarray:
        """(parts,) stored entries of each part's rows: its work, known before its halo."""
        return np.bincount(self.owner, weights=np.diff(self.indptr), minlength=self.parts)

    def halo_of(self, rank: int):
        """(halo ids by owner then id, recv counts, cut entries, non-zeros) of one part."""
        n = self.graph.num_nodes
        seen, buf, _ = self._per_vertex()
        h, cut, nnz = kernels().halo_pass(
            self.indptr, self.indices, self.weight, self.weighted, self.canonical,
            self._scratch(), self.partition.vertices(rank), self.owner, rank, seen, buf)
        found = buf[:h].copy()
        seen[found] = -1  # back to "nobody's", so a part may be asked again
        key = np.sort(self.owner[found].astype(np.int64) * max(n, 1) + found)
        halo = key % max(n, 1)
        recv = np.bincount(key // max(n, 1), minlength=self.parts).astype(np.int64)
        return halo, recv, int(cut), int(nnz)

    # ---------------------------------------------------------------- one part
    def sends(self, rank: int):
        """(send_local, send_counts): the local ids each other part reads from ``rank``,
        grouped by destination, ascending inside a group (the receiver's halo order)."""
        groups, counts = [], np.zeros(self.parts, np.int64)
        for q in range(self.parts):
            if q == rank:
                continue
            off = np.concatenate([[0], np.cumsum(self.recv_counts[q])])
            ids = self.halo_ids[q][off[rank]:off[rank + 1]]
            groups.append(self.local_id[ids])
            counts[q] = ids.size
        send = np.concatenate(groups).astype(np.int64) if groups else np.zeros(0, np.int64)
        return send, counts

    def structure(self, rank: int) -> dict:
        """Part ``rank``'s S rows and exchange lists, named as ``Shard``'s fields."""
        if not 0 <= rank < self.parts:
            raise InputError(f"rank {rank} is outside [0, {self.parts}) for a partition into "
                             f"{self.parts} parts")
        self._need_halos()
        arrays = self._rows(rank, self.halo_ids[rank], self.recv_counts[rank],
                            int(self.part_nnz[rank]))
        arrays["send_local"], arrays["send_counts"] = self.sends(rank)
        return arrays

    def rows_with_halo(self, rank: int):
        """(:meth:`halo_of`, the part's arrays without the send lists) in one go, for a
        builder made with ``halos=False``: the part's rows are read twice in a row (the halo
        pass, then the rows pass), the second time from the CPU's cache."""
        found = self.halo_of(rank)
        return found, self._rows(rank, found[0], found[1], found[3])

    def _rows(self, rank: int, halo: np.ndarray, recv_counts, nnz: int) -> dict:
        owned = self.partition.vertices(rank)
        n_local = owned.shape[0]
        _, _, table = self._per_vertex()  # column -> (group, local id), cinv; only this part's read
        table_f = table.view(np.float64)
        table[owned, 0] = np.arange(n_local, dtype=np.int64)
        group = self.owner[halo].astype(np.int64) + 1
        table[halo, 0] = (group << GROUP_SHIFT) | (n_local + np.arange(halo.size, dtype=np.int64))
        table_f[owned, 1] = self.cinv[owned]
        table_f[halo, 1] = self.cinv[halo]
        indptr = np.zeros(n_local + 1, np.int64)
        cols, raw = (np.empty(nnz, np.int64),
                     np.empty(nnz, self.raw_dtype))  # rounded once, in the pass
        orig = np.empty(nnz, np.bool_)
        gcn, mean = np.empty(nnz, np.float32), np.empty(nnz, np.float32)
        kernels().rows_pass(self.indptr, self.indices, self.weight, self.weighted,
                            self.canonical, self._scratch(), owned, table, table_f,
                            self.parts, self.rinv, self.inv, indptr, cols, raw, orig, gcn, mean)
        made = {"gcn": gcn, "mean": mean}
        if "sum" in self.norms:
            made["sum"] = sum_values(raw)
        values = {k: made[k] for k in self.norms}
        return {"global_ids": owned.astype(np.int64), "indptr": indptr, "indices": cols,
                "values": values, "raw_weight": raw, "orig_edge": orig,
                "halo_ids": halo.astype(np.int64), "recv_counts": recv_counts}

    def shard_meta(self) -> dict:
        p = self.partition
        return {"method": p.method, "seed": p.seed, "parts": self.parts, "norms": list(self.norms)}

    def build(self, rank: int) -> Shard:
        """Rank ``rank``'s :class:`Shard` in memory (node rows gathered from the graph)."""
        g = self.graph
        arrays = self.structure(rank)
        owned = arrays["global_ids"]
        node = {name: np.asarray(getattr(g, name))[owned] for name in NODE_ARRAYS}
        return Shard(rank=rank, world_size=self.parts, n_global=g.num_nodes,
                     num_classes=int(g.num_classes), meta=self.shard_meta(), **arrays, **node)

    def _need_halos(self) -> None:
        if self.halo_ids is None:
            raise ValueError("this ShardBuilder was made with halos=False and its halos were "
                             "not taken yet (write_shards takes them from its part tasks)")

    def quality_counts(self) -> dict:
        """What the quality report needs from S, from the passes already made."""
        self._need_halos()
        return {"nnz": self.nnz_total, "edge_cut": int(self.cut.sum()), "part_nnz": self.part_nnz,
                "halo": np.array([h.size for h in self.halo_ids], np.int64),
                "off_diagonal": self.nnz_total - self.graph.num_nodes}


def build_shard(graph: Graph, partition: Partition, rank: int, norms=("gcn", "mean")) -> Shard:
    """Rank ``rank``'s :class:`Shard` in memory, identical to what :func:`load_shard` returns
    after :func:`write_shards` (for many ranks, build one :class:`ShardBuilder` and reuse it)."""
    return ShardBuilder(graph, partition, norms).build(rank)


def build_shards(graph: Graph, partition: Partition, norms=("gcn", "mean")) -> list:
    """Every rank's :class:`Shard` (in-memory tests; the writer streams instead)."""
    builder = ShardBuilder(graph, partition, norms)
    return [builder.build(r) for r in range(partition.num_parts)]
