"""Âᵀ of a host CSR matrix by a compiled counting sort (the sampled blocks' backward operator).

:func:`transpose_csr` gives exactly the arrays of :func:`transpose_csr_numpy`, the reference
(a stable argsort of the column indices; :func:`gnnpar.kernels.local.transpose_csr` calls this
module for host arrays): ``t_indptr`` (n_src+1,) int64, ``t_indices`` (nnz,) int64 row ids,
``t_values`` the values in Âᵀ's row order, in their own dtype. Two passes over the entries
instead of a sort: count each column, then scatter the entries row by row — entries of one
column keep their order in Â (row-major), which is what the stable sort gives, so the arrays
are identical.

A plain module-level function compiled on first use (:func:`gnnpar.kernels.jit.compile_module`;
importing numba costs most of a second) and cached on disk; ``nogil``, so sampler worker
threads run it beside the trainer. Without numba, or with ``GNNPAR_SAMPLER_KERNELS=numpy``
(the samplers' switch, :func:`gnnpar.kernels.jit.sampler_kernels_on`), the numpy reference
runs.

Input: ``indptr`` (n_dst+1,) with ``indptr[0] == 0`` and ``indptr[-1] == nnz``; ``indices``
(nnz,) int32 or int64 in ``[0, n_src)`` (not checked); ``values`` (nnz,); ``shape`` =
(n_dst, n_src).
"""
from __future__ import annotations

import numpy as np
import torch

from .jit import SAMPLER_ENV, compile_module, sampler_kernels_on

#: ``GNNPAR_SAMPLER_KERNELS=numpy`` runs the numpy reference instead (A/B measurements)
ENV = SAMPLER_ENV
#: ``available()``: the compiled kernel runs (numba importable and not switched off through
#: :data:`ENV`)
available = sampler_kernels_on
transpose = None  # the compiled kernel, set by _compiled()


def transpose_csr(indptr, indices, values, shape):
    """CSR arrays of the transpose (module docstring), numpy arrays in and out."""
    if not available():
        return transpose_csr_numpy(indptr, indices, values, shape)
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    indices = np.ascontiguousarray(indices)
    if indices.dtype not in (np.int32, np.int64):
        indices = indices.astype(np.int64)
    values = np.ascontiguousarray(values)
    return _compiled().transpose(indptr, indices, values, int(shape[1]))


def transpose_csr_tensors(indptr, indices, values, shape):
    """The transpose of CSR tensors, on their device: a stable sort by column (exact)."""
    n_dst, n_src = shape
    indices = indices.to(torch.int64)
    rows = torch.repeat_interleave(torch.arange(n_dst, dtype=torch.int64, device=indptr.device),
                                   indptr[1:] - indptr[:-1], output_size=indices.shape[0])
    order = torch.sort(indices, stable=True).indices
    t_indptr = torch.zeros(n_src + 1, dtype=torch.int64, device=indptr.device)
    torch.cumsum(torch.bincount(indices, minlength=n_src), 0, out=t_indptr[1:])
    return t_indptr, rows[order], values[order]


def transpose_csr_numpy(indptr, indices, values, shape):
    """The reference: a stable argsort of the column indices."""
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    n_dst, n_src = shape
    rows = np.repeat(np.arange(n_dst, dtype=np.int64), np.diff(indptr))
    order = np.argsort(indices, kind="stable")
    t_indptr = np.zeros(n_src + 1, dtype=np.int64)
    np.cumsum(np.bincount(indices, minlength=n_src), out=t_indptr[1:])
    return t_indptr, rows[order], np.asarray(values)[order]


def _transpose(indptr, indices, values, n_src):  # pragma: no cover - compiled
    n_dst = indptr.shape[0] - 1
    nnz = indices.shape[0]
    t_indptr = np.zeros(n_src + 1, np.int64)
    for e in range(nnz):
        t_indptr[indices[e] + 1] += 1
    for c in range(n_src):
        t_indptr[c + 1] += t_indptr[c]
    fill = t_indptr[:n_src].copy()
    rows = np.empty(nnz, np.int64)
    vals = np.empty(nnz, values.dtype)
    for r in range(n_dst):
        for e in range(indptr[r], indptr[r + 1]):
            c = indices[e]
            p = fill[c]
            rows[p] = r
            vals[p] = values[e]
            fill[c] = p + 1
    return t_indptr, rows, vals


def _compiled():
    """This module with its kernel compiled (numba imported on the first call)."""
    return compile_module(__name__, ("transpose",), cache=True, nogil=True)
