"""Sparsity-aware 1D SpMM: each rank receives only the H rows its block row touches.

Rank r holds A_r (n_r × (n_r + halo_r), columns local then halo; see :mod:`halo`) and H_r.

Forward  Z_r = A_r · [H_r; halo rows]      — one uneven all-to-all of the needed rows;
Backward dH_r = own part of A_rᵀ·G_r + the halo parts other ranks send back (reverse
          all-to-all), accumulated at the rows that were sent.

Both directions overlap (:mod:`overlap`): the local columns' product runs while the halo rows
(forward) or the halo gradients (backward) are in flight. ``edges()`` serves attention layers
(:mod:`edge_dist`).

Words moved per rank per SpMM: f × (rows this rank sends) in each direction.
Shapes: A_r (n_r, n_r + halo_r); H_r, Z_r (n_r, f).
"""
from __future__ import annotations

from .axes import HaloAxis
from .comm import Comm
from .cost_terms import (Cost, LinearCounts, distinct, owned_rows_work, partners, per_feature,
                         plan_counts)
from .dist_op import DistOperator, shard_values
from .edge_dist import ExtendedEdges, HaloGather, operator_edges
from .entry import Algorithm, GroupRule, group_of_size
from .halo import HaloPlan
from .overlap import Overlapped
from .spmm_1d import row_axis

AXIS = "row"


class Op1DHalo(DistOperator):
    """Halo-exchange operator over grid axis ``row``; ``plan`` from the rank's shard."""

    def __init__(self, comm: Comm, indptr, indices, values, n_local: int, plan: HaloPlan,
                 device=None):
        self.comm, self.plan = comm, plan
        self.num_dst = self.num_src = n = int(n_local)
        axis = HaloAxis(comm, AXIS, plan, n)
        self.block = Overlapped(indptr, indices, values, (n, axis.width), axis, device=device)
        self.local_nnz = self.block.nnz
        self._structure, self._device, self._edges = (indptr, indices), device, None

    def edges(self) -> ExtendedEdges:
        """The edge-valued operations of this rank's rows (:mod:`.edge_dist`)."""
        plan, comm = self.plan, self.comm
        return operator_edges(self, self.num_src + plan.num_halo,
                              lambda t: HaloGather.apply(t, plan, comm, AXIS))

    def forward_rows(self, h):
        return self.block.forward(h)

    def backward_rows(self, grad):
        return self.block.backward(grad)


def build_1d_halo(shard, comm: Comm, norm: str, device=None) -> Op1DHalo:
    plan = HaloPlan.from_arrays(shard.send_local, shard.send_counts, shard.recv_counts, device)
    return Op1DHalo(comm, shard.indptr, shard.indices, shard_values(shard, norm), shard.n_local,
                    plan, device)


def exact_1d_halo(s, dims, variant, layers, rotate) -> LinearCounts:
    recv, send, rm, sm = plan_counts(s.p, s.owner[s.rows], s.cols, s.owner[s.cols])
    return LinearCounts((send, recv), (sm, rm))


def estimate_1d_halo(s, dims, variant):
    h = distinct(s.cut * s.mr, s.n - s.nr)
    k = partners(s.cut * s.mr, s.p)
    return per_feature(h, h, k, k, h)


SPMM_1D_HALO = Algorithm(
    name="1d-halo", axes=("row",), shape=row_axis, builder=build_1d_halo,
    group=GroupRule(group_of_size),
    cost=Cost(exact_1d_halo, estimate_1d_halo, candidates=lambda p: [(None, "halo")],
              work=owned_rows_work))
