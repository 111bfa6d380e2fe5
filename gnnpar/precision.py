"""``--precision {fp32,bf16}``: what a training step runs in.

``fp32`` runs everything in float32, as gnnpar always has (bit for bit: nothing here touches
an fp32 run). ``bf16`` is mixed precision:

- the forward pass runs under :func:`torch.autocast` on the run's device type with
  ``dtype=torch.bfloat16``, so the dense layers (``nn.Linear``, matmuls) compute in bf16
  from float32 weights cast on the fly;
- every SpMM takes its features in bf16 (the operators cast them under autocast,
  :func:`gnnpar.kernels.local.autocast_input`) and sums in float32 (``csr_mm``), returning
  bf16 — on a GPU that halves the gather traffic of the memory-bound product and of the
  distributed kernels' feature/gradient exchanges;
- the parameters, their gradients and the optimiser state stay float32 (the master weights:
  autocast only casts copies), and the loss is computed from float32 logits
  (:func:`loss_logits`), outside autocast.

The trainers (:mod:`gnnpar.trainer`, :mod:`gnnpar.sampling.loop`) wrap their forward passes
in :func:`autocast` and their loss inputs in :func:`loss_logits`; nothing else needs to know.
"""
from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "bf16")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


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
    ``bf16``, nothing at all for ``fp32`` (an fp32 run stays exactly what it was)."""
    if check(precision) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def loss_logits(out: torch.Tensor) -> torch.Tensor:
    """The logits the loss is computed from: float32 (the same tensor when already fp32), so
    the softmax and its sum over many nodes are not rounded to bf16's 8 bits."""
    return out.float()
