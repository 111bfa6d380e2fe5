"""The fused bias + ReLU + dropout pass (kernels/triton_epilogue.py) against the CPU pass
(kernels/cpu_dropout.py) and torch's ops, on CPU tensors in Triton's interpreter
(TRITON_INTERPRET=1, in a child process: the interpreter is chosen when a kernel is defined).
Skipped where Triton is not installed."""
import importlib.util

import pytest
import torch

from .cli_util import run_interpreted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed")

CHECK = r'''
import torch
from gnnpar.nn import dropout as D
from gnnpar.kernels import cpu_dropout, triton_epilogue as te

torch.manual_seed(0)
for n, f in ((37, 13), (5, 4), (1, 1), (3, 1), (64, 256), (0, 8)):
    z, b, g = torch.randn(n, f), torch.randn(f), torch.randn(n, f)
    for seed in (1, 12345, 2 ** 62 - 7):
        for units in (32768, 1, 65535):
            scale = 65536 / (65536 - units)
            v = z + b
            # the same mask as the CPU pass, element for element; ReLU before it
            want = cpu_dropout.masked_scale(v, v, seed, units, scale, True)
            out = te.forward(z, b, seed, units, scale, True)
            assert torch.allclose(out, want, rtol=1e-6, atol=1e-6), (n, f, seed, units)
            keep = torch.from_numpy(cpu_dropout.keep_mask(n * f, seed, units)).view(n, f)
            assert torch.equal(out != 0, keep & (v > 0))
            dz = te.backward(g, out, seed, units, scale, True)
            assert torch.equal(dz, cpu_dropout.masked_scale(g, want, seed, units, scale, True))
            # no bias, no ReLU: plain dropout, and its backward from the seed alone
            assert torch.equal(te.forward(z, None, seed, units, scale, False),
                               cpu_dropout.masked_scale(z, z, seed, units, scale, False))
            assert torch.equal(te.backward(g, None, seed, units, scale, False),
                               cpu_dropout.masked_scale(g, g, seed, units, scale, False))
            # bf16 in, bf16 out: summed in fp32 with the fp32 bias, rounded once (within a
            # bf16 step: the interpreter's rounding need not be the GPU's)
            ob = te.forward(z.bfloat16(), b, seed, units, scale, True)
            assert ob.dtype == torch.bfloat16
            vb = z.bfloat16().float() + b
            assert torch.equal(ob != 0, keep & (vb > 0))
            assert torch.allclose(ob.float(), torch.where(keep & (vb > 0), vb * scale, 0.0),
                                  rtol=8e-3, atol=0)

# non-finite values: both passes select (gnnpar.nn.dropout's rule), forward and backward, the
# GPU one with a bias too: torch.where(keep & ~(v <= 0), v·scale, 0) and its gradient
nan, inf = float("nan"), float("inf")
special = torch.tensor([nan, -inf, inf, -1.0, -0.0, 0.0, 2.0, 1e-30]).repeat(60).view(60, 8)
g = torch.tensor([inf, nan, -inf]).repeat(160).view(60, 8)
seed, units, scale = 77, 32768, 2.0
keep = torch.from_numpy(cpu_dropout.keep_mask(special.numel(), seed, units)).view(60, 8)
assert keep.any(0).all() and not keep.all(0).any()
def exact(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
for bias in (None, torch.tensor([0.0, 1.0, -inf, 3.0, 0.0, -2.0, -5.0, inf])):
    for relu in (True, False):
        if bias is not None and not relu:
            continue
        vr = (special if bias is None else special + bias).clone().requires_grad_()
        on = keep & ~(vr.detach() <= 0) if relu else keep
        ref = torch.where(on, vr * scale, 0.0)
        ref.backward(g)
        out = te.forward(special, bias, seed, units, scale, relu)
        exact(out, ref.detach())
        exact(te.backward(g, out if relu else None, seed, units, scale, relu), vr.grad)
        if bias is None:
            cpu = cpu_dropout.masked_scale(special, special, seed, units, scale, relu)
            exact(cpu, ref.detach())
            exact(cpu_dropout.masked_scale(g, cpu if relu else g, seed, units, scale, relu),
                  vr.grad)

# through autograd (gnnpar.nn.dropout's GPU path, forced onto CPU tensors here): the gradients
# of z and of the bias are those of torch's ops under the same mask
te.usable = lambda x: x.dtype in te.DTYPES
for relu in (True, False):
    z = torch.randn(50, 24, requires_grad=True)
    b = torch.randn(24, requires_grad=True)
    g = torch.randn(50, 24)
    torch.manual_seed(3)
    out = D.bias_relu_dropout(z, b, 0.25) if relu else D.dropout(z, 0.25)
    out.backward(g)
    zr, br = z.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    keep = (out != 0) if relu else (out != 0) | (z == 0)
    ref = (torch.relu(zr + br) if relu else zr) * keep / 0.75
    ref.backward(g)
    assert torch.allclose(out, ref.detach(), rtol=1e-6, atol=1e-6)
    assert torch.allclose(z.grad, zr.grad, rtol=1e-6, atol=1e-6)
    if relu:
        assert torch.allclose(b.grad, br.grad, rtol=1e-5, atol=1e-5)
    # evaluation, or p = 0: no dropout at all
    zz = torch.randn(6, 24)
    assert torch.equal(D.bias_relu_dropout(zz, b.detach(), 0.25, training=False),
                       torch.relu(zz + b.detach()))

# a whole run: the GPU path (forced onto CPU tensors) follows the CPU path's losses, GCN and
# SAGE (whose layers hand their bias to the fused pass there)
import numpy as np
from gnnpar.nn.models import GNN
from gnnpar.training.serial import SerialRuntime
from gnnpar.training.trainer import TrainConfig, fit
from tests.graphs import random_graph
g = random_graph(n=120, f=6, classes=3, seed=2)
for kind in ("gcn", "sage"):
    curves = []
    for forced in (False, True):
        te.usable = (lambda x: x.dtype in te.DTYPES) if forced else (lambda x: False)
        torch.manual_seed(0)
        model = GNN(kind, 6, 16, 3, layers=3, dropout=0.5)
        curves.append([r["loss"] for r in fit(model, SerialRuntime(g, model.norm, "cpu"),
                                               TrainConfig(epochs=4))])
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-5)
print("triton epilogue ok")
'''


def test_fused_epilogue_matches_the_cpu_pass_in_the_interpreter():
    run_interpreted(CHECK, "triton epilogue ok")


def test_epilogue_mode_is_checked(monkeypatch):
    from gnnpar.kernels import triton_epilogue
    monkeypatch.setenv(triton_epilogue.ENV, "torch")
    assert not triton_epilogue.usable(torch.zeros(2, device="meta"))
    monkeypatch.setenv(triton_epilogue.ENV, "fast")
    with pytest.raises(ValueError, match="GNNPAR_EPILOGUE_GPU"):
        triton_epilogue.mode()


def test_cpu_tensors_never_take_the_gpu_pass():
    from gnnpar.kernels import triton_epilogue
    assert not triton_epilogue.usable(torch.zeros(2, 2))


def test_bias_relu_dropout_on_cpu_is_bias_then_relu_dropout():
    """The CPU result of a hidden layer's end is what it was: the bias add, then the one
    compiled ReLU + dropout pass, with the same seed draw."""
    from gnnpar.nn.dropout import add_bias, bias_relu_dropout, relu_dropout
    z, b = torch.randn(30, 10), torch.randn(10)
    torch.manual_seed(5)
    a = bias_relu_dropout(z, b, 0.5)
    torch.manual_seed(5)
    assert torch.equal(a, relu_dropout(add_bias(z, b), 0.5))
