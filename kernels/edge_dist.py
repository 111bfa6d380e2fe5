"""The edge-valued operator contract (:mod:`.edge_ops`) on the 1D distributed operators.

A rank of ``--algo 1d`` or ``1d-halo`` owns whole rows, so everything of an attention layer is
local except what an edge reads at its source: ``at_src(s)`` and ``spmm(h, w)`` first extend
``s`` (num_local, H) or ``h`` (num_local, H, F) to the source rows the rank's CSR reads, by
the same exchange as the operator's Â·H, ``H`` or ``H·F`` wide, then run the local CSR's
operation (:class:`.edge_ops.CsrEdges`). Row maxima and sums need nothing: a row's edges are
all on its owner.

- 1d-halo (:class:`HaloGather`): own rows, then the halo rows through the plan's all-to-all;
  the backward sends the halo rows' gradients back to their owners and adds them there.
- 1d (:class:`AllGather`): every rank's rows in partition order by an all-gather; the
  backward reduce-scatters the gradient of all rows, each rank keeping its block.

Every exchange goes through :class:`~.comm.Comm` (counted in phase ``forward``/``eval``, the
backward's in ``backward``).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from .comm import Comm
from .edge_ops import CsrEdges, rows_flat
from .halo import HaloPlan
from .local import as_tensor


class HaloGather(torch.autograd.Function):
    """``[t; t's halo rows]`` (num_local + num_halo, ...) from ``t`` (num_local, ...)."""

    @staticmethod
    def forward(ctx, t, plan: HaloPlan, comm: Comm, axis):
        ctx.plan, ctx.comm, ctx.axis, ctx.shape = plan, comm, axis, t.shape
        flat = rows_flat(t)
        halo = plan.start_gather(comm, flat, axis).wait()
        return torch.cat([flat, halo.to(flat.dtype)]).view(-1, *t.shape[1:])

    @staticmethod
    def backward(ctx, grad):
        n = ctx.shape[0]
        flat = rows_flat(grad)
        with ctx.comm.in_phase("backward"):
            back = ctx.plan.start_return(ctx.comm, flat[n:], ctx.axis).wait()
        own = ctx.plan.add_returned(flat[:n].contiguous(), back.to(flat.dtype))
        return own.view(ctx.shape), None, None, None


class AllGather(torch.autograd.Function):
    """Every member's rows of ``t`` stacked in member order (``sizes``: their row counts)."""

    @staticmethod
    def forward(ctx, t, comm: Comm, axis, sizes: Sequence[int]):
        ctx.comm, ctx.axis, ctx.sizes, ctx.shape = comm, axis, list(sizes), t.shape
        flat = rows_flat(t)
        parts = comm.start_all_gather(flat, axis, ctx.sizes).wait()
        return torch.cat([p.to(flat.dtype) for p in parts]).view(-1, *t.shape[1:])

    @staticmethod
    def backward(ctx, grad):
        flat = rows_flat(grad)
        with ctx.comm.in_phase("backward"):
            own = ctx.comm.start_reduce_scatter(flat, ctx.axis, ctx.sizes).wait()
        return own.to(flat.dtype).view(ctx.shape), None, None, None


class ExtendedEdges:
    """:class:`~.edge_ops.EdgeOperator` of a rank owning ``n_local`` whole rows: ``extend``
    maps local rows to the source rows ``local`` (a :class:`~.edge_ops.CsrEdges`) reads."""

    def __init__(self, comm: Comm, extend: Callable, n_local: int, local: CsrEdges):
        self.comm, self.extend, self.local = comm, extend, local
        self.num_dst = self.num_src = int(n_local)
        self.num_edges = local.num_edges

    def _extended(self, t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] != self.num_src:
            raise ValueError(f"expected {self.num_src} local rows, got {t.shape[0]}")
        with self.comm.in_phase("forward" if torch.is_grad_enabled() else "eval"):
            return self.extend(t)

    def at_src(self, s: torch.Tensor) -> torch.Tensor:
        return self.local.at_src(self._extended(s))

    def at_dst(self, d: torch.Tensor) -> torch.Tensor:
        return self.local.at_dst(d)

    def row_max(self, e: torch.Tensor) -> torch.Tensor:
        return self.local.row_max(e)

    def row_sum(self, e: torch.Tensor) -> torch.Tensor:
        return self.local.row_sum(e)

    def spmm(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.local.spmm(self._extended(h), w)


def local_edges(indptr, indices, num_src: int, device=None) -> CsrEdges:
    """:class:`~.edge_ops.CsrEdges` of a rank's CSR arrays (numpy or memory-mapped)."""
    return CsrEdges(as_tensor(indptr, np.int64, device), as_tensor(indices, np.int64, device),
                    num_src)


def operator_edges(op, num_src: int, extend: Callable) -> ExtendedEdges:
    """``op.edges()`` of a 1D operator (``op._structure``: its CSR arrays, ``op._device``):
    made on first use and kept in ``op._edges``."""
    if op._edges is None:
        op._edges = ExtendedEdges(op.comm, extend, op.num_src,
                                  local_edges(*op._structure, num_src, op._device))
    return op._edges
