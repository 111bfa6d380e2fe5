"""Dropout (and ReLU and a bias add before it) with a mask drawn from a hash, not from
per-element draws.

``torch.nn.functional.dropout`` draws one Bernoulli sample per element through the generic
path, which on CPU costs several full passes over the tensor. Here each call draws one seed
from torch's generator and element i is kept when a 16-bit lane of a hash of (seed, i // 4) is
at least a threshold (:mod:`gnnpar.kernels.cpu_dropout`). The drop probability is rounded to a
multiple of 1/65536 (0.5 is exact) and the scale uses that rounded probability, so the
expectation is exactly preserved. Deterministic per torch seed, and the same masks on both CPU
paths:

- with numba, one compiled pass applies the mask (after ReLU, for :func:`relu_dropout`) and
  scales, and the backward recomputes the mask from the seed — no mask is stored;
- without (no numba, or ``GNNPAR_SPMM=torch``), the same keep decisions are computed with
  numpy into a bool mask, kept for the backward.

So a run gives the same numbers on either path. On CUDA (with Triton) one pass each way does
the bias add, ReLU and dropout together (:mod:`gnnpar.kernels.triton_epilogue`: the same hash,
so a seed gives the same mask as on the CPU, and no mask is stored);
``GNNPAR_EPILOGUE_GPU=torch`` or no Triton uses torch's ops.

Non-finite values: ReLU and dropout select, never multiply by 0 (inf·0 and NaN·0 are NaN).
Every path above but torch's CUDA ops gives ``torch.where(keep & ~(x <= 0), x * scale, 0)``
(without ReLU, ``torch.where(keep, x * scale, 0)``) and that expression's gradient: ``g·scale``
at the same elements, exactly 0 elsewhere. So NaN passes ReLU, as ``torch.relu`` lets it, and
propagates where kept, gradient included, so a diverged run still ends with a non-finite loss
(exit 4); −inf becomes 0; +inf stays +inf where kept; a dropped element, and the gradient
where ReLU was off or the element dropped, are 0 even when the value or the incoming gradient
is ±inf or NaN. Torch's ``dropout(relu(x))`` agrees but at dropped elements, which it
multiplies by 0: a dropped ±inf or NaN, or a non-finite gradient at a dropped element that
ReLU passed, gives NaN there. The passes cannot follow it in the backward, which sees only the
forward's output, 0 at a dropped element whatever the input was; selecting both ways keeps the
backward the exact gradient of the forward.

:func:`bias_relu_dropout` is what a hidden layer ends with: ``dropout(relu(z + bias))``, one
pass on a GPU; on CPUs the bias add is its own op (:func:`add_bias`) and ReLU + dropout one
compiled pass.

Shapes: x (…) → same shape; the seed (compiled paths) or the bool mask is kept for the
backward. With a bias: z (n, f), bias (f,).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from gnnpar.kernels import cpu_dropout, triton_epilogue


def _units(p: float):
    """(drop threshold in 1/65536 units, scale of the kept elements)."""
    drop_units = int(round(p * 65536))
    return drop_units, 65536.0 / (65536 - drop_units)


def _seed() -> int:
    return int(torch.randint(0, 2 ** 62, (1,)))


def _keep(x: torch.Tensor, p: float):
    """(bool keep mask shaped like ``x``, scale of the kept elements)."""
    drop_units, scale = _units(p)
    keep = cpu_dropout.keep_mask(x.numel(), _seed(), drop_units)
    return torch.from_numpy(keep).view(x.shape), scale


def _select(t: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """``t·scale`` where kept, else exactly 0 (a select: inf·0 and NaN·0 would be NaN)."""
    return torch.where(keep, t * scale, 0.0)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        keep, ctx.scale = _keep(x, p)
        ctx.save_for_backward(keep)
        return _select(x, keep, ctx.scale)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return _select(grad, keep, ctx.scale), None


class _HashDropout(torch.autograd.Function):
    """One pass each way (module docstring) by ``kernel`` — :class:`_CPUPass` or
    :mod:`gnnpar.kernels.triton_epilogue`: the bias add (unless None), ReLU (with ``relu``),
    dropout; the backward recomputes the mask from the seed."""

    @staticmethod
    def forward(ctx, z, bias, p, relu, kernel):
        ctx.seed = _seed()
        ctx.units, ctx.relu, ctx.kernel = _units(p), relu, kernel
        ctx.bias_dtype = None if bias is None else bias.dtype
        out = kernel.forward(z, bias, ctx.seed, *ctx.units, relu)
        ctx.save_for_backward(out if relu else z.new_empty(0))
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        dz = ctx.kernel.backward(grad, out if ctx.relu else None, ctx.seed, *ctx.units,
                                 ctx.relu)
        db = None
        if ctx.needs_input_grad[1]:  # the bias's gradient: dz summed over the rows, in fp32
            db = dz.reshape(-1, dz.shape[-1]).sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dz, db, None, None, None


class _CPUPass:
    """:mod:`gnnpar.kernels.cpu_dropout`'s pass in the triton_epilogue call shape (no bias:
    on CPUs a layer adds its own)."""

    @staticmethod
    def forward(z, bias, seed, drop_units, scale, relu):
        assert bias is None
        return cpu_dropout.masked_scale(z, z, seed, drop_units, scale, relu)

    @staticmethod
    def backward(grad, out, seed, drop_units, scale, relu):
        return cpu_dropout.masked_scale(grad, grad if out is None else out, seed, drop_units,
                                        scale, relu)


def add_bias(z: torch.Tensor, bias) -> torch.Tensor:
    """z + bias in z's dtype (bf16 activations stay bf16; the bias itself stays float32)."""
    return z if bias is None else z + bias.to(z.dtype)


def _check(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout with drop probability ``p`` (0 ≤ p < 1); identity when not training."""
    if not training or p == 0.0:
        return x
    _check(p)
    if triton_epilogue.usable(x):
        return _HashDropout.apply(x, None, p, False, triton_epilogue)
    if x.device.type != "cpu":  # no Triton, or switched off: torch's fused CUDA kernel
        return F.dropout(x, p, True)
    if cpu_dropout.usable(x):
        return _HashDropout.apply(x, None, p, False, _CPUPass)
    if not x.requires_grad:
        return _select(x, *_keep(x, p))
    return _Dropout.apply(x, p)


def mask_units(p: float):
    """``(drop threshold in 1/65536 units, scale of the kept elements)`` of drop probability
    ``p`` (checked): what the passes here draw their masks with, for a kernel elsewhere
    that drops alike (the sampler's feature copy, :mod:`gnnpar.sampling.row_gather`)."""
    _check(p)
    return _units(p)


def relu_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``dropout(relu(x), p, training)``; one compiled pass each way on CPUs (float32)."""
    if not training or p == 0.0:
        return F.relu(x)
    _check(p)
    if triton_epilogue.usable(x):
        return _HashDropout.apply(x, None, p, True, triton_epilogue)
    if cpu_dropout.usable(x):
        return _HashDropout.apply(x, None, p, True, _CPUPass)
    return dropout(F.relu(x), p, training)


def fuses_bias(x: torch.Tensor, p: float, training: bool = True) -> bool:
    """Whether :func:`bias_relu_dropout` does the bias add in its one GPU pass for activations
    like ``x`` (training with dropout, on CUDA with Triton): then a layer may hand its bias
    over. Elsewhere a layer adds its own (:func:`add_bias`)."""
    return training and p != 0.0 and triton_epilogue.usable(x)


def bias_relu_dropout(z: torch.Tensor, bias, p: float, training: bool = True) -> torch.Tensor:
    """``dropout(relu(z + bias), p, training)``; one pass each way on a GPU with Triton, else
    :func:`add_bias` then :func:`relu_dropout`. ``bias`` (f,) or None; z (n, f)."""
    if training and p != 0.0:
        _check(p)
        if triton_epilogue.usable(z):
            return _HashDropout.apply(z, bias, p, True, triton_epilogue)
    return relu_dropout(add_bias(z, bias), p, training)
