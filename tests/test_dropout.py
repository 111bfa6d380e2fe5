"""The cheap-mask dropout: right drop rate, unbiased, deterministic, exact gradient."""
import pytest
import torch

from gnnpar.dropout import dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.75])
def test_rate_and_expectation(p):
    torch.manual_seed(0)
    x = torch.ones(400, 250)
    y = dropout(x, p)
    assert abs(float((y == 0).float().mean()) - p) < 0.01
    assert abs(float(y.mean()) - 1.0) < 0.02
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 65536 / (65536 - round(p * 65536))))


def test_deterministic_and_gradient():
    torch.manual_seed(3)
    a = dropout(torch.randn(50, 7), 0.5)
    torch.manual_seed(3)
    b = dropout(torch.randn(50, 7), 0.5)
    assert torch.equal(a, b)
    x = torch.randn(64, 9, requires_grad=True)
    y = dropout(x, 0.5)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, (y != 0).float() * 2.0)


def test_identity_when_not_training_and_bad_p():
    x = torch.randn(5, 3)
    assert dropout(x, 0.5, training=False) is x
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(x, 1.0)
