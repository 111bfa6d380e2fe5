"""2D SpMM, A-stationary, on any ``pr × pc`` grid (axes ``row`` × ``col``), uneven blocks.

Z = Â · H for the rows each rank owns. Rank (i, j) (global rank ``i·pc + j``) owns the rows of
a seeded random balanced set (``permute=True``: what ``gnnpar-train`` runs, see
:func:`blocks.layout_options`) or of its 1D part q = i·pc + j (``permute=False``, the builder's
default), all f features — the layout the model's local, replicated linear layers need. The
ownership fixes the blocks below, so it decides the non-zero balance: under a partition that
balances vertices, the part holding a power-law graph's hubs makes its rank hold several times
the mean (max/mean 4.0 on rmat-13 at 2x4 under METIS), the random set about 1.05. Define

- row block R_i = the rows owned by ranks (i, 0..pc−1) (this rank's ``col``-axis group),
- column block C_j = the rows owned by ranks (0..pr−1, j) (this rank's ``row``-axis group).

Rank (i, j) holds Â_ij = Â[R_i, C_j] (|R_i| × |C_j|, ≈ m/p non-zeros; rows and columns of
different ranks, so every non-zero sits on exactly one rank). Since Z_i = Σ_j Â_ij · H_{C_j}:

Forward   H_{C_j} = all-gather of the owned H rows over axis ``row``;
          Y = Â_ij · H_{C_j} (|R_i| × f);
          Z_mine = reduce-scatter of Y over axis ``col``.
Backward  G_{R_i} = all-gather of G over ``col``; dH_{C_j} = Â_ijᵀ · G_{R_i};
          dH_mine = reduce-scatter over ``row``.

Â never moves after setup (unlike SUMMA, which broadcasts A blocks each stage). Moving H
instead is the cheaper choice only while the feature rows cost less than the non-zeros: per
SpMM this moves about n·f words of H and partial outputs, SUMMA about m·(1 + index) words of
Â; with wide features (n = 1M, m = 32M, f = 256: ~1 GB of rows against ~384 MB of Â) moving
Â would be cheaper. With METIS parts most non-zeros are inside a part, which lands them on the
diagonal-like block of their own rank.

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

from gnnpar.datasets import InputError

from .axes import DenseAxis, HaloAxis
from .blocks import (Ownership, coo_to_csr, coords_of, exchange, layout_options, rank_of,
                     shard_entries, take_owned_rows, world_axes)
from .comm import Comm
from .cost_attention import Moves, others_with_rows, per_layer, product_rows
from .cost_terms import (Cost, LinearCounts, coll, dest_work, distinct, factorisations,
                         gather_padding, no_padding, partners, per_feature, plan_counts,
                         reduce_padding)
from .dist_op import DistOperator, shard_values
from .edge_block import BlockEdges, block_edges
from .entry import Algorithm, GroupRule, group_of_grid, variant_option
from .overlap import Overlapped

#: variant -> how one axis moves rows (chosen once, when the operator is built)
VARIANTS = {"halo": HaloAxis, "bcast": DenseAxis}


class BlockOp(DistOperator):
    """A-stationary operator: reads column block over ``in_axis``, reduces over ``out_axis``.

    ``rows``/``cols``: (member, local) of each non-zero's row in the ``out_axis`` group and
    column in the ``in_axis`` group; ``out_sizes``/``in_sizes``: owned rows of each member.
    """

    def __init__(self, comm: Comm, in_axis, out_axis, rows, cols, vals, in_sizes, out_sizes,
                 variant: str, device=None):
        if variant not in VARIANTS:
            raise InputError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        self.comm = comm
        grid = comm.grid
        me_in = grid.ranks_of(in_axis).index(grid.rank)
        me_out = grid.ranks_of(out_axis).index(grid.rank)
        self.num_src = self.num_dst = list(in_sizes)[me_in]
        assert list(out_sizes)[me_out] == self.num_dst
        (rm, rl), (cm, cl) = rows, cols
        axis = VARIANTS[variant]
        r, self.out = axis.build(comm, out_axis, rm, rl, out_sizes, self.num_dst, device)
        c, self.inp = axis.build(comm, in_axis, cm, cl, in_sizes, self.num_src, device)
        shape = (self.out.width, self.inp.width)
        self.block = Overlapped(*coo_to_csr(r, c, vals, shape), shape, self.inp, self.out,
                                device)
        self.nnz = self.local_nnz = self.block.nnz
        self._edges = None

    def edges(self) -> BlockEdges:
        """The edge-valued operations (:mod:`.edge_block`)."""
        return block_edges(self)

    def forward_rows(self, h):
        """Gather along ``in_axis``, local block product, reduce along ``out_axis`` — the
        held rows' products overlapping the gather, the own rows' the reduction
        (:mod:`overlap`)."""
        return self.block.forward(h)

    def backward_rows(self, grad):
        return self.block.backward(grad)


def ownership(shard, comm: Comm, permute: bool, seed: int) -> Ownership:
    """Random balanced ownership (``permute``) or the shards' partition."""
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


def build_2d(shard, comm: Comm, norm: str, device=None, variant: str = "halo",
             permute: bool = False, seed: int = 0) -> BlockOp:
    """``variant="halo"`` by default: it never moves more bytes than ``"bcast"``.
    ``permute=False`` (the shards' rows) is the builder's default so that direct callers keep
    the partition's layout; ``gnnpar-train`` passes ``permute=True`` (:func:`options_2d`)."""
    if set(comm.grid.shape) != {"row", "col"}:
        raise InputError(f"2d needs a row x col grid, got {comm.grid.describe()}")
    own = ownership(shard, comm, permute, seed)
    op = build_block_op(shard, comm, shard_values(shard, norm), own, "row", "col", variant,
                        device)
    return attach_ownership(op, shard, comm, own)


# ---------------------------------------------------------------- registry entry
def row_col(world: int, dims=None, replication: int = 1) -> dict:
    if dims is None or len(dims) != 2:
        raise InputError(f"2d needs --grid PRxPC with PR*PC = {world}, got {dims}")
    return {"row": dims[0], "col": dims[1]}


def moves_2d(s, dims, variant, reduce: bool = True) -> Moves:
    """Exact per-rank moves (:mod:`.cost_attention`) of the block operator on the (pr, pc)
    grid: ``row`` is its in axis, ``col`` its out axis. ``bcast``: all-gathers and
    reduce-scatters (padded; the reduce-scatters only when ``reduce``, see
    :mod:`.cost_terms`), the maximum by all-to-all; ``halo``: the two plans' all-to-alls."""
    (pr, pc), n_r = dims, s.sizes
    q = np.arange(s.p)
    i, j = q // pc, q % pc
    if variant == "bcast":
        R = np.bincount(i, weights=n_r, minlength=pr).astype(np.int64)[i]
        C = np.bincount(j, weights=n_r, minlength=pc).astype(np.int64)[j]
        k = 1 if reduce else 0
        return Moves.of(g_in=((pr - 1) * n_r, np.full(s.p, coll(pr)), gather_padding(n_r, j)),
                        r_out=(R - n_r, np.full(s.p, coll(pc)), k * reduce_padding(n_r, i)),
                        g_out=((pc - 1) * n_r, np.full(s.p, coll(pc)), gather_padding(n_r, i)),
                        r_in=(C - n_r, np.full(s.p, coll(pr)), k * reduce_padding(n_r, j)),
                        m_out=(R - n_r, others_with_rows(n_r, i)))
    dest = block_of(s, dims)
    ir, is_, irm, ism = plan_counts(s.p, dest, s.cols, s.owner[s.cols])
    orr, os_, orm, osm = plan_counts(s.p, dest, s.rows, s.owner[s.rows])
    return Moves.of(g_in=(is_, ism), r_in=(ir, irm), g_out=(os_, osm), r_out=(orr, orm),
                    m_out=(orr, orm))


def exact_2d(s, dims, variant, layers, rotate) -> LinearCounts:
    """The product's counts: forward ``g_in + r_out``, backward ``g_out + r_in``."""
    mv = moves_2d(s, dims, variant)
    return LinearCounts(*product_rows(mv))


def estimate_moves_2d(s, dims, variant) -> Moves:
    """The average rank's moves (:func:`moves_2d`) from n, m and the cut."""
    (pr, pc), n, nr, mr = dims, s.n, s.nr, s.mr
    R, C = n / pr, n / pc
    if variant == "bcast":
        return Moves.of(g_in=((pr - 1) * nr, coll(pr)), r_out=(R - nr, coll(pc)),
                        g_out=((pc - 1) * nr, coll(pc)), r_in=(C - nr, coll(pr)),
                        m_out=(R - nr, coll(pc)))
    hin = distinct(mr * s.scale * (1 - 1 / pr), C - nr)
    hout = distinct(mr * s.scale * (1 - 1 / pc), R - nr)
    kin = partners(mr * s.scale * (1 - 1 / pr), pr)
    kout = partners(mr * s.scale * (1 - 1 / pc), pc)
    return Moves.of(g_in=(hin, kin), r_in=(hin, kin), g_out=(hout, kout), r_out=(hout, kout),
                    m_out=(hout, kout))


def estimate_2d(s, dims, variant):
    (pr, pc), n = dims, s.n
    (fwd, bwd), (fm, bm) = product_rows(estimate_moves_2d(s, dims, variant))
    recv = n / pr + n / pc if variant == "bcast" else fwd
    return per_feature(fwd, bwd, fm, bm, recv)


def options_2d(settings, per_group: bool) -> dict:
    """``variant`` as given, and the balanced block layout (:func:`blocks.layout_options`)."""
    return {**variant_option(settings, per_group), **layout_options(settings, per_group)}


def candidates_2d(p: int):
    return [(dims, v) for dims in factorisations(p, 2) for v in VARIANTS]


def padding_2d(s, dims, variant, reduce: bool = True):
    """Rows padded per rank (forward, backward): :func:`moves_2d`'s, ``bcast`` only (``halo``
    moves by all-to-all, which pads nothing)."""
    if variant != "bcast":
        return no_padding(s, dims, variant)
    mv = moves_2d(s, dims, variant, reduce)
    return mv.pad["g_in"] + mv.pad["r_out"], mv.pad["g_out"] + mv.pad["r_in"]


def block_of(s, dims):
    """The rank holding each non-zero: row i of its row's owner, column j of its column's."""
    pc = dims[1]
    return (s.owner[s.rows] // pc) * pc + s.owner[s.cols] % pc


SPMM_2D = Algorithm(
    name="2d", axes=("row", "col"), shape=row_col, builder=build_2d,
    flags=("grid", "variant", "block_layout"),
    option_rule=options_2d, group=GroupRule(group_of_grid),
    cost=Cost(exact_2d, estimate_2d, candidates=candidates_2d, padding=padding_2d,
              work=dest_work(block_of), moves=per_layer(moves_2d),
              moves_estimate=estimate_moves_2d))
