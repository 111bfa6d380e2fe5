"""1D SpMM (CAGNET 1D): block rows, every H block shared with every rank.

Rank r of p holds the block row A_r (n_r × n, columns in partition order) and H_r (n_r × f).

Forward  Z_r = A_r · [H_0; …; H_{p−1}]   — one all-gather of the H blocks (uneven n_r);
Backward dH_r = (Σ_q A_qᵀ · G_q)_r        — each rank forms A_rᵀ·G_r (n × f) locally, then
                                            one reduce-scatter returns row block r.

Words moved per rank per SpMM: (p−1)·n_r·f forward, n·f − n_r·f backward.

Both directions overlap (:mod:`overlap`): A_r's own diagonal block multiplies H_r while the
other blocks are gathered; in the backward the other blocks' part of A_rᵀ·G_r (own block left
zero) is reduce-scattered while the own block's is computed, and added when it arrives.
``edges()`` serves attention layers (:mod:`edge_dist`).
Shapes: A_r (n_r, n); H_r, Z_r, G_r, dH_r (n_r, f).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .axes import DenseAxis
from .comm import Comm
from .cost_terms import (Cost, LinearCounts, coll, gather_padding, owned_rows_work, per_feature,
                         reduce_padding)
from .dist_op import DistOperator, shard_values
from .edge_dist import AllGather, ExtendedEdges, operator_edges
from .entry import Algorithm, GroupRule, group_of_size
from .local import as_tensor
from .overlap import Overlapped

AXIS = "row"


class Op1D(DistOperator):
    """1D all-gather operator over the grid axis ``row`` (all p ranks).

    ``indptr, indices, values``: this rank's rows of Â with columns as *positions in partition
    order* (part q's vertices at ``[offsets[q], offsets[q+1])``); ``sizes``: every part's n_q.
    """

    def __init__(self, comm: Comm, indptr, indices, values, sizes: Sequence[int], device=None):
        self.comm = comm
        self.sizes = [int(s) for s in sizes]
        me = comm.grid.coord(AXIS)
        self.num_dst = self.num_src = self.sizes[me]
        axis = DenseAxis(comm, AXIS, self.sizes)
        self.block = Overlapped(indptr, indices, values, (self.num_dst, axis.width), axis,
                                device=device)
        self.local_nnz = self.block.nnz
        self._structure, self._device, self._edges = (indptr, indices), device, None

    def edges(self) -> ExtendedEdges:
        """The edge-valued operations of this rank's rows (:mod:`.edge_dist`)."""
        comm, sizes = self.comm, self.sizes
        return operator_edges(self, sum(sizes), lambda t: AllGather.apply(t, comm, AXIS, sizes))

    def forward_rows(self, h):
        return self.block.forward(h)

    def backward_rows(self, grad):
        return self.block.backward(grad)


def row_axis(world: int, dims=None, replication: int = 1) -> dict:
    """The grid of the 1D algorithms: every rank on axis ``row``."""
    return {"row": world}


def partition_order(shard, comm: Comm, norm: str):
    """(indptr, indices, values, sizes): the shard's rows with columns (local + halo) renumbered
    to positions in partition order, from every part's id list (one setup all-gather)."""
    with comm.in_phase("setup"):
        sizes = [int(t) for t in torch.cat(comm.all_gather(
            torch.tensor([shard.n_local]), AXIS))]
        ids = comm.all_gather(as_tensor(shard.global_ids, np.int64), AXIS, sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    halo = np.asarray(shard.halo_ids)
    recv = np.concatenate([[0], np.cumsum(shard.recv_counts)])
    halo_pos = np.empty(halo.shape[0], np.int64)
    for q in range(len(sizes)):  # one vectorised lookup per owner rank
        part = halo[recv[q]:recv[q + 1]]
        halo_pos[recv[q]:recv[q + 1]] = offsets[q] + np.searchsorted(ids[q].numpy(), part)
    me = comm.grid.coord(AXIS)
    col_pos = np.concatenate([offsets[me] + np.arange(shard.n_local), halo_pos])
    indices = col_pos[np.asarray(shard.indices)]
    # renumbering breaks the within-row column order only across local/halo; sort each row
    indptr = np.asarray(shard.indptr)
    rows = np.repeat(np.arange(shard.n_local), np.diff(indptr))
    order = np.lexsort((indices, rows))
    return indptr, indices[order], shard_values(shard, norm)[order], sizes


def build_1d(shard, comm: Comm, norm: str, device=None) -> Op1D:
    indptr, indices, values, sizes = partition_order(shard, comm, norm)
    return Op1D(comm, indptr, indices, values, sizes, device)


def exact_1d(s, dims, variant, layers, rotate) -> LinearCounts:
    p, n_r = s.p, s.sizes
    n = int(n_r.sum())
    return LinearCounts(((p - 1) * n_r, n - n_r), (np.full(p, coll(p)), np.full(p, coll(p))))


def estimate_1d(s, dims, variant):
    p, n, nr = s.p, s.n, s.nr
    return per_feature((p - 1) * nr, n - nr, coll(p), coll(p), n)


def padding_1d(s, dims, variant, reduce: bool = True):
    """Rows padded per rank (forward, backward): the all-gather of every block over all ranks,
    its reduce-scatter in the backward (none when ``reduce`` is False: see
    :mod:`gnnpar.kernels.cost_terms`)."""
    group = np.zeros(s.p, np.int64)
    back = reduce_padding(s.sizes, group) if reduce else np.zeros(s.p, np.int64)
    return gather_padding(s.sizes, group), back


SPMM_1D = Algorithm(
    name="1d", axes=("row",), shape=row_axis, builder=build_1d,
    group=GroupRule(group_of_size),
    cost=Cost(exact_1d, estimate_1d, candidates=lambda p: [(None, "bcast")],
              padding=padding_1d, work=owned_rows_work))
