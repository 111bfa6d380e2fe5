"""The edge-valued operator contract (:mod:`.edge_ops`) on the block operators: 1.5d and 2d
(:class:`~.spmm_2d.BlockOp`, either variant), 3d and 4d (:class:`~.spmm_3d.Op3D`).

A rank holds the block Â[R, C] of its grid position: its rows are the *out* axis's positions
(its own rows and rows other members own), its columns the *in* axis's (:mod:`.axes`). A
destination row's edges are therefore spread over the members of the out axis, and every
operation of the contract is the local block's (:class:`~.edge_ops.CsrEdges`) between the
moves that the operator's own product makes:

- ``at_src(s)``: ``s`` gathered over the in axis (``H`` wide), the local edges' sources;
- ``at_dst(d)``: ``d`` gathered over the out axis — the destination rows other members own
  come from them; this is the move of the product's backward;
- ``row_sum(e)``: the local rows' sums, reduced over the out axis to their owners (as the
  product's partial rows); ``row_max(e)``: the same with a maximum (:meth:`~.axes.DenseAxis.
  reduce_max`), no gradient;
- ``spmm(h, w)``: ``h`` gathered over the in axis (``H·F`` wide), the local weighted
  product, its rows reduced over the out axis.

3d and 4d store piece z of Â[R_x, C_y] on rank (x, y, z): its rows are owned by the ranks
(x, ·, ·), its columns by the ranks (·, y, ·). Their edges run as a block of that layout
(:func:`cube_edges`): the rows move over the (Y, Z) group and the columns over the (X, Z)
group, by halo plans of only the rows the piece touches, built once on first use (phase
``setup``). The features are not split over Z as 3d's own product splits them: an edge's
weights are needed with every feature of its source row, so each piece's product runs on
whole rows.

The gradients are the adjoint moves: a gather's is the reduction over the same axis and the
other way round (:class:`Gather`, :class:`Reduce`). Every move goes through
:class:`~.comm.Comm`, counted in phase ``forward`` (``eval`` without gradients) or
``backward``. A row sum is added in another order than the serial run's (fp32 rounding
only); a maximum is exact.
"""
from __future__ import annotations

import numpy as np
import torch

from .axes import HaloAxis
from .blocks import coo_to_csr
from .edge_ops import CsrEdges, no_empty_rows, rows_flat


class Gather(torch.autograd.Function):
    """Owned rows → every position of ``axis`` (:meth:`~.axes.Positions.gather`)."""

    @staticmethod
    def forward(ctx, t, axis):
        ctx.axis, ctx.shape = axis, t.shape
        return axis.gather(rows_flat(t)).view(-1, *t.shape[1:])

    @staticmethod
    def backward(ctx, grad):
        with ctx.axis.comm.in_phase("backward"):
            own = ctx.axis.reduce(rows_flat(grad))
        return own.view(ctx.shape), None


class Reduce(torch.autograd.Function):
    """Partial rows at every position of ``axis`` → their owners' sums."""

    @staticmethod
    def forward(ctx, t, axis):
        ctx.axis, ctx.shape = axis, t.shape
        own = axis.reduce(rows_flat(t))
        return own.view(-1, *t.shape[1:])

    @staticmethod
    def backward(ctx, grad):
        with ctx.axis.comm.in_phase("backward"):
            full = ctx.axis.gather(rows_flat(grad))
        return full.view(-1, *ctx.shape[1:]), None


class BlockEdges:
    """:class:`~.edge_ops.EdgeOperator` of a block operator (module docstring): ``local``
    holds the block's edges, ``inp``/``out`` are its column and row axes."""

    def __init__(self, comm, inp, out, n_own: int, local: CsrEdges):
        self.comm, self.inp, self.out, self.local = comm, inp, out, local
        self.num_dst = self.num_src = int(n_own)
        self.num_edges = local.num_edges

    def _phase(self):
        return self.comm.in_phase("forward" if torch.is_grad_enabled() else "eval")

    def _owned(self, t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] != self.num_src:
            raise ValueError(f"expected {self.num_src} owned rows, got {t.shape[0]}")
        return t

    def at_src(self, s: torch.Tensor) -> torch.Tensor:
        with self._phase():
            return self.local.at_src(Gather.apply(self._owned(s), self.inp))

    def at_dst(self, d: torch.Tensor) -> torch.Tensor:
        with self._phase():
            return self.local.at_dst(Gather.apply(self._owned(d), self.out))

    def row_max(self, e: torch.Tensor) -> torch.Tensor:
        with self._phase(), torch.no_grad():
            mine = self.local.row_max(e, empty=None)
            full = self.out.reduce_max(rows_flat(mine))
        return no_empty_rows(full.view(-1, *mine.shape[1:]))

    def row_sum(self, e: torch.Tensor) -> torch.Tensor:
        with self._phase():
            return Reduce.apply(self.local.row_sum(e), self.out)

    def spmm(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        with self._phase():
            return Reduce.apply(self.local.spmm(Gather.apply(self._owned(h), self.inp), w),
                                self.out)


def block_edges(op) -> BlockEdges:
    """``op.edges()`` of a :class:`~.spmm_2d.BlockOp`: its block's structure taken from the
    product's parts (:meth:`~.overlap.Overlapped.structure`) on first use, kept in
    ``op._edges``."""
    if op._edges is None:
        indptr, cols = op.block.structure()
        device = op.block.fwd.blocks["own", "held"].device
        op._edges = BlockEdges(op.comm, op.inp, op.out, op.num_dst,
                               CsrEdges(indptr.to(device), cols.to(device), op.inp.width))
    return op._edges


def _members(grid, pair, ranks, sizes, positions):
    """(member in the group of axes ``pair``, local row) of each position in a block laid
    out as the owned rows of ``ranks`` (``sizes`` each) one after another."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    k = np.searchsorted(offsets, positions, side="right") - 1
    group = grid.ranks_of(pair)
    index = np.asarray([group.index(r) for r in ranks], np.int64)
    return index[k], positions - offsets[k]


def cube_edges(op) -> BlockEdges:
    """``op.edges()`` of a :class:`~.spmm_3d.Op3D` (module docstring): its piece's entries
    renumbered by halo plans over the (Y, Z) group (rows) and the (X, Z) group (columns),
    made on first use and kept in ``op._edges``."""
    if op._edges is None:
        grid = op.comm.grid
        crow, cols = (t.cpu().numpy().astype(np.int64) for t in op.piece[:2])
        rows = op.row_bounds[grid.coord(op.Z)] + np.repeat(
            np.arange(crow.shape[0] - 1, dtype=np.int64), np.diff(crow))
        device = op.piece[0].device
        sides = []
        for axis, ranks, pos in ((op.Y, op.r_ranks, rows), (op.X, op.c_ranks, cols)):
            pair = tuple(a for a in grid.shape if a in (axis, op.Z))
            rows_of = dict(zip(ranks, op.rank_rows(ranks)))
            member, local = _members(grid, pair, ranks, op.rank_rows(ranks), pos)
            with op.comm.in_phase("setup"):
                sides.append(HaloAxis.build(op.comm, pair, member, local,
                                            [rows_of[r] for r in grid.ranks_of(pair)],
                                            op.num_dst, device))
        (r, out), (c, inp) = sides
        indptr, idx, _ = coo_to_csr(r, c, np.zeros(r.shape[0], np.float32),
                                    (out.width, inp.width))
        op._edges = BlockEdges(op.comm, inp, out, op.num_dst,
                               CsrEdges(torch.as_tensor(indptr, device=device),
                                        torch.as_tensor(idx, device=device), inp.width))
    return op._edges
