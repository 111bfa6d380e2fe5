"""Overlap: compute with the H rows a rank holds while the others are in flight.

A rank's block of Â splits by column into the columns whose H rows it already holds (*held*:
its own rows) and the rest (rows another rank sends). Since Â·H = Â_held·H_held + Â_rest·H_rest,
a kernel issues the exchange (``Comm.start_*``), multiplies Â_held while the rows travel, then
adds Â_rest times what arrived. The backward runs the same way round: Â_restᵀ·G first (that is
what is sent back), the exchange issued, Â_heldᵀ·G while it travels.

The two parts hold every non-zero once, so memory and flops are those of the unsplit block;
the sum is taken in another order than one CSR product would take it (fp32 rounding, not
exactness to serial, changes). ``Comm.seconds`` then counts only the exposed waits
(:mod:`kernels.comm`).
"""
from __future__ import annotations

import numpy as np
import torch

from .cpu_spmm import csr_mm
from .local import csr_tensor, transpose_csr


class _Part:
    """One column part: Â_part and its own transpose (CSR tensors)."""

    def __init__(self, rows, cols, values, shape, device):
        indptr = np.zeros(shape[0] + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=shape[0]), out=indptr[1:])
        self.A = csr_tensor(indptr, cols, values, shape, device)
        self.AT = csr_tensor(*transpose_csr(indptr, cols, values, shape),
                             (shape[1], shape[0]), device)


class ColumnSplit:
    """Â (CSR arrays, ``shape``) split at the held columns ``[lo, hi)``.

    ``held`` has those columns renumbered from 0 (it multiplies the rank's own H rows);
    ``rest`` has the others less ``rest_offset`` (it multiplies the received rows: pass
    ``rest_offset = hi`` when the received rows are exactly the columns past ``hi``, as in a
    halo layout, or 0 to multiply all rows with the held ones left out).
    """

    def __init__(self, indptr, indices, values, shape, lo: int, hi: int, rest_offset: int = 0,
                 device=None):
        indptr = np.asarray(indptr, np.int64)
        indices = np.asarray(indices, np.int64)
        values = np.asarray(values, np.float32)
        n_dst, n_src = int(shape[0]), int(shape[1])
        rows = np.repeat(np.arange(n_dst, dtype=np.int64), np.diff(indptr))
        inside = (indices >= lo) & (indices < hi)
        self.held = _Part(rows[inside], indices[inside] - lo, values[inside], (n_dst, hi - lo),
                          device)
        out = ~inside
        self.rest = _Part(rows[out], indices[out] - rest_offset, values[out],
                          (n_dst, n_src - rest_offset), device)

    def forward(self, h_held: torch.Tensor, pending) -> torch.Tensor:
        """Â_held·h_held computed while ``pending`` (the rest's rows) travels, plus
        Â_rest·(its result)."""
        z = csr_mm(self.held.A, h_held)
        return z.add_(csr_mm(self.rest.A, pending.wait()))

    def backward(self, grad: torch.Tensor, send):
        """``send(Â_restᵀ·grad)`` issues the return trip (a Pending); Â_heldᵀ·grad is computed
        while it travels. Returns (Â_heldᵀ·grad, the Pending)."""
        pending = send(csr_mm(self.rest.AT, grad))
        return csr_mm(self.held.AT, grad), pending
