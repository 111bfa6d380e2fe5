"""``kernels.overlap.forward_only``: operators built for inference have no transpose, give
the same forward, and refuse a backward; outside it, the backward is built as before."""
import numpy as np
import pytest
import torch

from gnnpar.kernels.comm import Pending
from gnnpar.kernels.overlap import Cut, Local, Overlapped, forward_only


class _Own:
    """A column axis whose rows this process holds all of (the rest is empty)."""

    def __init__(self, n):
        self.cut = Cut(0, n, n)

    def start_gather(self, h):
        return Local().start_gather(h)

    def start_reduce(self, y_send):  # no rows leave (the backward's "send" rows are none)
        return Pending.ready(y_send)

    def finish_reduce(self, y_own, received):
        assert received.shape[0] == 0
        return y_own


def _block(n=7, seed=0):
    rng = np.random.default_rng(seed)
    dense = (rng.random((n, n)) < 0.4) * rng.standard_normal((n, n))
    rows, cols = np.nonzero(dense)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return indptr, cols.astype(np.int64), dense[rows, cols].astype(np.float32), dense


def test_forward_only_has_the_forward_and_refuses_a_backward():
    indptr, cols, vals, dense = _block()
    n = dense.shape[0]
    h = torch.randn(n, 3)
    full = Overlapped(indptr, cols, vals, (n, n), _Own(n))
    with forward_only():
        inference = Overlapped(indptr, cols, vals, (n, n), _Own(n))
    assert inference.bwd is None and full.bwd is not None
    assert torch.equal(inference.forward(h), full.forward(h))
    want = torch.from_numpy(dense.T.astype(np.float32)) @ h
    assert torch.allclose(full.backward(h), want, atol=1e-5)
    with pytest.raises(RuntimeError, match="inference"):
        inference.backward(h)
    again = Overlapped(indptr, cols, vals, (n, n), _Own(n))  # the context has ended
    assert again.bwd is not None
