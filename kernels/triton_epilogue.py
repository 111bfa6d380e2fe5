"""Bias, ReLU and dropout in one pass over an activation on GPUs (Triton).

A hidden GCN layer ends with ``dropout(relu(z + b))``. As torch ops on CUDA that is three
kernels forward (bias add, ReLU, dropout with a stored bool mask) and four backward (mask
multiply, ReLU's, the bias's row sum, and the sum of the two paths), each a full pass over an
(n, f) tensor, and the mask held in memory between them.

Here the forward is one pass (``z`` and the bias in, the activation out) and the backward one
pass (the gradient and the forward's output in, ``dz`` out; the bias's gradient is the row sum
of ``dz``) — one kernel, :func:`_kernel`'s, serves both, as the CPU pass does. No mask is
stored: element i is kept when a 16-bit lane of a hash of (seed, i // 4) is at least the drop
threshold — the same hash, lanes and threshold as the CPU pass
(:mod:`gnnpar.kernels.cpu_dropout`), so a seed gives the same mask on either device — and the
backward recomputes it from the seed. With ReLU, an element passes the gradient where it was
kept and the forward's output is not ≤ 0 (exactly where ReLU passed and dropout kept).

Non-finite values follow the rule :mod:`gnnpar.nn.dropout` states, as the CPU pass does: ReLU and
dropout select with ``tl.where``, never multiply by 0, so NaN passes ReLU and propagates where
kept, −inf becomes 0, +inf stays +inf where kept, and everything dropped or cut by ReLU is
exactly 0, gradients included.

Sums and products are in float32; ``z`` may be float32, bf16 or fp16 and the output has its
dtype (the bias is float32, added before rounding). Used by :mod:`gnnpar.nn.dropout` for CUDA
tensors where Triton is installed, unless ``GNNPAR_EPILOGUE_GPU=torch``. The tests run it on
CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``) against the CPU pass.

Shapes: z (n, f) or any shape when there is no bias; bias (f,) → out like z.
"""
from __future__ import annotations

import functools
import os

import torch

from .triton_spmm import available

ENV = "GNNPAR_EPILOGUE_GPU"
MODES = ("triton", "torch")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: elements per program (a multiple of 4: one hash serves four elements)
BLOCK = 2048


def mode() -> str:
    """``GNNPAR_EPILOGUE_GPU``, ``triton`` when unset; ValueError for anything else."""
    m = os.environ.get(ENV) or "triton"
    if m not in MODES:
        raise ValueError(f"{ENV} must be one of {', '.join(MODES)}, got {m!r}")
    return m


def usable(x: torch.Tensor) -> bool:
    """Whether the fused pass serves ``x``: a CUDA tensor of :data:`DTYPES`, Triton installed,
    and not switched off (the interpreter tests call :func:`forward`/:func:`backward` on CPU
    tensors directly)."""
    return (x.device.type == "cuda" and x.dtype in DTYPES and mode() == "triton"
            and available())


@functools.lru_cache(maxsize=None)
def _kernel():
    """The compiled kernel, defined on first use: importing Triton takes most of a second,
    which no process that never runs on a GPU should pay."""
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["seed", "drop_units"])
    def _masked_scale(src, bias, cond, out, total, f, seed, drop_units, scale,
                      HAS_BIAS: tl.constexpr, RELU: tl.constexpr, COND_IS_SRC: tl.constexpr,
                      BLOCK: tl.constexpr):  # pragma: no cover - compiled
        # out = (src + bias)·scale where kept (and, with RELU, cond is not ≤ 0: positive or
        # NaN), else 0, by a select; kept: lane i % 4 of splitmix64's finaliser of
        # seed + (i // 4)·φ at least drop_units
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = offs < total
        v = tl.load(src + offs, mask=live, other=0.0).to(tl.float32)
        if HAS_BIAS:
            v += tl.load(bias + offs % f, mask=live, other=0.0).to(tl.float32)
        z = seed.to(tl.uint64) + (offs // 4).to(tl.uint64) * 0x9E3779B97F4A7C15
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        z = z ^ (z >> 31)
        lane = (z >> ((offs % 4) * 16).to(tl.uint64)) & 0xFFFF
        keep = lane >= drop_units.to(tl.uint64)
        if RELU:
            if COND_IS_SRC:
                c = v
            else:
                c = tl.load(cond + offs, mask=live, other=0.0).to(tl.float32)
            keep = keep & ((c > 0.0) | (c != c))
        tl.store(out + offs, tl.where(keep, v * scale, 0.0).to(out.dtype.element_ty),
                 mask=live)

    return _masked_scale, triton.cdiv


def _run(src, bias, cond, seed, drop_units, scale, relu) -> torch.Tensor:
    src = src.detach().contiguous()
    out = torch.empty_like(src)
    total = src.numel()
    if total == 0:
        return out
    kernel, cdiv = _kernel()
    f = src.shape[-1] if bias is not None else 1
    b = bias.detach().contiguous() if bias is not None else src
    c = cond.detach().contiguous() if cond is not None else src
    kernel[(cdiv(total, BLOCK),)](src, b, c, out, total, f, seed, drop_units, float(scale),
                                  HAS_BIAS=bias is not None, RELU=relu,
                                  COND_IS_SRC=cond is None, BLOCK=BLOCK)
    return out


def forward(z: torch.Tensor, bias, seed: int, drop_units: int, scale: float,
            relu: bool) -> torch.Tensor:
    """``dropout(relu(z + bias))`` (ReLU only with ``relu``; no bias when ``bias`` is None):
    kept elements (hash lane ≥ ``drop_units``) scaled by ``scale``, in z's dtype."""
    return _run(z, bias, None, seed, drop_units, scale, relu)


def backward(grad: torch.Tensor, out, seed: int, drop_units: int, scale: float,
             relu: bool) -> torch.Tensor:
    """The gradient of :func:`forward` with respect to ``z``, from the forward's output
    ``out`` (needed with ``relu`` only), in the gradient's dtype."""
    return _run(grad, None, out if relu else None, seed, drop_units, scale, relu)
