"""Sampled bipartite blocks on a group of ranks: the full-batch kernels, unchanged, on a square
embedding of each block.

A sampled block B is ``n_dst × n_src`` with the destinations first among the sources
(``src[:n_dst] == dst``, :mod:`gnnpar.sampling.blocks`). Embed it as the square
``n_src × n_src`` matrix

    S = [ B ]   (rows ≥ n_dst empty),      S · H = [B · H; 0]

and give the g ranks of a group a *dst-first* ownership of the n_src vertices: rank r owns
the block-local ids ``owner == r``, in ascending id order, so its owned destinations come
before its other owned sources and ``h_local[:num_dst_local]`` are its destination rows. The
next block's sources are this block's destinations in the same order, so the next layer's
ownership is ``owner[:n_dst]`` of this one and the output rows a rank keeps are exactly the
input rows it owns in the next layer: no redistribution between layers.

Each rank's :class:`BlockShard` looks like a partitioner shard of S (own rows, columns local
then halo, send/receive lists) with the block's sampled Â values (never renormalised), so
the registry entry's ``get(algo).build(shard, comm, norm)`` builds any full-batch algorithm
on the group's sub-grid (:meth:`gnnpar.kernels.entry.Algorithm.make_group_grid`) and
:class:`BipartiteOperator` hands the layer only its ``num_dst`` destination rows
(``op.num_dst``, the models' contract).

Ownership (:func:`dst_first_owner`): the ids split into nested bands — the seeds
``[0, n_dst_L)``, then each layer's new sources — and every band is split evenly (±1 row) over
the g ranks, so every layer's rows are balanced. Inside a band a vertex goes to its
*preferred* rank (e.g. the group member holding its feature row) while that rank has room.

Trade-off of the square embedding (n_src rows where only n_dst are non-empty):

- compute and Â memory: none — empty rows hold no non-zeros (indptr grows by n_src − n_dst);
- activations: a rank holds its n_src/g input rows, as it must, and its output has only
  ``num_dst_local`` rows after the wrapper; inside the kernel the output is n_src/g rows, the
  rows ≥ n_dst zero (one extra (n_src − n_dst)·f/g floats per layer per rank, transient);
- communication: the sparsity-aware kernels (1d-halo, 1.5d/2d ``halo`` variants) move only
  rows some non-zero touches, so the empty rows cost nothing; the dense ones (1d all-gather,
  ``bcast`` variants, 3d/4d's all-gathers, reduce-scatters and feature all-to-alls) move every
  row of S, i.e. up to n_src/n_dst times the words of a true rectangular kernel on the output
  side (with fanout k, n_src ≈ k·n_dst, so the output-side collectives move about k times more
  than needed); the 3d Â pieces cover n_src rows split over the depth axis (empty ones cost
  8 bytes of indptr each).
- setup: every step is a new graph, so the builders' setup traffic (ownership all-gather, the
  non-zeros' exchange, plan all-to-alls) is paid per block, and each rank reads the whole
  block once to cut its shard (every rank of the group sampled the same minibatch).

Shapes: owner (n_src,) int64 in [0, g); a BlockShard has ``n_local`` rows (owned ids
ascending), ``num_dst`` of them destinations; h (n_local, f) → output (num_dst, f).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from gnnpar.partitioners.csr_rows import gather_rows
from gnnpar.partitioners.shard_build import LocalRows

from .algorithms import get_grouped
from .comm import Comm

# ---------------------------------------------------------------------------- ownership


def dst_first_owner(bounds: Sequence[int], g: int, prefer: Optional[np.ndarray] = None
                    ) -> np.ndarray:
    """Owner in ``[0, g)`` of block-local ids ``[0, bounds[-1])``.

    ``bounds``: increasing band ends, the seeds' count first and the input layer's n_src last
    (the n_dst of each block from the last layer outwards, then n_src of the first); every
    band ``[bounds[k−1], bounds[k])`` is split evenly over the g ranks. ``prefer`` (n_src,):
    the rank each id would rather go to, −1 for none; an id gets it while that rank has room
    in the band, the others fill the remaining room in id order.
    """
    n = int(bounds[-1]) if len(bounds) else 0
    owner = np.empty(n, np.int64)
    start = 0
    for stop in bounds:
        stop = int(stop)
        pref = prefer[start:stop] if prefer is not None else np.full(stop - start, -1)
        owner[start:stop] = _balanced(np.asarray(pref, np.int64), g)
        start = stop
    return owner


def _balanced(pref: np.ndarray, g: int) -> np.ndarray:
    """Owner of each of ``len(pref)`` ids: rank r gets ⌊len/g⌋ (+1 for r < len mod g) ids."""
    n = pref.shape[0]
    room = np.full(g, n // g, np.int64)
    room[: n % g] += 1
    owner = np.full(n, -1, np.int64)
    wants = np.flatnonzero(pref >= 0)
    if wants.size:
        p = pref[wants]
        order = np.argsort(p, kind="stable")
        firsts = np.concatenate([[0], np.cumsum(np.bincount(p, minlength=g))])
        nth = np.empty(wants.size, np.int64)
        nth[order] = np.arange(wants.size) - firsts[p[order]]
        keep = nth < room[p]
        owner[wants[keep]] = p[keep]
    left = room - np.bincount(owner[owner >= 0], minlength=g)
    owner[owner < 0] = np.repeat(np.arange(g, dtype=np.int64), left)
    return owner


# ---------------------------------------------------------------------------- shards


@dataclass
class BlockShard(LocalRows):
    """Rank ``me``'s rows of the square embedding S of one block, in the arrays a partitioner
    shard carries (the builders read these). "Global" ids are the block's local ids.

    ``global_ids`` (n_local,) owned ids ascending (``num_dst`` destinations first);
    ``indptr`` (n_local+1,), ``indices`` (nnz,): columns ``[0, n_local)`` own, then the halo
    (``halo_ids``, ordered by owner, then id; ``recv_counts`` (g,)); ``send_local`` own local
    rows each member reads, grouped by member, ascending (``send_counts`` (g,));
    ``values[norm]`` (nnz,) float32, the block's sampled values.
    """

    global_ids: np.ndarray
    n_global: int
    num_dst: int
    indptr: np.ndarray
    indices: np.ndarray
    values: Dict[str, np.ndarray]
    halo_ids: np.ndarray
    recv_counts: np.ndarray
    send_local: np.ndarray
    send_counts: np.ndarray
    meta: dict = field(default_factory=dict)


def member_rows(owner: np.ndarray, g: int):
    """``(local_of, by_owner, starts)`` of ids ``[0, len(owner))`` owned by members
    ``owner`` of ``g``: each id's row among its member's ids ascending, the ids grouped by
    member (ascending inside), and where each member's group starts (g+1,)."""
    owner = np.asarray(owner, np.int64)
    counts = np.bincount(owner, minlength=g).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    by_owner = np.argsort(owner, kind="stable")
    local_of = np.empty(owner.shape[0], np.int64)
    local_of[by_owner] = np.arange(owner.shape[0]) - starts[owner[by_owner]]
    return local_of, by_owner, starts


def block_shard(indptr, indices, values, owner: np.ndarray, me: int, g: int, norm: str
                ) -> BlockShard:
    """Rank ``me``'s :class:`BlockShard` of the block (``indptr`` (n_dst+1,), ``indices``
    (nnz,) local source ids, ``values`` (nnz,)) under ``owner`` (n_src,). Repeated entries of
    a row (sampling with replacement) are summed: one entry, hence one edge of an attention
    layer's softmax, as a sampled block's own edges hold it (:mod:`gnnpar.sampling.blocks`)."""
    indptr, indices = np.asarray(indptr, np.int64), np.asarray(indices, np.int64)
    values = np.asarray(values, np.float32)
    n_src, n_dst = int(owner.shape[0]), int(indptr.shape[0]) - 1
    local_of, by_owner, starts = member_rows(owner, g)
    mine = by_owner[starts[me]:starts[me + 1]]
    my_dst = mine[mine < n_dst]
    n_local = int(mine.shape[0])
    # own rows: columns local, then the halo grouped by owner, ascending id inside
    entry, row, _ = gather_rows(indptr, my_dst)
    cols = indices[entry]
    col_owner = owner[cols]
    remote = col_owner != me
    key = col_owner * n_src + cols
    halo_key = np.unique(key[remote])
    local_col = np.where(remote, n_local + np.searchsorted(halo_key, key), local_of[cols])
    n_ext = n_local + halo_key.shape[0]
    flat, where = np.unique(row * n_ext + local_col, return_inverse=True)
    vals = np.bincount(where.reshape(-1), weights=values[entry],
                       minlength=flat.shape[0]).astype(np.float32)
    local_indptr = np.zeros(n_local + 1, np.int64)
    np.cumsum(np.bincount(flat // max(n_ext, 1), minlength=n_local), out=local_indptr[1:])
    # what the other members read from me: own columns of their rows
    rows_all = np.repeat(np.arange(n_dst, dtype=np.int64), np.diff(indptr))
    reader = owner[rows_all]
    wanted = (owner[indices] == me) & (reader != me)
    send = np.unique(reader[wanted] * max(n_local, 1) + local_of[indices[wanted]])
    dest, send_local = np.divmod(send, max(n_local, 1))
    return BlockShard(
        global_ids=np.sort(mine), n_global=n_src, num_dst=int(my_dst.shape[0]),
        indptr=local_indptr, indices=flat % max(n_ext, 1), values={norm: vals},
        halo_ids=halo_key % max(n_src, 1),
        recv_counts=np.bincount(halo_key // max(n_src, 1), minlength=g).astype(np.int64),
        send_local=send_local.astype(np.int64),
        send_counts=np.bincount(dest, minlength=g).astype(np.int64))


# ---------------------------------------------------------------------------- operator


class BipartiteOperator:
    """A full-batch operator on S seen as the block: ``op(h)`` (h: the n_local owned input
    rows) returns the ``num_dst`` owned destination rows of B·h."""

    def __init__(self, inner, num_dst: int):
        self.inner, self.num_dst, self.num_src = inner, int(num_dst), int(inner.num_src)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return self.inner(h)[:self.num_dst]

    matmul = __call__

    def edges(self) -> "BipartiteEdges":
        """The inner operator's edge-valued operations seen as the block's (the edges of S
        are B's: the distinct sampled neighbours), or AttributeError where it has none."""
        return BipartiteEdges(self.inner.edges(), self.num_dst)


class BipartiteEdges:
    """:class:`~.edge_ops.EdgeOperator` of a sampled block from the operator on S: per-row
    results cut to the ``num_dst`` owned destination rows, a destination vector padded with
    zeros to the owned input rows (those past ``num_dst`` have no edges in S)."""

    def __init__(self, inner, num_dst: int):
        self.inner, self.num_dst = inner, int(num_dst)
        self.num_src, self.num_edges = inner.num_src, inner.num_edges

    def at_src(self, s: torch.Tensor) -> torch.Tensor:
        return self.inner.at_src(s)

    def at_dst(self, d: torch.Tensor) -> torch.Tensor:
        pad = d.new_zeros((self.num_src - d.shape[0],) + tuple(d.shape[1:]))
        return self.inner.at_dst(torch.cat([d, pad]))

    def row_max(self, e: torch.Tensor) -> torch.Tensor:
        return self.inner.row_max(e)[:self.num_dst]

    def row_sum(self, e: torch.Tensor) -> torch.Tensor:
        return self.inner.row_sum(e)[:self.num_dst]

    def spmm(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.inner.spmm(h, w)[:self.num_dst]


def build_bipartite(algo: str, shard: BlockShard, comm: Comm, norm: str, device=None, **kw
                    ) -> BipartiteOperator:
    """``algo``'s full-batch operator on ``shard`` over ``comm``'s (group) grid, wrapped.
    Collective over the group (the builders' setup traffic, in ``comm``'s current phase); the
    entry's per-group builder options apply (4d: ``full_batch=False`` on its ``data = 1``
    sub-grid)."""
    entry = get_grouped(algo)
    kw = {**entry.group.build_kw, **kw}
    return BipartiteOperator(entry.build(shard, comm, norm, device, **kw), shard.num_dst)
