"""``--precision {fp32,bf16,tf32}``: what a training step runs in.

``fp32`` runs everything in float32 (nothing here touches an fp32 run, bit for bit). ``bf16``
is mixed precision:

- the forward pass runs under :func:`torch.autocast` on the run's device type with
  ``dtype=torch.bfloat16``, so the dense layers (``nn.Linear``, matmuls) compute in bf16
  from float32 weights cast on the fly (on the CPU the built-in layers' products may run as
  float32 GEMMs of the bf16 values where those are faster, the same products up to the
  order of their float32 sums: :mod:`gnnpar.nn.bf16_dense`);
- every SpMM takes its features in bf16 (the operators cast them under autocast,
  :func:`gnnpar.kernels.local.autocast_input`) and sums in float32 (``csr_mm``), returning
  bf16 — on a GPU that halves the gather traffic of the memory-bound product and of the
  distributed kernels' feature/gradient exchanges;
- the parameters, their gradients and the optimiser state stay float32 (the master weights:
  autocast only casts copies), and the loss is computed from float32 logits
  (:func:`loss_logits`), outside autocast.

``tf32`` (CUDA only) is fp32 everywhere except that float32 matrix products — the dense layers,
forward and backward — may run on TF32 tensor cores (10-bit mantissas in, fp32 sums:
:func:`torch.set_float32_matmul_precision` ``"high"``, for the step only). The SpMMs and
everything else stay fp32. The dense products' relative error grows from fp32's ~1e-7 to
TF32's ~1e-4 (10-bit mantissas); ``docs/performance.md`` has the measured speed and error.

The trainers (:mod:`gnnpar.training.trainer`, :mod:`gnnpar.training.minibatch_loop`) run each step
(forward and
backward) and each evaluation in :func:`matmuls`, their forward passes in :func:`autocast`
and their loss inputs through :func:`loss_logits`; nothing else needs to know.
"""
from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "bf16", "tf32")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "tf32": torch.float32}


def check(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else ValueError."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype the dense layers and SpMM inputs run in (float32 or bfloat16)."""
    return _DTYPES[check(precision)]


def autocast(precision: str, device) -> contextlib.AbstractContextManager:
    """The context a forward pass runs in: autocast to bf16 on ``device``'s type for
    ``bf16``, nothing at all for ``fp32`` and ``tf32`` (an fp32 run stays exactly what it
    was)."""
    if check(precision) != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def matmuls(precision: str) -> contextlib.AbstractContextManager:
    """The context a step (forward and backward) or an evaluation runs in: float32 matrix
    products may use TF32 for ``tf32`` (torch's float32 matmul precision ``"high"``, put
    back afterwards); nothing at all otherwise."""
    if check(precision) != "tf32":
        return contextlib.nullcontext()
    return _float32_matmuls("high")


@contextlib.contextmanager
def _float32_matmuls(mode: str):
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(mode)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def loss_logits(out: torch.Tensor) -> torch.Tensor:
    """The logits the loss is computed from: float32 (the same tensor when already fp32), so
    the softmax and its sum over many nodes are not rounded to bf16's 8 bits."""
    return out.float()
