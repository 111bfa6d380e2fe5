"""The Triton SpMM (kernels/triton_spmm.py) against torch.sparse.mm, run on CPU tensors by
Triton's interpreter (TRITON_INTERPRET=1, in a child process: the interpreter is chosen when
the kernel is defined). Skipped where Triton is not installed."""
import importlib.util

import pytest

from .cli_util import run_interpreted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed")

CHECK = r'''
import torch
from gnnpar.datasets import load_dataset
from gnnpar.datasets.normalize import propagation_matrix
from gnnpar.kernels import triton_spmm
from gnnpar.kernels.local import csr_tensor, transpose_csr

CONFIGS = [triton_spmm.Config(32, 16, 4, 2), triton_spmm.Config(16, 16, 3, 1)]  # config_for's step
# a shorter step: the same sums in another order
OTHER_ORDER = [triton_spmm.Config(64, 8, 4, 2), triton_spmm.Config(32, 32, 1, 1),
               triton_spmm.Config(64, 16, 1, 2, 1), triton_spmm.Config(16, 4, 3, 1, 1)]

def cases():
    """Each matrix, and whether the tiles are checked on it: on the two with the most varied
    rows (empty rows; power-law lengths), the interpreter's costliest part."""
    g = torch.Generator().manual_seed(0)
    for n, m, d, empty in ((50, 70, 0.1, ()), (40, 40, 0.2, range(0, 40, 3)), (1, 30, 0.5, ()),
                           (6, 9, 0.0, ()), (0, 5, 0.0, ())):
        dense = (torch.rand(n, m, generator=g) < d) * torch.randn(n, m, generator=g)
        dense[list(empty)] = 0
        yield dense, bool(empty)
    gr = load_dataset("rmat:scale=6,ef=8")  # power law: rows of 1 to 42 entries
    ip, ix, v = propagation_matrix(gr, "mean")
    yield csr_tensor(ip, ix, v, (gr.num_nodes, gr.num_nodes)).to_dense(), True

for dense, tiles in cases():
    A = dense.to_sparse_csr()
    AT = dense.t().contiguous().to_sparse_csr()  # the backward's product
    for f in (1, 7, 64, 130):
        for M, D in ((A, dense), (AT, dense.t())):
            h = torch.randn(M.shape[1], f)
            got = triton_spmm.csr_mm(M, h)
            assert got.shape == (M.shape[0], f)
            assert torch.allclose(got, D @ h, atol=1e-5, rtol=1e-5), (dense.shape, f)
            hb = h.to(torch.bfloat16)  # bf16 gathers, fp32 accumulation
            gb = triton_spmm.csr_mm(M, hb)
            assert gb.dtype == torch.bfloat16
            assert torch.allclose(gb.float(), D @ hb.float(), atol=2e-2, rtol=2e-2)
            # other tiles (several rows a program, narrower columns) and the rows in their own
            # order give the same sums in the same order: equal bit for bit; a shorter step
            # sums in another order
            if f != 64 or not tiles:
                continue
            ident = torch.arange(M.shape[0], dtype=torch.int32)
            for c in CONFIGS:
                assert torch.equal(triton_spmm.csr_mm(M, h, config=c), got), c
            for c in OTHER_ORDER:
                mine = triton_spmm.csr_mm(M, h, config=c)
                assert torch.allclose(mine, D @ h, atol=1e-5, rtol=1e-5), c
            gb = triton_spmm.csr_mm(M, hb, config=OTHER_ORDER[2])  # bf16, summed once a row
            assert torch.allclose(gb.float(), D @ hb.float(), atol=2e-2, rtol=2e-2)
            assert torch.equal(triton_spmm.csr_mm(M, h, order=ident), got)
# the longest row comes first; ties keep their order
A = torch.tensor([[1., 0, 0], [1, 1, 1], [0, 1, 0], [1, 1, 0]]).to_sparse_csr()
assert triton_spmm.row_order(A).tolist() == [1, 3, 0, 2]
print("triton kernel ok")
'''


def test_triton_kernel_matches_torch_in_the_interpreter():
    run_interpreted(CHECK, "triton kernel ok")


def test_cpu_products_never_take_the_triton_path(monkeypatch):
    import torch
    from gnnpar.kernels import triton_spmm
    monkeypatch.setenv(triton_spmm.ENV, "triton")
    assert not triton_spmm.selected(torch.zeros(2, 2))


def test_a_fixed_tile_is_checked(monkeypatch):
    """GNNPAR_TRITON_CONFIG: four integers, powers of two where the kernel needs them."""
    from gnnpar.kernels import triton_spmm
    monkeypatch.setenv(triton_spmm.CONFIG_ENV, "256,32,2,4")
    assert triton_spmm.config_for(40, None) == triton_spmm.Config(64, 32, 2, 4)  # capped
    monkeypatch.setenv(triton_spmm.CONFIG_ENV, "64,16,3,2")  # 3 rows one after another
    assert triton_spmm.config_for(64, None) == triton_spmm.Config(64, 16, 3, 2)
    monkeypatch.setenv(triton_spmm.CONFIG_ENV, "64,16,1,2,1")  # summed once per row
    assert triton_spmm.config_for(64, None) == triton_spmm.Config(64, 16, 1, 2, 1)
    for bad in ("64,0,4,4", "64,12,1,4", "64,16,0,4", "64,16,1", "a,b,c,d", "64,-1,1,4",
                "48,16,1,4", "64,16,1,3", "64,16,1,2,2", "64,16,1,2,1,1"):
        monkeypatch.setenv(triton_spmm.CONFIG_ENV, bad)
        with pytest.raises(ValueError, match="GNNPAR_TRITON_CONFIG"):
            triton_spmm.config_for(64, None)
