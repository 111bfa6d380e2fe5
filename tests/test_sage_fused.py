"""The fused SAGE layer (gnnpar/kernels/sage_fused.py) against the unfused layer: forward
output and every gradient, float64 (tight) and float32 (a few ulps), with and without
dropout, aggregating first (f_in <= f_out) and projecting first (f_in > f_out), on an input
block (h needs no gradient) and a middle block; the rule that picks it; the same dropout
masks and random draws; the in-place dropout pass."""
import numpy as np
import pytest
import torch

from gnnpar.kernels import cpu_dropout, sage_fused
from gnnpar.kernels.bipartite import BipartiteOperator
from gnnpar.kernels.local import SparseOperator
from gnnpar.nn.models import GNN, SAGELayer


def block_arrays(n_dst, n_src, max_deg=6, seed=0, self_loops=True):
    """A sampled mean block: row i holds itself (when ``self_loops``) then up to ``max_deg``
    random sources (some rows empty), values 1/row length."""
    rng = np.random.default_rng(seed)
    indptr, indices = [0], []
    for i in range(n_dst):
        nbrs = list(rng.choice(n_src, size=rng.integers(0, max_deg + 1), replace=False))
        row = ([i] if self_loops and rng.random() < 0.8 else []) + nbrs
        indices += row
        indptr.append(len(indices))
    indptr = np.asarray(indptr, np.int64)
    indices = np.asarray(indices, np.int64)
    deg = np.diff(indptr)
    values = np.repeat(1.0 / np.maximum(deg, 1), deg).astype(np.float32)
    return indptr, indices, values


def block_op(n_dst, n_src, dtype=torch.float32, seed=0):
    op = SparseOperator(*block_arrays(n_dst, n_src, seed=seed), (n_dst, n_src))
    if dtype != torch.float32:  # a float64 Â for the float64 comparisons
        op.A, op.AT = op.A.to(dtype), op.AT.to(dtype)
    return op


TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-6)}


def run_layer(layer, op, h, act, gz, fused, monkeypatch, seed=5):
    """(output, h's gradient or None, {param name: gradient}, the next random draw) of one
    forward and backward, with the fused path forced on or off."""
    calls, block = [], sage_fused.sage_block
    with monkeypatch.context() as m:
        m.setattr(sage_fused, "usable", lambda *a: fused)
        m.setattr(sage_fused, "sage_block", lambda *a: calls.append(1) or block(*a))
        layer.zero_grad(set_to_none=True)
        h = h.detach().clone().requires_grad_(h.requires_grad)
        torch.manual_seed(seed)
        out = layer(op, h, act)
        after = int(torch.randint(0, 2 ** 62, (1,)))
        (out * gz).sum().backward()
    assert len(calls) == int(fused)  # the path asked for ran
    return (out.detach(), None if h.grad is None else h.grad.clone(),
            {n: p.grad.clone() for n, p in layer.named_parameters()}, after)


#: (act, dropout path): the last layer (no epilogue), ReLU alone (evaluation, p = 0), ReLU +
#: dropout by the compiled pass or by the numpy mask (no numba)
EPILOGUES = {"last": (None, None), "eval": ((0.5, False), None), "p0": ((0.0, True), None),
             "dropout": ((0.5, True), "compiled"), "dropout-mask": ((0.5, True), "mask")}


def drop_path(path, monkeypatch):
    if path == "mask":
        monkeypatch.setattr(cpu_dropout, "usable", lambda x: False)
    elif path == "compiled" and not cpu_dropout.usable(torch.ones(1)):
        pytest.skip("numba is not available")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("f_in,f_out", [(9, 5), (5, 9), (6, 6)])
@pytest.mark.parametrize("where", ["input", "middle"])
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
@pytest.mark.parametrize("bias", [True, False])
def test_fused_layer_matches_unfused(dtype, f_in, f_out, where, epilogue, bias, monkeypatch):
    act, path = EPILOGUES[epilogue]
    drop_path(path, monkeypatch)
    torch.manual_seed(0)
    n_dst, n_src = 23, 61
    op = block_op(n_dst, n_src, dtype, seed=f_in + f_out)
    layer = SAGELayer(f_in, f_out, bias=bias).to(dtype)
    h = torch.randn(n_src, f_in, dtype=dtype, requires_grad=where != "input")
    gz = torch.randn(n_dst, f_out, dtype=dtype)
    ref = run_layer(layer, op, h, act, gz, False, monkeypatch)
    got = run_layer(layer, op, h, act, gz, True, monkeypatch)
    tol = TOL[dtype]
    torch.testing.assert_close(got[0], ref[0], **tol)
    # the same mask: exactly the same zeros (ReLU's and dropout's)
    assert torch.equal(got[0] == 0, ref[0] == 0)
    if where == "input":
        assert got[1] is None and ref[1] is None
    else:
        torch.testing.assert_close(got[1], ref[1], **tol)
    assert got[2].keys() == ref[2].keys()
    for name in ref[2]:
        torch.testing.assert_close(got[2][name], ref[2][name], **tol, msg=name)
    assert got[3] == ref[3]  # as many random draws as the unfused layer


def test_full_batch_operator_and_reused_buffers(monkeypatch):
    """num_dst == num_src (the serial runtime's operator), with its reused output buffers:
    the same numbers twice in a row, and as the unfused layer's."""
    torch.manual_seed(1)
    n = 40
    layer = SAGELayer(7, 7)
    h = torch.randn(n, 7, requires_grad=True)
    gz = torch.randn(n, 7)
    ref = run_layer(layer, block_op(n, n, seed=3), h, (0.5, True), gz, False, monkeypatch)
    op = block_op(n, n, seed=3).reuse_outputs()
    runs = []
    for _ in range(2):
        op.start_pass()
        runs.append(run_layer(layer, op, h, (0.5, True), gz, True, monkeypatch))
    for got in runs:
        torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-6)
        for name in ref[2]:
            torch.testing.assert_close(got[2][name], ref[2][name], rtol=1e-5, atol=1e-6)
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("widths", [(9, 12, 4), (12, 6, 6, 3)])
def test_gnn_on_blocks_matches_unfused(widths, monkeypatch):
    """A whole mini-batch model (input dropout, hidden ReLU + dropout, last layer): loss and
    every gradient as unfused, the same random draws; forward hooks still run."""
    n = [80, 50, 30, 12][:len(widths)]
    ops = [block_op(n[i + 1], n[i], seed=i) for i in range(len(widths) - 1)]
    torch.manual_seed(0)
    model = GNN("sage", widths[0], widths[1], widths[-1], layers=len(widths) - 1,
                dropout=0.5)
    if len(widths) == 4:
        model.layers[1] = SAGELayer(widths[1], widths[2])
    x = torch.randn(n[0], widths[0])
    results = []
    for fused in (False, True):
        seen = []
        hooks = [layer.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
                 for layer in model.layers]
        with monkeypatch.context() as m:
            m.setattr(sage_fused, "usable", lambda *a: fused)
            model.zero_grad(set_to_none=True)
            torch.manual_seed(7)
            out = model(ops, x)
            after = int(torch.randint(0, 2 ** 62, (1,)))
            out.pow(2).sum().backward()
        for hook in hooks:
            hook.remove()
        assert len(seen) == len(model.layers)
        results.append((out.detach(), [p.grad.clone() for p in model.parameters()], after))
    (o0, g0, a0), (o1, g1, a1) = results
    torch.testing.assert_close(o1, o0, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert a0 == a1


def test_rule_picks_only_local_fp32_cpu_without_autocast():
    op = block_op(5, 9)
    h = torch.randn(9, 4)
    layer = SAGELayer(4, 3)
    assert layer.fused(op, h)
    assert not layer.fused(op, h.double())  # float64: the dense-reference tests' dtype
    assert not layer.fused(op, h.bfloat16())
    assert not SAGELayer(4, 3).double().fused(op, h)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not layer.fused(op, h)  # --precision bf16
    assert layer.fused(op, h)
    assert not layer.fused(BipartiteOperator(op, 5), h)  # grouped mini-batch operators

    class Dense:  # the operator kind tests and distributed runtimes pass
        num_dst, num_src = 5, 9

        def __call__(self, x):
            return x[:5]
    assert not layer.fused(Dense(), h)

    class Sub(SparseOperator):  # a sampled block's operator may be a subclass
        pass
    assert layer.fused(Sub(*block_arrays(5, 9), (5, 9)), h)

    class OwnProduct(SparseOperator):  # ... but not one with a product of its own
        def matmul(self, x):
            return super().matmul(x)
        __call__ = matmul
    assert not layer.fused(OwnProduct(*block_arrays(5, 9), (5, 9)), h)


def test_in_place_pass_draws_the_same_mask():
    if not cpu_dropout.usable(torch.ones(1)):
        pytest.skip("numba is not available")
    torch.manual_seed(0)
    for n in (1, 7, 1 << 17):
        x = torch.randn(n)
        for relu in (False, True):
            fresh = cpu_dropout.masked_scale(x, x, 123, 32768, 2.0, relu)
            z = x.clone()
            v = z._version
            got = cpu_dropout.masked_scale(z, z, 123, 32768, 2.0, relu, out=z)
            assert got is z and z._version > v
            assert torch.equal(z, fresh)
    with pytest.raises(ValueError):
        cpu_dropout.masked_scale(x, x, 1, 1, 1.0, True, out=torch.empty(3))


def test_a_sampled_blocks_operator_takes_the_fused_path():
    from gnnpar.sampling.blocks import Block
    indptr, indices, values = block_arrays(6, 14, seed=2)
    block = Block(indptr, indices, values, np.arange(100, 114), 6, int(indices.shape[0]))
    assert SAGELayer(4, 8).fused(block.operator(), torch.randn(14, 4))
