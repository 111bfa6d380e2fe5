"""2D SpMM, A-stationary, on any ``pr × pc`` grid (axes ``row`` × ``col``), uneven blocks.

Z = Â · H for the rows each rank owns. Rank (i, j) (global rank ``i·pc + j``) owns the rows of
its 1D part q = i·pc + j (or of a seeded random balanced set with ``permute=True``), all f
features — the layout the model's local, replicated linear layers need. Define

- row block R_i = the rows owned by ranks (i, 0..pc−1) (this rank's ``col``-axis group),
- column block C_j = the rows owned by ranks (0..pr−1, j) (this rank's ``row``-axis group).

Rank (i, j) holds Â_ij = Â[R_i, C_j] (|R_i| × |C_j|, ≈ m/p non-zeros; rows and columns of
different ranks, so every non-zero sits on exactly one rank). Since Z_i = Σ_j Â_ij · H_{C_j}:

Forward   H_{C_j} = all-gather of the owned H rows over axis ``row``;
          Y = Â_ij · H_{C_j} (|R_i| × f);
          Z_mine = reduce-scatter of Y over axis ``col``.
Backward  G_{R_i} = all-gather of G over ``col``; dH_{C_j} = Â_ijᵀ · G_{R_i};
          dH_mine = reduce-scatter over ``row``.

Â never moves after setup (unlike SUMMA, which broadcasts A blocks each stage: for GNNs m ≫ n
makes moving H the cheaper choice). With METIS parts most non-zeros are inside a part, which
lands them on the diagonal-like block of their own rank.

Variants (``variant=``):

- ``"bcast"``: dense collectives as above. Words sent per rank per SpMM, f features, n_q rows
  owned by rank q: (pr − 1)·n_me·f (all-gather) + (|R_i| − n_me)·f (reduce-scatter), i.e.
  ≈ nf(pr − 1)/p + nf(pc − 1)/p; the same in the backward with the axes swapped.
- ``"halo"`` (default, sparsity-aware): the all-gather becomes one all-to-all over ``row`` of
  only the H rows that Â_ij's non-zero columns touch, and the reduce-scatter one all-to-all
  over ``col`` of only Y's rows that have a non-zero (then summed at their owners). Words per
  SpMM: f × (rows this rank sends in both plans); both plans are built once.

Shapes: h, Z (n_me, f); Â_ij (|R_i|, |C_j|) (halo: own + remote rows touched, compacted).
"""
from __future__ import annotations

import numpy as np
import torch

from gnnpar.datasets import InputError

from .blocks import (Ownership, compact_plan, coo_to_csr, exchange, rank_of, coords_of,
                     shard_entries, take_owned_rows, world_axes)
from .comm import Comm
from .dist_op import DistOperator
from .local import csr_tensor, transpose_csr

VARIANTS = ("halo", "bcast")


class BlockOp(DistOperator):
    """A-stationary operator: reads column block over ``in_axis``, reduces over ``out_axis``.

    ``rows``/``cols``: (member, local) of each non-zero's row in the ``out_axis`` group and
    column in the ``in_axis`` group; ``out_sizes``/``in_sizes``: owned rows of each member.
    """

    def __init__(self, comm: Comm, in_axis, out_axis, rows, cols, vals, in_sizes, out_sizes,
                 variant: str, device=None):
        if variant not in VARIANTS:
            raise InputError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        self.comm, self.variant = comm, variant
        self.in_axis, self.out_axis = in_axis, out_axis
        self.in_sizes, self.out_sizes = list(in_sizes), list(out_sizes)
        grid = comm.grid
        me_in = grid.ranks_of(in_axis).index(grid.rank)
        me_out = grid.ranks_of(out_axis).index(grid.rank)
        self.num_src = self.num_dst = self.in_sizes[me_in]
        assert self.out_sizes[me_out] == self.num_dst
        (rm, rl), (cm, cl) = rows, cols
        if variant == "bcast":
            r = np.concatenate([[0], np.cumsum(self.out_sizes)])[rm] + rl
            c = np.concatenate([[0], np.cumsum(self.in_sizes)])[cm] + cl
            shape = (sum(self.out_sizes), sum(self.in_sizes))
        else:
            r, self.plan_out = compact_plan(comm, out_axis, rm, rl, self.num_dst, device)
            c, self.plan_in = compact_plan(comm, in_axis, cm, cl, self.num_src, device)
            shape = (self.num_dst + self.plan_out.num_halo, self.num_src + self.plan_in.num_halo)
        arrays = coo_to_csr(r, c, vals, shape)
        self.nnz = int(arrays[1].shape[0])
        self.A = csr_tensor(*arrays, shape, device)
        self.AT = csr_tensor(*transpose_csr(*arrays, shape), shape[::-1], device)

    def gather_in(self, h):
        if self.variant == "bcast":
            return torch.cat(self.comm.all_gather(h, self.in_axis, self.in_sizes))
        return self.plan_in.gather(self.comm, h, self.in_axis)

    def reduce_out(self, y):
        if self.variant == "bcast":
            return self.comm.reduce_scatter(y, self.out_axis, self.out_sizes)
        return self.plan_out.scatter_back(self.comm, y, self.num_dst, self.out_axis)

    def gather_out(self, g):
        if self.variant == "bcast":
            return torch.cat(self.comm.all_gather(g, self.out_axis, self.out_sizes))
        return self.plan_out.gather(self.comm, g, self.out_axis)

    def reduce_in(self, y):
        if self.variant == "bcast":
            return self.comm.reduce_scatter(y, self.in_axis, self.in_sizes)
        return self.plan_in.scatter_back(self.comm, y, self.num_src, self.in_axis)

    def forward_rows(self, h):
        """Gather along ``in_axis``, local block product, reduce along ``out_axis``."""
        return self.reduce_out(torch.sparse.mm(self.A, self.gather_in(h)))

    def backward_rows(self, grad):
        return self.reduce_in(torch.sparse.mm(self.AT, self.gather_out(grad)))



def ownership(shard, comm: Comm, permute: bool, seed: int) -> Ownership:
    if permute:
        return Ownership.permuted_over(int(shard.n_global), comm.grid.world_size, seed)
    return Ownership.from_shard(shard, comm)


def destination(grid, own: Ownership, u, v, in_axis, out_axis):
    """Rank holding non-zero (u, v): its ``out_axis`` group must contain u's owner and its
    ``in_axis`` group v's owner. With ``in_axis`` ∪ ``out_axis`` = every axis, that is the rank
    with v's owner's coordinates on ``out_axis`` and u's owner's on the others."""
    cu, cv = coords_of(grid, own.owner[u]), coords_of(grid, own.owner[v])
    out_axes = (out_axis,) if isinstance(out_axis, str) else tuple(out_axis)
    return rank_of(grid, {a: (cv[a] if a in out_axes else cu[a]) for a in grid.shape})


def build_block_op(shard, comm: Comm, values, own: Ownership, in_axis, out_axis, variant,
                   device=None) -> BlockOp:
    """Move each of the shard's non-zeros to the rank whose block holds it (one setup
    all-to-all over the world) and build the operator there."""
    grid = comm.grid
    u, v, val = shard_entries(shard, values)
    dest = destination(grid, own, u, v, in_axis, out_axis)
    u, v, val = exchange(comm, world_axes(grid), dest, [u, v, val])
    out_ranks, in_ranks = grid.ranks_of(out_axis), grid.ranks_of(in_axis)
    rm, rl, _ = own.block_positions(out_ranks, u)
    cm, cl, _ = own.block_positions(in_ranks, v)
    return BlockOp(comm, in_axis, out_axis, (rm, rl), (cm, cl), val, own.sizes(in_ranks),
                   own.sizes(out_ranks), variant, device)


def attach_ownership(op, shard, comm: Comm, own: Ownership):
    """Give a permuted operator the ``row_ids``/``take_rows`` the runtime asks for."""
    if own.permuted:
        op.row_ids = own.ids[comm.grid.rank]
        op.take_rows = lambda sh, a: take_owned_rows(comm, sh, own, a)
    return op


def build_2d(shard, comm: Comm, values, device=None, variant: str = "halo",
             permute: bool = False, seed: int = 0) -> BlockOp:
    if set(comm.grid.shape) != {"row", "col"}:
        raise InputError(f"2d needs a row x col grid, got {comm.grid.describe()}")
    own = ownership(shard, comm, permute, seed)
    op = build_block_op(shard, comm, values, own, "row", "col", variant, device)
    return attach_ownership(op, shard, comm, own)
