"""What every distributed SpMM operator shares.

A distributed operator is called like the serial one, ``op(h)`` → Â·h for *this rank's rows*
(``op.num_dst`` of them, the rows of ``h``), so model code runs unchanged. Forward traffic is
counted in phase ``forward`` (``eval`` when autograd is off), the backward's in ``backward``.
A builder may also give the operator ``row_ids`` (the global ids of the rows it owns, when
they differ from the shard's) and ``take_rows(shard, a)``.

Under autocast (``--precision bf16``) the operator takes its features in the autocast dtype
(:func:`gnnpar.kernels.local.autocast_input`): the exchanges then move bf16 rows, the local
products sum in float32, and the gradient returns in the dtype of the input.
"""
from __future__ import annotations

import numpy as np
import torch

from gnnpar.datasets import InputError
from gnnpar.datasets.normalize import sum_values

from .comm import Comm
from .local import autocast_input


def shard_values(shard, norm: str) -> np.ndarray:
    """The shard's Â values under normalisation ``norm`` (what every builder and sampler
    reads). ``"sum"`` is S's raw weights as float32, which is what the writer stores for it
    (``partitioners/shard_build.py``), so a shard written without it gives it from its
    ``raw_weight``: a model asking for the plain adjacency needs no repartition."""
    if norm in shard.values:
        return np.asarray(shard.values[norm])
    raw = getattr(shard, "raw_weight", None)
    if norm == "sum" and raw is not None:
        return sum_values(raw)
    raise InputError(f"the shards hold normalisations {sorted(shard.values)}, not {norm!r}; "
                     f"repartition with it")


class RowsSpMM(torch.autograd.Function):
    """Z = Â·H through the operator's ``forward_rows``; dH through its ``backward_rows``, in
    H's dtype, skipped when H needs no gradient, its traffic counted in phase ``backward``."""

    @staticmethod
    def forward(ctx, h, op):
        ctx.op, ctx.dtype = op, h.dtype
        return op.forward_rows(h)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None, None
        with ctx.op.comm.in_phase("backward"):
            return ctx.op.backward_rows(grad.contiguous()).to(ctx.dtype), None


class DistOperator:
    """Base: subclasses set ``num_dst``, ``num_src``, ``comm`` and define
    ``forward_rows(h)`` (this rank's rows of Â·H) and ``backward_rows(grad)`` (this rank's
    rows of Âᵀ·G, grad contiguous)."""

    comm: Comm
    num_dst: int
    num_src: int

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if h.shape[0] != self.num_src:
            raise ValueError(f"{type(self).__name__} expects {self.num_src} local rows, "
                             f"got {h.shape[0]}")
        phase = "forward" if torch.is_grad_enabled() else "eval"
        with self.comm.in_phase(phase):
            return RowsSpMM.apply(autocast_input(h), self)

    matmul = __call__

