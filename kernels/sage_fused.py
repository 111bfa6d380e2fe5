"""One GraphSAGE layer on a local CSR operator as one autograd Function (CPU, float32).

Unfused, a SAGE layer on a sampled block (:class:`gnnpar.nn.models.SAGELayer`) is six autograd
nodes, each with a fresh output: the SpMM, the product with W_neigh (+ bias), the slice
``h[:n_dst]``, the product with W_root, the sum, then ReLU + dropout. In the backward the slice
alone costs a zeroed (n_src, f_in) gradient, a copy into its first rows and a full-size add.
:class:`SAGEBlock` does the same arithmetic as one node:

forward (in the layer's product order: aggregate first when ``f_in <= f_out``, the SpMM at
the narrower width, else project first; the layer passes its rule)::

    f_in <= f_out:  agg = Â·h;               z = addmm(b, agg, W_nᵀ)
    f_in >  f_out:  z = Â·(h·W_nᵀ);          z += b
    z.addmm_(h[:n_dst], W_rᵀ)                # the root term, accumulated in place
    epilogue, in place on z: none | ReLU | ReLU + dropout (the mask of gnnpar.nn.dropout)

backward (dz: the epilogue's backward of the incoming gradient)::

    f_in <= f_out:  dW_n = dzᵀ·agg;          dh = Âᵀ·(dz·W_n)       (dh only if h needs it)
    f_in >  f_out:  g = Âᵀ·dz;  dW_n = gᵀ·h; dh = g·W_n
    dW_r = dzᵀ·h[:n_dst];  db = Σ_rows dz;  dh[:n_dst].addmm_(dz, W_r)   (no zeros + copy)

The products are the unfused layer's (same SpMMs through ``cpu_spmm.csr_mm`` and the
operator's stored transpose and output buffers, same matmul operands); only the root term
is accumulated by ``addmm_`` into z (and into dh) instead of added as a separate product, so
results may differ from the unfused layer's in the last bits (the accumulation order), never
more.

Epilogues (``epilogue`` argument):

- ``None``: z as is (the last layer);
- ``(None, 0, 1.0)``: ReLU only (``torch.relu_``; backward ``threshold_backward`` on the
  output, as ``F.relu``'s);
- ``(seed, drop_units, scale)``: ReLU then dropout with the hash mask of ``seed``
  (:mod:`gnnpar.nn.dropout` draws the seed and rounds p, at the point it does for the unfused
  layer, so the masks are the same bits): the compiled in-place pass of
  :mod:`.cpu_dropout` where it serves z (float32, numba), backward recomputing the mask from
  the seed; elsewhere (float64, no numba) the numpy mask of ``cpu_dropout.keep_mask``, kept
  for the backward — the same decisions either way, and the same select semantics for
  non-finite values as :mod:`gnnpar.nn.dropout` states.

:func:`usable` is the rule the layer follows: a :class:`~.local.SparseOperator` whose product
is SparseOperator's own (a sampled block's operator, or the serial runtime's) on the CPU,
float32 features, weights and Â, 2-D features, CPU autocast off. Everything else (distributed
and bipartite operators, bf16 autocast, CUDA, float64) takes the unfused path.

Shapes: h (n_src, f_in); W_n, W_r (f_out, f_in); b (f_out,) or None → (n_dst, f_out).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import cpu_dropout
from .cpu_spmm import csr_mm
from .local import SparseOperator, autocast_dtype, spmm_into

#: ``(seed or None, drop_units, scale)``: see the module docstring
Epilogue = Optional[Tuple[Optional[int], int, float]]

#: the ReLU-only epilogue (evaluation, or dropout 0)
RELU: Epilogue = (None, 0, 1.0)


def usable(op, h: torch.Tensor, *params) -> bool:
    """Whether :class:`SAGEBlock` serves a layer with operator ``op``, features ``h`` and
    parameters ``params`` (None entries ignored): ``op`` is a :class:`~.local.SparseOperator`
    (a subclass too, such as a sampled block's operator, unless it changes the product:
    ``matmul`` and ``__call__`` must be SparseOperator's) with float32 Â on the CPU, ``h``
    2-D float32 on the CPU, every parameter float32 on the CPU, and CPU autocast is off."""
    if not isinstance(op, SparseOperator):
        return False
    kind = type(op)
    if kind.matmul is not SparseOperator.matmul or kind.__call__ is not SparseOperator.__call__:
        return False
    if not (h.device.type == "cpu" and h.dtype == torch.float32 and h.dim() == 2):
        return False
    if not (op.A.device.type == "cpu" and op.A.dtype == torch.float32):
        return False
    if any(p is not None and (p.device.type != "cpu" or p.dtype != torch.float32)
           for p in params):
        return False
    return autocast_dtype("cpu") is None


def sage_block(op: SparseOperator, h: torch.Tensor, w_neigh: torch.Tensor,
               w_root: torch.Tensor, bias: Optional[torch.Tensor],
               epilogue: Epilogue = None, aggregate_first: Optional[bool] = None
               ) -> torch.Tensor:
    """The fused layer: ``epilogue(Â-mean(h)·W_nᵀ + b + h[:n_dst]·W_rᵀ)`` (module
    docstring), with autograd. ``aggregate_first``: (Â·h)·W_nᵀ, else Â·(h·W_nᵀ); None: the
    width rule ``f_in <= f_out`` (the caller passes its own rule, so both paths agree)."""
    if aggregate_first is None:
        aggregate_first = w_neigh.shape[1] <= w_neigh.shape[0]
    return SAGEBlock.apply(h, w_neigh, w_root, bias, op, epilogue, bool(aggregate_first))


def _keep(z: torch.Tensor, seed: int, drop_units: int) -> torch.Tensor:
    """The bool keep mask of ``seed`` shaped like ``z`` (as :func:`gnnpar.nn.dropout._keep`)."""
    return torch.from_numpy(cpu_dropout.keep_mask(z.numel(), seed, drop_units)).view(z.shape)


class SAGEBlock(torch.autograd.Function):
    """See the module docstring. ``op``, ``epilogue`` and ``first`` (aggregate first) get
    no gradient."""

    @staticmethod
    def forward(ctx, h, w_n, w_r, bias, op: SparseOperator, epilogue: Epilogue, first: bool):
        h = h.contiguous()
        n_dst = op.num_dst
        agg = None
        if first:
            agg = spmm_into(op.A, h, op.fwd_buffers)
            z = torch.mm(agg, w_n.t()) if bias is None else torch.addmm(bias, agg, w_n.t())
        else:
            # a fresh product (not a reused buffer): it becomes the layer's output
            z = csr_mm(op.A, torch.mm(h, w_n.t()))
            if bias is not None:
                z.add_(bias)
        z.addmm_(h[:n_dst], w_r.t())
        keep = mode = None
        if epilogue is not None:
            seed, drop_units, scale = epilogue
            if seed is None:
                mode = "relu"
                z.relu_()
            elif cpu_dropout.usable(z) and z.dtype == torch.float32:
                mode = "compiled"
                cpu_dropout.masked_scale(z, z, seed, drop_units, scale, True, out=z)
            else:
                mode = "mask"
                keep = _keep(z, seed, drop_units)
                # where(keep & ~(z <= 0), z·scale, 0): relu, scale, then select the kept
                z.relu_().mul_(scale).masked_fill_(keep.logical_not(), 0.0)
        ctx.op, ctx.first, ctx.mode, ctx.epilogue = op, first, mode, epilogue
        ctx.save_for_backward(h, w_n, w_r, agg if ctx.needs_input_grad[1] else None,
                              z if mode is not None else None, keep)
        return z

    @staticmethod
    def backward(ctx, grad):
        h, w_n, w_r, agg, out, keep = ctx.saved_tensors
        op, n_dst = ctx.op, ctx.op.num_dst
        grad = grad.contiguous()
        if ctx.mode is None:
            dz = grad
        elif ctx.mode == "relu":
            dz = torch.ops.aten.threshold_backward(grad, out, 0)
        elif ctx.mode == "compiled":
            seed, drop_units, scale = ctx.epilogue
            dz = cpu_dropout.masked_scale(grad, out, seed, drop_units, scale, True)
        else:  # the kept mask, then ReLU's gradient on the output (0 where dropped anyway)
            scale = ctx.epilogue[2]
            dz = torch.ops.aten.threshold_backward(torch.where(keep, grad * scale, 0.0), out, 0)
        need_h, need_wn, need_wr, need_b = ctx.needs_input_grad[:4]
        dh = dwn = dwr = db = None
        if ctx.first:
            if need_wn:
                dwn = dz.t().mm(agg)
            if need_h:
                dh = spmm_into(op.AT, dz.mm(w_n), op.bwd_buffers)
        elif need_h or need_wn:
            g = spmm_into(op.AT, dz, op.bwd_buffers)  # Âᵀ·dz: the gradient of h·W_nᵀ
            if need_wn:
                dwn = g.t().mm(h)
            if need_h:
                dh = g.mm(w_n)
        if need_wr:
            dwr = dz.t().mm(h[:n_dst])
        if need_b:
            db = dz.sum(0)
        if need_h:
            dh[:n_dst].addmm_(dz, w_r)  # the root term's gradient, in place
        return dh, dwn, dwr, db, None, None, None
