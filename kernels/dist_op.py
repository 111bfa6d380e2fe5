"""What every distributed SpMM operator shares.

A distributed operator is called like the serial one, ``op(h)`` → Â·h for *this rank's rows*
(``op.num_dst`` of them, the rows of ``h``), so model code runs unchanged. Forward traffic is
counted in phase ``forward`` (``eval`` when autograd is off), the backward's in ``backward``.
"""
from __future__ import annotations

import torch

from .comm import Comm


class DistOperator:
    """Base: subclasses set ``num_dst``, ``num_src``, ``comm`` and a ``Function`` with
    ``apply(h, op)``."""

    Function = None
    comm: Comm
    num_dst: int
    num_src: int

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if h.shape[0] != self.num_src:
            raise ValueError(f"{type(self).__name__} expects {self.num_src} local rows, "
                             f"got {h.shape[0]}")
        phase = "forward" if torch.is_grad_enabled() else "eval"
        with self.comm.in_phase(phase):
            return self.Function.apply(h, self)

    matmul = __call__


def backward_phase(comm: Comm):
    """Context for a backward pass's collectives."""
    return comm.in_phase("backward")
