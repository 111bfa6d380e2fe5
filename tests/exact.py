"""Exact references for the CPU products, in the arithmetic each path is built for.

The compiled kernel (kernels/cpu_spmm.py) sums each output row's entries in CSR order in
float32, each product rounded before it is added (no fused multiply-add). torch's CSR product
goes through MKL, which fuses the multiply and the add on CPUs that have FMA and not on
others, so its last bits depend on the machine: it is never a bit-exact oracle for ours. These
helpers give the kernel's own result exactly, and a bound for comparing any two orders of
the same sum, and an oracle independent of both: the float64 product, with the bound any
floating-point evaluation of the sum keeps to it (:func:`float64_product`).
"""
import numpy as np
import scipy.sparse as sp
import torch

EPS32 = float(torch.finfo(torch.float32).eps)
#: unit roundoff (half the machine epsilon) of the dtypes products are summed or rounded in
UNIT = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8,
        torch.float16: 2.0 ** -11}


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


def _gamma(lengths: np.ndarray, u: float) -> np.ndarray:
    """γ_L = L·u / (1 − L·u) per row: a sum of L products evaluated in any order, fused or
    not, with unit roundoff u, is within γ_L·Σ|a·h| of the exact sum (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 2nd ed., §3.1: every term takes at most L roundings,
    one a product and one an addition at most; a fused multiply-add takes fewer)."""
    lu = lengths.astype(np.float64) * u
    return (lu / (1 - lu))[:, None]


def float64_product(A: torch.Tensor, x: np.ndarray, err=None, u: float = UNIT[torch.float32]):
    """``(A @ x, bound)`` in float64 from A's CSR arrays (scipy, each row in CSR order; a
    product of two float32 or narrower values is exact in float64). ``bound``, per element:
    how far an evaluation of ``A @ x̂`` summed with unit roundoff ``u`` (any order, fused or
    not: MKL's or any other) can lie from the returned product, for an input x̂ within ``err``
    of ``x`` (None: x̂ = x) — |A|·err + γ_L(u)·|A|·(|x| + err), L the row's entry count —,
    plus 2·γ_L(2⁻⁵³)·|A|·(|x| + err) for the rounding of the float64 sums themselves (the
    product's and the magnitude's). Chain calls to bound a chain of products."""
    indptr, indices, values = (a.numpy() for a in (A.crow_indices(), A.col_indices(),
                                                   A.values().detach().double()))
    M = sp.csr_matrix((values, indices, indptr), shape=tuple(A.shape))
    absM = sp.csr_matrix((np.abs(values), indices, indptr), shape=tuple(A.shape))
    x = np.asarray(x, np.float64)
    err = np.zeros_like(x) if err is None else np.asarray(err, np.float64)
    lengths = np.diff(indptr)
    mag = absM @ (np.abs(x) + err)
    bound = absM @ err + (_gamma(lengths, u) + 2 * _gamma(lengths, UNIT[torch.float64])) * mag
    return M @ x, bound


def assert_within_float64_bound(z: torch.Tensor, ref: np.ndarray, bound: np.ndarray,
                                what="") -> None:
    """``z`` (any dtype) is within ``bound`` of the float64 ``ref`` (:func:`float64_product`),
    plus, when z is narrower than the sums (bf16 out of float32 sums), the rounding to z's
    dtype: half an ulp, u_z·(|ref| + bound)."""
    assert tuple(z.shape) == ref.shape, (what, tuple(z.shape), ref.shape)
    extra = UNIT[z.dtype] * (np.abs(ref) + bound) if z.dtype in (torch.bfloat16,
                                                                  torch.float16) else 0.0
    over = np.abs(z.detach().double().numpy() - ref) - (bound + extra)
    assert bool((over <= 0).all()), (what, float(over.max()))
