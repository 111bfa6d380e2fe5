"""Dropout: right drop rate, unbiased, deterministic, exact gradient — on both CPU paths (the
compiled one-pass kernel of kernels/cpu_dropout.py and the torch cheap-mask path) — and ReLU
fused with it."""
import pytest
import torch

from gnnpar.nn.dropout import dropout, relu_dropout
from gnnpar.kernels import cpu_dropout


@pytest.fixture(params=["compiled", "torch"])
def path(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setattr(cpu_dropout, "usable", lambda x: False)
    elif not cpu_dropout.usable(torch.ones(1)):
        pytest.skip("numba is not available")
    return request.param


@pytest.mark.parametrize("p", [0.1, 0.5, 0.75])
def test_rate_and_expectation(p, path):
    torch.manual_seed(0)
    x = torch.ones(400, 250)
    y = dropout(x, p)
    assert abs(float((y == 0).float().mean()) - p) < 0.01
    assert abs(float(y.mean()) - 1.0) < 0.02
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 65536 / (65536 - round(p * 65536))))
    # every position of the hash's four lanes drops at the same rate; neighbours independent
    drops = (y == 0).float().view(-1)
    for lane in range(4):
        assert abs(float(drops[lane::4].mean()) - p) < 0.02
    a, b = drops[:-1] - p, drops[1:] - p
    assert abs(float((a * b).mean()) / (p * (1 - p))) < 0.02


def test_deterministic_and_gradient(path):
    torch.manual_seed(3)
    a = dropout(torch.randn(50, 7), 0.5)
    torch.manual_seed(3)
    b = dropout(torch.randn(50, 7), 0.5)
    assert torch.equal(a, b)
    x = torch.randn(64, 9, requires_grad=True)
    y = dropout(x, 0.5)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, (y != 0).float() * 2.0)


def test_relu_dropout_is_dropout_of_relu(path):
    torch.manual_seed(5)
    x = torch.randn(300, 33, requires_grad=True)
    y = relu_dropout(x, 0.5)
    assert torch.all((y == 0) | (x > 0))
    pos = y != 0
    torch.testing.assert_close(y[pos], 2.0 * x.detach()[pos])
    kept_of_positive = float(pos.sum()) / float((x > 0).sum())
    assert abs(kept_of_positive - 0.5) < 0.03
    g = torch.randn_like(y)
    y.backward(g)
    torch.testing.assert_close(x.grad, torch.where(pos, 2.0 * g, torch.zeros_like(g)))
    assert torch.equal(relu_dropout(x, 0.5, training=False), torch.relu(x))


@pytest.fixture
def torch_threads():
    """Puts torch's intra-op thread count back after a test that changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_compiled_mask_does_not_depend_on_threads(torch_threads):
    if not cpu_dropout.usable(torch.ones(1)):
        pytest.skip("numba is not available")
    x = torch.randn(1000, 131)  # not a multiple of the chunk or of 4
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        torch.manual_seed(9)
        outs.append(dropout(x, 0.3))
    assert torch.equal(*outs)


def test_identity_when_not_training_and_bad_p():
    x = torch.randn(5, 3)
    assert dropout(x, 0.5, training=False) is x
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(x, 1.0)
    with pytest.raises(ValueError, match="dropout probability"):
        relu_dropout(x, 1.0)


def test_bf16_draws_the_fp32_masks():
    if not cpu_dropout.usable(torch.ones(1)):
        pytest.skip("numba is not available")
    x = torch.randn(200, 37)
    torch.manual_seed(4)
    a = relu_dropout(x, 0.5)
    torch.manual_seed(4)
    b = relu_dropout(x.bfloat16(), 0.5)
    assert b.dtype == torch.bfloat16 and torch.equal(a != 0, b != 0)


def test_both_cpu_paths_draw_the_same_masks(monkeypatch):
    """An mpirun rank (no compiled pass) and an --nprocs rank give the same numbers."""
    if not cpu_dropout.usable(torch.ones(1)):
        pytest.skip("numba is not available")
    x = torch.randn(123, 45, requires_grad=True)
    outs = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(cpu_dropout, "usable", lambda t: False)
        torch.manual_seed(7)
        a = dropout(x, 0.3)
        b = relu_dropout(x, 0.5)
        x.grad = None
        (a.sum() + (b * 3).sum()).backward()
        outs.append((a.detach(), b.detach(), x.grad.clone()))
    for first, second in zip(*outs):
        assert torch.equal(first, second)


NAN, INF = float("nan"), float("inf")
#: every special value meets every non-finite gradient (periods 8 and 3), at kept and at
#: dropped elements
SPECIAL = torch.tensor([NAN, -INF, INF, -1.0, -0.0, 0.0, 2.0, 1e-30]).repeat(60)
GRAD = torch.tensor([INF, NAN, -INF]).repeat(160)


def where_reference(x, g, keep, scale, relu):
    """The rule gnnpar.nn.dropout states: torch.where(keep & ~(x <= 0), x·scale, 0) and its
    autograd gradient."""
    x = x.clone().requires_grad_()
    on = keep & ~(x.detach() <= 0) if relu else keep
    y = torch.where(on, x * scale, 0.0)
    y.backward(g)
    return y.detach(), x.grad


@pytest.mark.parametrize("relu", [True, False])
def test_non_finite_values_are_selected_not_multiplied(relu, path):
    torch.manual_seed(11)
    keep = dropout(torch.ones(SPECIAL.shape), 0.5) != 0  # the mask the next call draws
    assert keep.view(60, 8).any(0).all() and not keep.view(60, 8).all(0).any()
    x = SPECIAL.clone().requires_grad_()
    torch.manual_seed(11)
    y = relu_dropout(x, 0.5) if relu else dropout(x, 0.5)
    y.backward(GRAD)
    want, want_grad = where_reference(SPECIAL, GRAD, keep, 2.0, relu)
    torch.testing.assert_close(y.detach(), want, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(x.grad, want_grad, rtol=0, atol=0, equal_nan=True)
    # the rule in words: NaN propagates where kept and passes its gradient, −inf → 0 after
    # ReLU, +inf stays +inf where kept, and nothing dropped or cut by ReLU is NaN
    nan, inf = SPECIAL.isnan(), SPECIAL == INF
    assert y[nan & keep].isnan().all()
    torch.testing.assert_close(x.grad[nan & keep], 2.0 * GRAD[nan & keep], equal_nan=True)
    assert torch.equal(y[inf], torch.where(keep, INF, 0.0)[inf])
    off = ~keep | (SPECIAL <= 0) if relu else ~keep
    assert (y[off] == 0).all() and (x.grad[off] == 0).all()
    if relu:
        assert (y[SPECIAL == -INF] == 0).all()


@pytest.mark.parametrize("numel", [3, 4 * cpu_dropout.CHUNK, 3 * cpu_dropout.CHUNK + 4 * 7 + 3])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_compiled_pass_is_the_select_of_the_numpy_mask(numel, relu, in_place):
    """The compiled pass, on one chunk or several with a ragged tail (not a multiple of 4),
    written fresh or over its input, gives the select of :func:`cpu_dropout.keep_mask`'s
    decisions bit for bit, non-finite values included; the backward form too."""
    if not cpu_dropout.usable(torch.ones(1)):
        pytest.skip("numba is not available")
    gen = torch.Generator().manual_seed(numel)
    x = torch.randn(numel, generator=gen)
    x[:3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    grad = torch.randn(numel, generator=gen)
    seed, units, scale = 987654321, 21845, 65536 / (65536 - 21845)
    keep = torch.from_numpy(cpu_dropout.keep_mask(numel, seed, units))
    passes = keep & ~(x <= 0) if relu else keep
    want = torch.where(passes, x * scale, 0.0)
    src = x.clone()
    got = cpu_dropout.masked_scale(src, src, seed, units, scale, relu,
                                   out=src if in_place else None)
    assert (got is src) == in_place
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
    dz = cpu_dropout.masked_scale(grad, want, seed, units, scale, relu)
    assert torch.equal(dz, torch.where(keep & ~(want <= 0) if relu else keep, grad * scale,
                                       0.0))


def test_compiled_pass_refuses_a_threshold_out_of_range():
    if not cpu_dropout.usable(torch.ones(1)):
        pytest.skip("numba is not available")
    with pytest.raises(ValueError, match="drop_units"):
        cpu_dropout.masked_scale(torch.ones(4), torch.ones(4), 1, 65536, 1.0, False)
