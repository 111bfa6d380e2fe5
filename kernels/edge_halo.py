"""The edge-valued operator contract (:mod:`.edge_ops`) on a 1D halo-exchange rank.

A rank of ``--algo 1d-halo`` owns whole rows: its CSR's columns are its own rows, then its
halo (remote rows its edges read, :mod:`.halo`). So everything of an attention layer is
local except what an edge reads at its source: ``at_src(s)`` and ``spmm(h, w)`` first extend
``s`` (num_local, H) or ``h`` (num_local, H, F) with the halo rows through the plan's
all-to-all (:class:`HaloGather`: the same exchange as Â·H's, ``H`` or ``H·F`` wide), then run
the local CSR's operation (:class:`.edge_ops.CsrEdges` over ``num_local + num_halo`` source
rows). Row maxima and sums need nothing: a row's edges are all on its owner. The backward
sends the halo rows' gradients back to their owners and adds them there.

Every exchange goes through :class:`~.comm.Comm` (counted in phase ``forward``/``eval``, the
backward's in ``backward``).
"""
from __future__ import annotations

import torch

from .comm import Comm
from .edge_ops import CsrEdges
from .halo import HaloPlan


class HaloGather(torch.autograd.Function):
    """``[t; t's halo rows]`` (num_local + num_halo, ...) from ``t`` (num_local, ...)."""

    @staticmethod
    def forward(ctx, t, plan: HaloPlan, comm: Comm, axis):
        ctx.plan, ctx.comm, ctx.axis, ctx.shape = plan, comm, axis, t.shape
        flat = t.reshape(t.shape[0], -1).contiguous()
        halo = plan.start_gather(comm, flat, axis).wait()
        return torch.cat([flat, halo.to(flat.dtype)]).view(-1, *t.shape[1:])

    @staticmethod
    def backward(ctx, grad):
        n = ctx.shape[0]
        flat = grad.reshape(grad.shape[0], -1)
        with ctx.comm.in_phase("backward"):
            back = ctx.plan.start_return(ctx.comm, flat[n:], ctx.axis).wait()
        own = ctx.plan.add_returned(flat[:n].contiguous(), back.to(flat.dtype))
        return own.view(ctx.shape), None, None, None


class HaloEdges:
    """:class:`~.edge_ops.EdgeOperator` of one 1D-halo rank (module docstring)."""

    def __init__(self, comm: Comm, plan: HaloPlan, axis, n_local: int, local: CsrEdges):
        self.comm, self.plan, self.axis, self.local = comm, plan, axis, local
        self.num_dst = self.num_src = int(n_local)
        self.num_edges = local.num_edges

    def _extended(self, t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] != self.num_src:
            raise ValueError(f"expected {self.num_src} local rows, got {t.shape[0]}")
        with self.comm.in_phase("forward" if torch.is_grad_enabled() else "eval"):
            return HaloGather.apply(t, self.plan, self.comm, self.axis)

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
