"""The CPU bf16 dense products (gnnpar/nn/bf16_dense.py): torch's bf16 GEMM and float32 GEMMs
of the bf16 operands compute the same thing up to the order of float32 sums, keep the same
saved state, and the choice between them is the machine's cached one."""
from __future__ import annotations

import json
import os

import pytest
import torch

from gnnpar.kernels import machine_rules
from gnnpar.nn import bf16_dense
from gnnpar.nn.models import GNN

from .graphs import random_graph


def _bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference of two tensors in units of bf16's last place at ``a``'s size."""
    scale = a.float().abs().clamp_min(torch.finfo(torch.bfloat16).tiny) * 2.0 ** -7
    return ((a.float() - b.float()).abs() / scale).max().item()


def _step(model, op, x, choice, monkeypatch):
    """Forward under bf16 autocast and backward with ``choice`` pinned: the output and every
    parameter's gradient."""
    monkeypatch.setenv(bf16_dense.ENV, choice)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(op, x)
    (out.float() * torch.linspace(-1, 1, out.shape[1])).sum().backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["gcn", "sage", "gat"])
def test_both_products_give_the_same_forward_and_gradients(kind, monkeypatch):
    """The same layer stack under both choices: outputs within one bf16 unit (the float32 sums'
    order) and the parameters' gradients, rounded through bf16 on both sides, within two."""
    from gnnpar.training.serial import SerialRuntime
    g = random_graph(60, 5, f=12, classes=3, seed=1)
    torch.manual_seed(0)
    model = GNN(kind, g.num_features, 16, g.num_classes, 2, 0.0)
    model.eval()  # no dropout: both sides draw nothing
    rt = SerialRuntime(g, model.norm, torch.device("cpu"))
    native, native_grads = _step(model, rt.op, rt.x, "bf16", monkeypatch)
    upcast, upcast_grads = _step(model, rt.op, rt.x, "fp32", monkeypatch)
    assert native.dtype == upcast.dtype
    assert _bf16_ulps(native, upcast) <= 1.0
    for name, grad in native_grads.items():
        assert upcast_grads[name].dtype == grad.dtype == torch.float32, name
        assert _bf16_ulps(grad, upcast_grads[name]) <= 2.0, name


def test_the_float32_gemms_keep_bf16_copies_for_the_backward(monkeypatch):
    """What the backward keeps is what autocast keeps: bf16 copies of x and W, never a float32
    copy of x."""
    monkeypatch.setenv(bf16_dense.ENV, "fp32")
    x = torch.randn(200, 32, requires_grad=True)
    lin = bf16_dense.Linear(32, 8)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
    assert y.dtype == torch.bfloat16
    assert sorted(tuple(t.shape) for t in saved) == [(8, 32), (200, 32)]
    assert all(t.dtype == torch.bfloat16 for t in saved)


def test_outside_bf16_autocast_the_product_is_torchs_float32_one(monkeypatch):
    monkeypatch.setenv(bf16_dense.ENV, "fp32")
    x, w, b = torch.randn(10, 6), torch.randn(4, 6), torch.randn(4)
    assert torch.equal(bf16_dense.linear(x, w, b), torch.nn.functional.linear(x, w, b))


def test_the_choice_is_measured_once_and_read_back(tmp_path, monkeypatch):
    """auto: the first call probes and writes the machine's entry; a later process reads the
    same choice; a pinned value and a bad one."""
    monkeypatch.setenv(machine_rules.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(bf16_dense.ENV, raising=False)
    monkeypatch.setattr(bf16_dense, "PROBE_SHAPES", ((256, 16, 8),))
    bf16_dense._measured.cache_clear()
    try:
        first = bf16_dense.upcasts()
        entries = json.loads((tmp_path / machine_rules.FILE_NAME).read_text())["entries"]
        entry = entries[machine_rules.machine_key(torch.get_num_threads())]["dense_bf16"]
        assert entry["rule"] == ("fp32" if first else "bf16")
        assert list(entry["times_s"]) == ["256x16x8"]
        bf16_dense._measured.cache_clear()
        monkeypatch.setattr(bf16_dense, "measure", lambda: pytest.fail("probed twice"))
        assert bf16_dense.upcasts() == first
    finally:
        bf16_dense._measured.cache_clear()
    monkeypatch.setenv(bf16_dense.ENV, "bf16")
    assert bf16_dense.upcasts() is False
    monkeypatch.setenv(bf16_dense.ENV, "fast")
    with pytest.raises(ValueError, match="GNNPAR_BF16_DENSE"):
        bf16_dense.upcasts()


def test_the_rule_and_its_fixed_choice(tmp_path, monkeypatch):
    """float32 GEMMs only where they win by the margin at every shape; where the cache cannot
    be written, torch's bf16 GEMM."""
    assert bf16_dense.decide({"a": (1.0, 0.5), "b": (1.0, 0.8)}) == "fp32"
    assert bf16_dense.decide({"a": (1.0, 0.5), "b": (1.0, 0.95)}) == "bf16"
    assert bf16_dense.entry_rule({"rule": "fp32"}) == (True, True)
    assert bf16_dense.entry_rule({"rule": [1, 2]})[0] is False
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(machine_rules.CACHE_ENV, os.path.join(str(blocked), "sub"))
    monkeypatch.delenv(bf16_dense.ENV, raising=False)
    bf16_dense._measured.cache_clear()
    try:
        assert bf16_dense.upcasts() is False
    finally:
        bf16_dense._measured.cache_clear()
