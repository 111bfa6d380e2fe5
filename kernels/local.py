"""Local (single-process) sparse × dense products with an explicit backward.

``Z = Â · H`` with Â an ``n_dst × n_src`` CSR matrix. The backward needs ``Âᵀ · G``; torch's
implicit transpose of a CSR matrix is slow (it is a CSC walk), so :class:`SparseOperator` keeps
Âᵀ as its own CSR, built once. Nothing here assumes Â is symmetric (SAGE's mean aggregation
is not, nor is GCN on a directed graph).

Under :func:`torch.autocast` (``--precision bf16``, :mod:`gnnpar.nn.precision`) an operator
casts float32 features to the autocast dtype before its product (:func:`autocast_input`):
autocast only rewrites the ops it knows, and a custom product is not one of them. The product
sums in float32 and returns the features' dtype; gradients come back in the dtype of the
input the operator was given.

Shapes: ``H`` (n_src, f) → ``Z`` (n_dst, f); backward ``G`` (n_dst, f) → (n_src, f).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from . import csr_transpose
from .cpu_spmm import csr_mm
from .edge_ops import CsrEdges

# torch warns once per process that sparse CSR is "beta"; the ops used here are stable.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def autocast_dtype(device_type: str):
    """The dtype :func:`torch.autocast` casts matmul inputs to on ``device_type``, or None
    outside an autocast region."""
    try:
        on = torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 asks per device type by name
        on = (torch.is_autocast_cpu_enabled() if device_type == "cpu"
              else torch.is_autocast_enabled())
    if not on:
        return None
    try:
        return torch.get_autocast_dtype(device_type)
    except AttributeError:  # torch < 2.4
        return (torch.get_autocast_cpu_dtype() if device_type == "cpu"
                else torch.get_autocast_gpu_dtype())


def autocast_input(h: torch.Tensor) -> torch.Tensor:
    """The features an SpMM takes: float32 ``h`` cast to the autocast dtype inside an
    autocast region (bf16 features into the product, a tracked cast, so the gradient flows
    back as float32), else ``h`` itself."""
    if h.dtype != torch.float32:
        return h
    dtype = autocast_dtype(h.device.type)
    return h if dtype is None else h.to(dtype)


def as_tensor(a, dtype, device=None) -> torch.Tensor:
    """A torch tensor of ``a`` (numpy, memory-mapped or torch); read-only arrays are copied,
    since torch tensors must be writable."""
    if isinstance(a, torch.Tensor):
        return a.to(device=device, dtype=getattr(torch, np.dtype(dtype).name))
    arr = np.asarray(a, dtype=dtype)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr).to(device)


def index_dtype(nnz: int, shape, device) -> np.dtype:
    """A CSR matrix's index dtype: int32 on the CPU where every index fits (torch's MKL product
    takes int32 indices; int64 ones it converts on every call, an nnz-sized copy, to the
    same product), else int64 (CUDA keeps the kernels' int64 products)."""
    cpu = device is None or torch.device(device).type == "cpu"
    return np.dtype(np.int32 if cpu and max(int(nnz), *(int(s) + 1 for s in shape)) <
                    np.iinfo(np.int32).max else np.int64)


def csr_tensor(indptr, indices, values, shape, device=None, index_dtype=np.int64
               ) -> torch.Tensor:
    """A torch sparse CSR tensor from numpy/torch arrays (``index_dtype`` indices, int64
    unless told, float32 values)."""
    crow = as_tensor(indptr, index_dtype)
    col = as_tensor(indices, index_dtype)
    val = as_tensor(values, np.float32)
    return torch.sparse_csr_tensor(crow, col, val, size=tuple(shape), device=device,
                                   check_invariants=False)


def transpose_csr(indptr, indices, values, shape):
    """CSR arrays of the transpose (a counting sort by column; stable, so exact). Tensors in,
    tensors out on their device (the device sampler's blocks); else numpy
    (:mod:`gnnpar.kernels.csr_transpose`: compiled, the stable argsort's arrays)."""
    if isinstance(indptr, torch.Tensor):
        return csr_transpose.transpose_csr_tensors(indptr, indices, values, shape)
    return csr_transpose.transpose_csr(indptr, indices, values, shape)


class OutputBuffers:
    """Output tensors reused from one training step to the next (CPU only).

    A fresh large tensor costs page faults on every step (``docs/performance.md``). The k-th
    product of a pass
    writes into slot k; :meth:`start_pass` rewinds. Reuse is safe for a caller that finishes
    each pass (forward and backward) before the next starts, as the trainers do; a tensor that
    autograd saved from an earlier pass makes backward fail loudly (version check, bumped by
    :func:`gnnpar.kernels.cpu_spmm.written` after the compiled kernels' writes), never
    silently. Off unless the runtime turns it on. Calls beyond ``max_slots`` in one pass (a
    caller that never rewinds) get fresh tensors, so memory stays bounded.
    """

    def __init__(self, max_slots: int = 32):
        self.slots = {}
        self.next = 0
        self.max_slots = max_slots

    def start_pass(self) -> None:
        self.next = 0

    def take(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        key = self.next
        self.next += 1
        shape = (rows,) + tuple(like.shape[1:])
        if key >= self.max_slots:
            return like.new_empty(shape)
        buf = self.slots.get(key)
        if (buf is None or buf.shape != shape or buf.dtype != like.dtype
                or buf.device != like.device):
            buf = like.new_empty(shape)
            self.slots[key] = buf
        return buf


def spmm_into(A: torch.Tensor, h: torch.Tensor, buffers) -> torch.Tensor:
    """A·h (:func:`~gnnpar.kernels.cpu_spmm.csr_mm`), written into a reused buffer when
    ``buffers`` is given (CPU), else a new tensor."""
    if buffers is None or h.device.type != "cpu":
        return csr_mm(A, h)
    return csr_mm(A, h, buffers.take(A.shape[0], h))


class SparseOperator:
    """Â and Âᵀ as CSR tensors on one device: ``op.matmul(H)`` = Â·H with autograd.

    ``num_dst``/``num_src`` are Â's shape. Bipartite blocks (mini-batch) use the convention
    that the first ``num_dst`` source rows are the destination nodes themselves.
    ``reuse_outputs()`` turns on :class:`OutputBuffers` (call :meth:`start_pass` before each
    forward pass). ``transpose=False`` leaves ``AT`` to a subclass that builds it later
    (:class:`gnnpar.sampling.blocks.BlockOperator`).
    """

    def __init__(self, indptr, indices, values, shape, device=None, transpose: bool = True):
        self.num_dst, self.num_src = int(shape[0]), int(shape[1])
        self.nnz = int(indices.shape[0] if isinstance(indices, torch.Tensor)
                       else np.asarray(indices).shape[0])
        idx = index_dtype(self.nnz, shape, device)  # int32 on the CPU where it fits
        self.A = csr_tensor(indptr, indices, values, shape, device, idx)
        if transpose:
            self.AT = csr_tensor(*transpose_csr(indptr, indices, values, shape),
                                 (self.num_src, self.num_dst), device, idx)
        self.fwd_buffers = self.bwd_buffers = None

    def to(self, device) -> "SparseOperator":
        self.A, self.AT = self.A.to(device), self.AT.to(device)
        self._edges = None
        return self

    def edges(self):
        """Â's structure as an edge-valued operator (:class:`~.edge_ops.CsrEdges`, for
        attention layers), made on first use and kept."""
        if getattr(self, "_edges", None) is None:  # (a sampled block's operator sets no slot)
            self._edges = CsrEdges(self.A.crow_indices(), self.A.col_indices(), self.num_src)
        return self._edges

    def reuse_outputs(self) -> "SparseOperator":
        self.fwd_buffers, self.bwd_buffers = OutputBuffers(), OutputBuffers()
        return self

    def start_pass(self) -> None:
        if self.fwd_buffers is not None:
            self.fwd_buffers.start_pass()
            self.bwd_buffers.start_pass()

    def matmul(self, h: torch.Tensor) -> torch.Tensor:
        return LocalSpMM.apply(autocast_input(h), self)

    __call__ = matmul


class LocalSpMM(torch.autograd.Function):
    """Z = Â·H; dH = Âᵀ·G through the stored transpose (skipped when H needs no gradient),
    in H's dtype."""

    @staticmethod
    def forward(ctx, h, op: SparseOperator):
        ctx.op, ctx.dtype = op, h.dtype
        return spmm_into(op.A, h.contiguous(), op.fwd_buffers)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None, None
        return spmm_into(ctx.op.AT, grad.contiguous(), ctx.op.bwd_buffers).to(ctx.dtype), None
