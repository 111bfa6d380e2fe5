"""CSR × dense on GPUs: a row-split Triton kernel with fp32 accumulation.

``Z = A · H``: program (i, t) computes row i of Z for feature columns
``[t·BLOCK_F, (t+1)·BLOCK_F)``. It walks row i's entries ``BLOCK_E`` at a time, gathers the
H rows they name (fp32, bf16 or fp16 — read at their own width, so bf16 features halve the
gather traffic), multiplies by the entry values and sums in fp32, and stores the row once in
H's dtype. One program per row and feature tile: no atomics, no partial outputs.

Selected by ``GNNPAR_SPMM_GPU=triton`` (:func:`gnnpar.kernels.cpu_spmm.csr_mm` routes CUDA
products here then; by default they stay on cuSPARSE through ``torch.sparse.mm`` until the
kernel is measured faster on the GPU at hand — ``scripts/bench_spmm.py --device cuda``).
Without Triton (CPU-only torch wheels do not ship it) nothing here is used. The tests run the
same kernel on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``) and compare it
with ``torch.sparse.mm``.

Shapes: ``indptr`` (n_dst+1,), ``indices`` (nnz,) int32/int64, ``values`` (nnz,), H
(n_src, f) → Z (n_dst, f).
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch

ENV = "GNNPAR_SPMM_GPU"
BLOCK_E = 32


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether Triton is installed (it ships with CUDA builds of torch; optional elsewhere;
    looked up once, as :func:`selected` runs on every CUDA product)."""
    return importlib.util.find_spec("triton") is not None


def selected(h: torch.Tensor) -> bool:
    """Whether CUDA products go through this kernel (``GNNPAR_SPMM_GPU=triton``)."""
    return h.device.type == "cuda" and os.environ.get(ENV) == "triton" and available()


@functools.lru_cache(maxsize=None)
def _kernel():
    """The compiled kernel, defined on first use: importing Triton takes most of a second,
    which no process that never multiplies on a GPU should pay."""
    import triton
    import triton.language as tl

    @triton.jit
    def _row_split(indptr, indices, values, h, out, f, stride_h, stride_out,
                   BLOCK_F: tl.constexpr, BLOCK_E: tl.constexpr):  # pragma: no cover
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        fmask = cols < f
        start = tl.load(indptr + row).to(tl.int64)
        end = tl.load(indptr + row + 1).to(tl.int64)
        acc = tl.zeros([BLOCK_F], dtype=tl.float32)
        for e0 in range(start, end, BLOCK_E):
            e = e0 + tl.arange(0, BLOCK_E)
            emask = e < end
            c = tl.load(indices + e, mask=emask, other=0).to(tl.int64)
            v = tl.load(values + e, mask=emask, other=0.0).to(tl.float32)
            hv = tl.load(h + c[:, None] * stride_h + cols[None, :],
                         mask=emask[:, None] & fmask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(v[:, None] * hv, axis=0)
        tl.store(out + row * stride_out + cols, acc.to(out.dtype.element_ty), mask=fmask)

    return _row_split, triton.cdiv


def block_f(f: int) -> int:
    """Feature tile: the next power of two of f, between 16 and 128."""
    b = 16
    while b < f and b < 128:
        b *= 2
    return b


def csr_mm(A: torch.Tensor, h: torch.Tensor, out=None) -> torch.Tensor:
    """``A @ h`` by the Triton kernel (A a CSR tensor on h's device; no autograd)."""
    h = h.detach().contiguous()
    n_dst, f = A.shape[0], h.shape[1]
    if out is None:
        out = torch.empty((n_dst, f), dtype=h.dtype, device=h.device)
    if n_dst == 0 or f == 0:
        return out.zero_()
    bf = block_f(f)
    kernel, cdiv = _kernel()
    grid = (n_dst, cdiv(f, bf))
    kernel[grid](A.crow_indices(), A.col_indices(), A.values().detach(), h, out, f,
                     h.stride(0), out.stride(0), BLOCK_F=bf, BLOCK_E=BLOCK_E)
    return out
