"""The compiled CPU SpMM (kernels/cpu_spmm.py): bit for bit the sequential float32 sum
without fused multiply-add (tests/exact.py) on random, power-law, empty-row, single-row and
empty matrices, forward and backward, at 1 and 2 threads, and within the sum's rounding of
torch.sparse.mm (which fuses on FMA CPUs); bf16 input gives the fp32 product of the widened
input, rounded once. The torch path (torch's own product, not the kernel) is checked against
an oracle independent of it: the float64 product, within the rounding any float32 evaluation
of each row's sum keeps to it (tests/exact.py, :func:`float64_product`), in any order, with
or without fused multiply-add, so on any CPU."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from gnnpar.datasets import load_dataset
from gnnpar.datasets.normalize import propagation_matrix
from gnnpar.kernels import cpu_spmm
from gnnpar.kernels.cpu_spmm import csr_mm, row_blocks
from gnnpar.kernels.local import SparseOperator, csr_tensor

from .exact import (UNIT, assert_within_float64_bound, assert_within_sum_bound, float64_product,
                    sequential_mm)

pytestmark = pytest.mark.skipif(not cpu_spmm.available(), reason="numba kernel not available")


@pytest.fixture(autouse=True)
def kernel_for_every_size(monkeypatch):
    """Every float32 and bf16 product on the kernel, whatever the size rule says."""
    monkeypatch.setenv(cpu_spmm.ENV, "numba")


def test_size_rule_sends_narrow_and_small_products_to_torch(monkeypatch):
    calls = []
    real = cpu_spmm._compiled

    def spy():
        numba, kernels = real()
        return numba, {k: (lambda *a, _k=k: calls.append(1) or kernels[_k](*a))
                       for k in kernels}
    monkeypatch.setattr(cpu_spmm, "_compiled", spy)
    monkeypatch.setenv(cpu_spmm.ENV, "auto")
    monkeypatch.setattr(cpu_spmm, "SIZE_RULE", {torch.bfloat16: (32, 1000)})
    A = _random_csr(50, 70, 0.3, 0)  # ~1050 entries
    for f, dtype, kernel in ((16, torch.bfloat16, False), (32, torch.bfloat16, True),
                             (64, torch.bfloat16, True), (64, torch.float32, False)):
        calls.clear()
        h = torch.randn(70, f).to(dtype)
        z = csr_mm(A, h)
        assert bool(calls) == kernel, (f, dtype)
        if kernel:  # the kernel's own arithmetic, bit for bit: the sequential sum
            assert torch.equal(z, sequential_mm(A, h).to(dtype)), (f, dtype)
        else:  # torch's: within the rounding of a float32 sum of the float64 product
            assert_within_float64_bound(z, *float64_product(A, h.double().numpy()), (f, dtype))
    monkeypatch.setattr(cpu_spmm, "SIZE_RULE", {torch.bfloat16: (32, 10 ** 9)})
    calls.clear()
    csr_mm(A, torch.randn(70, 64).bfloat16())
    assert not calls
    monkeypatch.setenv(cpu_spmm.ENV, "numba")  # every size, float32 too
    csr_mm(A, torch.randn(70, 4))
    assert calls
    monkeypatch.setenv(cpu_spmm.ENV, "nunba")
    with pytest.raises(ValueError, match="GNNPAR_SPMM"):
        csr_mm(A, torch.randn(70, 4))


def _random_csr(n_dst, n_src, density, seed, empty_rows=()):
    rng = np.random.default_rng(seed)
    dense = (rng.random((n_dst, n_src)) < density) * rng.standard_normal((n_dst, n_src))
    dense[list(empty_rows)] = 0
    m = torch.tensor(dense, dtype=torch.float32).to_sparse_csr()
    return m


def _cases():
    yield "random", _random_csr(50, 70, 0.1, 0)
    yield "empty rows", _random_csr(40, 40, 0.2, 1, empty_rows=range(0, 40, 3))
    yield "single row", _random_csr(1, 30, 0.5, 2)
    yield "no entries", _random_csr(6, 9, 0.0, 3)
    yield "no rows", torch.zeros((0, 5)).to_sparse_csr()
    g = load_dataset("rmat:scale=10,ef=8")  # power law: a few rows hold most entries
    indptr, indices, values = propagation_matrix(g, "gcn")
    yield "rmat", csr_tensor(indptr, indices, values, (g.num_nodes, g.num_nodes))


@pytest.mark.parametrize("name,A", list(_cases()), ids=[c[0] for c in _cases()])
@pytest.mark.parametrize("f", [1, 7, 64, 130])
def test_the_sequential_sum_bit_for_bit_and_torch_within_rounding(name, A, f):
    h = torch.randn(A.shape[1], f)
    ref = sequential_mm(A, h)
    if A.shape[0]:
        assert_within_sum_bound(csr_mm(A, h), torch.sparse.mm(A, h), A, h, name)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(csr_mm(A, h), ref), (name, threads)
            out = torch.full_like(ref, 7.0)
            assert csr_mm(A, h, out) is out and torch.equal(out, ref)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name,A", list(_cases()), ids=[c[0] for c in _cases()])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_torch_path_within_the_rounding_of_the_float64_product(monkeypatch, name, A, dtype):
    """``GNNPAR_SPMM=torch``: float32 h through torch's product, bf16 h through the float32
    product of its widened copy rounded once, into a fresh output and into ``out``."""
    monkeypatch.setenv(cpu_spmm.ENV, "torch")
    for f in (1, 7, 64, 130):
        h = torch.randn(A.shape[1], f, generator=torch.Generator().manual_seed(f)).to(dtype)
        ref, bound = float64_product(A, h.double().numpy())
        assert_within_float64_bound(csr_mm(A, h), ref, bound, (name, f))
        out = torch.full((A.shape[0], f), 7.0, dtype=dtype)
        assert csr_mm(A, h, out) is out
        assert_within_float64_bound(out, ref, bound, (name, f, "out"))


def test_the_float64_bound_is_tight_enough_to_fail():
    """The oracle's bound is L·u of the row's magnitude (here 64 terms: 32 float32 ulps of
    the sum), not a tolerance that passes anything: the sequential sum passes it, a result
    four bounds away fails."""
    A = torch.ones(1, 64).to_sparse_csr()
    h = torch.full((64, 1), 1.0 + 2.0 ** -20)
    ref, bound = float64_product(A, h.double().numpy())
    z = sequential_mm(A, h)
    assert_within_float64_bound(z, ref, bound)
    assert float(bound.max()) < 64 * UNIT[torch.float32] * 1.01 * float(ref.max())
    with pytest.raises(AssertionError):
        assert_within_float64_bound(z + 4 * float(bound.max()), ref, bound)


def test_int32_indices_and_non_contiguous_input():
    A = _random_csr(30, 20, 0.3, 4)
    A32 = torch.sparse_csr_tensor(A.crow_indices().int(), A.col_indices().int(), A.values(),
                                  A.shape)
    h = torch.randn(8, 20).t()  # (20, 8) view, not contiguous
    assert torch.equal(csr_mm(A32, h), sequential_mm(A, h))


def test_operator_forward_and_backward_are_sequential_sums(monkeypatch):
    """Forward ``z = Â·Â·h`` and the gradient of Σz² through the stored transpose, each
    product the sequential sum bit for bit (2z is exact, so the whole chain is); the torch
    path within the rounding of the chain's float32 sums of the float64 chain (each product's
    bound carried into the next: :func:`float64_product`)."""
    g = load_dataset("rmat:scale=9,ef=4")
    indptr, indices, values = propagation_matrix(g, "mean")  # not symmetric
    n = g.num_nodes
    A = csr_tensor(indptr, indices, values, (n, n))
    At = A.t().to_sparse_csr()
    h0 = torch.randn(n, 16, generator=torch.Generator().manual_seed(0))
    z1 = sequential_mm(A, h0)
    z2 = sequential_mm(A, z1)
    g1 = sequential_mm(At, 2 * z2)
    want = (z2, sequential_mm(At, g1))
    x1 = float64_product(A, h0.double().numpy())
    x2 = float64_product(A, *x1)
    x3 = float64_product(At, 2 * x2[0], 2 * x2[1])
    oracle = (x2, float64_product(At, *x3))
    for env in ("numba", "torch"):
        monkeypatch.setenv(cpu_spmm.ENV, env)
        op = SparseOperator(indptr, indices, values, (n, n))
        h = h0.clone().requires_grad_(True)
        z = op(op(h))
        (z ** 2).sum().backward()
        if env == "numba":
            assert torch.equal(z.detach(), want[0]) and torch.equal(h.grad, want[1])
        else:
            assert_within_float64_bound(z, *oracle[0], "forward")
            assert_within_float64_bound(h.grad, *oracle[1], "gradient")


def test_fallbacks_keep_working(monkeypatch):
    A = _random_csr(10, 10, 0.3, 5)
    h64 = torch.randn(10, 3, dtype=torch.float64)
    z = csr_mm(A.to(torch.float64), h64)  # float64: torch's product, summed in float64
    assert z.dtype == torch.float64
    assert_within_float64_bound(z, *float64_product(A, h64.numpy(), u=UNIT[torch.float64]))
    monkeypatch.setenv(cpu_spmm.ENV, "torch")
    assert not cpu_spmm.available()


def test_row_blocks_balance_non_zeros():
    indptr = np.concatenate([[0], np.cumsum([1000] + [1] * 999)])  # one heavy row first
    b = row_blocks(indptr, 8)
    assert b[0] == 0 and b[-1] == 1000 and np.all(np.diff(b) > 0)
    per = np.diff(indptr[b])
    assert per.max() <= 1000 and len(b) >= 3  # the heavy row alone, the rest split
    assert row_blocks(np.zeros(1, np.int64), 4).tolist() == [0, 0]


@pytest.mark.parametrize("name,A", list(_cases()), ids=[c[0] for c in _cases()])
@pytest.mark.parametrize("f", [1, 7, 130])
def test_bf16_input_gives_the_rounded_fp32_sum(name, A, f):
    """bf16 H is read at its own width and summed in fp32 in the float32 kernel's order: the
    bits of the sequential fp32 sum of the widened H, rounded once to nearest even (as torch
    rounds)."""
    hb = torch.randn(A.shape[1], f).bfloat16()
    ref = sequential_mm(A, hb).bfloat16()
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            z = csr_mm(A, hb)
            assert z.dtype == torch.bfloat16 and torch.equal(z, ref), (name, threads)
            out = torch.full_like(ref, 7.0)
            assert csr_mm(A, hb, out) is out and torch.equal(out, ref)
    finally:
        torch.set_num_threads(before)


def test_bf16_rounding_ties_overflow_and_nan():
    A = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]).to_sparse_csr()
    big = torch.finfo(torch.bfloat16).max
    # row 0: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (to even: 1), 2·max overflows to inf,
    # NaN + 1 stays NaN; rows 1-2 pass values through unchanged
    h = torch.tensor([[1.0, big, float("nan")], [2.0 ** -8, big, 1.0]]).bfloat16()
    z = csr_mm(A, h)
    assert z[0, 0] == 1.0 and torch.isinf(z[0, 1]) and torch.isnan(z[0, 2])
    torch.testing.assert_close(z, sequential_mm(A, h).bfloat16(), rtol=0, atol=0,
                               equal_nan=True)
    torch.testing.assert_close(z[1:], h, rtol=0, atol=0, equal_nan=True)


def test_bf16_int32_indices_and_non_contiguous_input():
    A = _random_csr(30, 20, 0.3, 4)
    A32 = torch.sparse_csr_tensor(A.crow_indices().int(), A.col_indices().int(), A.values(),
                                  A.shape)
    h = torch.randn(8, 20).bfloat16().t()  # (20, 8) view, not contiguous
    assert torch.equal(csr_mm(A32, h), sequential_mm(A, h).bfloat16())


def _pool_size(rank, world):
    """The numba pool a spawned rank got, after a compiled parallel product started it."""
    import numba
    os.environ[cpu_spmm.ENV] = "numba"  # this small product on the compiled kernel
    A = _random_csr(64, 64, 0.2, rank)
    csr_mm(A, torch.randn(64, 32))
    return numba.config.NUMBA_NUM_THREADS, numba.get_num_threads()


def test_a_rank_pool_has_its_threads_not_every_core(monkeypatch):
    """A rank of one thread starts numba's pool with one thread, not one per core (idle pool
    threads of many ranks on one host slowed a 16-rank epoch 9x), even when the parent's
    environment says otherwise."""
    from gnnpar.launcher.spawn import spawn
    monkeypatch.setenv("NUMBA_NUM_THREADS", "2")
    assert spawn(_pool_size, 2, threads=1, timeout_s=120) == [(1, 1), (1, 1)]


def test_a_compiled_product_keeps_torch_thread_count():
    """numba's OpenMP pool, started by the first product, must not reset torch's thread
    count (it did: a one-thread rank then ran on every core). In a fresh process, whose
    pool is not started yet."""
    code = ("import torch\nfrom gnnpar.kernels import cpu_spmm\nfrom tests.test_cpu_spmm import "
            "_random_csr\ntorch.set_num_threads(1)\n"
            "cpu_spmm.csr_mm(_random_csr(64, 64, 0.2, 0), torch.randn(64, 32))\n"
            "print(torch.get_num_threads())\n")
    # a pool bigger than the count asked for; the small product on the compiled kernel
    env = dict(os.environ, NUMBA_NUM_THREADS="2", GNNPAR_SPMM="numba")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-1] == "1"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_reused_output_overwritten_before_backward_fails_loudly(dtype):
    """Two forward passes of an operator that reuses its outputs, then one backward: the
    first pass's Linear saved the product the second pass overwrote, so the backward must
    refuse (autograd's version check), not give a wrong weight gradient. The kernel writes
    through numpy, which torch does not see: :func:`cpu_spmm.written` bumps the version."""
    A = _random_csr(40, 40, 0.2, 6)
    op = SparseOperator(A.crow_indices(), A.col_indices(), A.values(), A.shape).reuse_outputs()
    lin = torch.nn.Linear(8, 3).to(dtype)
    op.start_pass()
    first = lin(op(torch.randn(40, 8, dtype=dtype))).sum()
    op.start_pass()
    lin(op(torch.randn(40, 8, dtype=dtype))).sum()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        first.backward()


def test_writing_into_out_bumps_its_version():
    A = _random_csr(20, 20, 0.3, 7)
    out = torch.empty(20, 4)
    before = out._version
    csr_mm(A, torch.randn(20, 4), out)
    assert out._version > before


@pytest.mark.parametrize("mode", ["numba", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,A", list(_cases()), ids=[c[0] for c in _cases()])
def test_add_in_row_blocks_gives_the_bits_of_one_product(monkeypatch, mode, dtype, name, A):
    """``add_csr_mm`` in blocks of a few rows (one row, three, more than A has) against
    ``y + csr_mm(A, h)``, bit for bit, on each side of the size rule."""
    monkeypatch.setenv(cpu_spmm.ENV, mode)
    g = torch.Generator().manual_seed(3)
    h = torch.randn(A.shape[1], 9, generator=g).to(dtype)
    y = torch.randn(A.shape[0], 9, generator=g).to(dtype)
    want = y.clone().add_(csr_mm(A, h))
    row = 9 * y.element_size()
    for block_bytes in (row, 3 * row, 10 ** 9):
        got = y.clone()
        assert cpu_spmm.add_csr_mm(got, A, h, block_bytes) is not None
        assert torch.equal(got, want), (mode, dtype, name, block_bytes)
    a32 = csr_tensor(A.crow_indices().numpy(), A.col_indices().numpy(), A.values().numpy(),
                     tuple(A.shape), None, np.int32)
    got = y.clone()
    cpu_spmm.add_csr_mm(got, a32, h, 2 * row)
    assert torch.equal(got, want), (mode, dtype, name, "int32 indices")
