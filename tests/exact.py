"""Exact references for the CPU products, in the arithmetic each path is built for.

The compiled kernel (kernels/cpu_spmm.py) sums each output row's entries in CSR order in
float32, each product rounded before it is added (no fused multiply-add). torch's CSR product
goes through MKL, which fuses the multiply and the add on CPUs that have FMA and not on
others, so its last bits depend on the machine: it is never a bit-exact oracle for ours. These
helpers give the kernel's own result exactly, and a bound for comparing any two orders of
the same sum.
"""
import numpy as np
import torch

EPS32 = float(torch.finfo(torch.float32).eps)


def _csr(A: torch.Tensor):
    return (A.crow_indices().numpy().astype(np.int64), A.col_indices().numpy().astype(np.int64),
            A.values().detach().numpy().astype(np.float32))


def sequential_mm(A: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``A @ h`` in float32, each row summed in CSR order, each product rounded before its
    add: the k-th entries of all rows are added in one numpy step (numpy multiplies and adds
    in separate passes, so nothing is fused). ``h`` narrower than float32 is widened first."""
    indptr, indices, values = _csr(A)
    hf = h.detach().float().contiguous().numpy()
    n = indptr.shape[0] - 1
    acc = np.zeros((n, hf.shape[1]), np.float32)
    lengths = np.diff(indptr)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN propagate as in the kernel
        for k in range(int(lengths.max()) if n else 0):
            rows = np.nonzero(lengths > k)[0]
            e = indptr[rows] + k
            acc[rows] = acc[rows] + values[e][:, None] * hf[indices[e]]
    return torch.from_numpy(acc)


def sum_bound(A: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Per element, a bound on how far two float32 evaluations of the same row sum can be
    apart, whatever their order and fusing: each is within γ_L·Σ|a·h| of the exact sum
    (L the row's entry count, γ_L ≈ L·eps), so together within 2·(L+1)·eps·Σ|a·h|."""
    indptr, _, _ = _csr(A)
    lengths = torch.from_numpy(np.diff(indptr).astype(np.float32))[:, None]
    mag = sequential_mm(torch.sparse_csr_tensor(A.crow_indices(), A.col_indices(),
                                                A.values().detach().abs(), A.shape), h.abs())
    return 2 * (lengths + 1) * EPS32 * mag + 1e-30


def assert_within_sum_bound(z: torch.Tensor, ref: torch.Tensor, A: torch.Tensor,
                            h: torch.Tensor, what="") -> None:
    """``z`` and ``ref`` are two evaluations of ``A @ h`` that may differ in order or fusing."""
    diff = (z.float() - ref.float()).abs()
    bound = sum_bound(A, h)
    assert bool((diff <= bound).all()), (what, float((diff - bound).max()))
