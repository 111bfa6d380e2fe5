"""GCN/SAGE layers against a dense float64 reference: forward and every gradient."""
import numpy as np
import pytest
import torch

from gnnpar.datasets.normalize import propagation_matrix
from gnnpar.kernels.local import SparseOperator, transpose_csr
from gnnpar.nn.models import GNN, GCNLayer, SAGELayer

from .graphs import random_graph


def dense(graph, kind):
    indptr, indices, values = propagation_matrix(graph, kind)
    n = graph.num_nodes
    a = np.zeros((n, n))
    rows = np.repeat(np.arange(n), np.diff(indptr))
    np.add.at(a, (rows, indices), values.astype(np.float64))
    return a, SparseOperator(indptr, indices, values, (n, n))


def test_transpose_csr_matches_scipy():
    g = random_graph(n=31, directed=True, weighted=True, seed=3)
    t = transpose_csr(g.indptr, g.indices, g.edge_weight, (31, 31))
    ref = g.to_scipy().T.tocsr()
    ref.sort_indices()
    assert np.array_equal(t[0], ref.indptr)
    assert np.array_equal(t[1], ref.indices)
    assert np.allclose(t[2], ref.data)


@pytest.mark.parametrize("layer_cls", [GCNLayer, SAGELayer])
@pytest.mark.parametrize("f_in,f_out", [(5, 7), (7, 3)])
@pytest.mark.parametrize("directed", [False, True])
def test_layer_matches_dense_float64(layer_cls, f_in, f_out, directed):
    torch.manual_seed(0)
    g = random_graph(n=29, f=f_in, directed=directed, seed=1)
    a, op = dense(g, layer_cls.norm)
    if directed:
        assert not np.allclose(a, a.T)
    layer = layer_cls(f_in, f_out)
    h = torch.randn(g.num_nodes, f_in, requires_grad=True)
    z = layer(op, h)
    gz = torch.randn_like(z)
    z.backward(gz)

    ref = layer_cls(f_in, f_out).double()
    ref.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    a_t = torch.tensor(a)
    ref_op = type("DenseOp", (), {"num_dst": g.num_nodes, "__call__": lambda self, x: a_t @ x})()
    h64 = h.detach().double().requires_grad_(True)
    z64 = ref(ref_op, h64)
    z64.backward(gz.double())
    torch.testing.assert_close(z.double(), z64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.grad.double(), h64.grad, rtol=1e-5, atol=1e-5)
    for (name, p), p64 in zip(layer.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.double(), p64.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_gnn_per_layer_ops_and_bipartite_block():
    """A bipartite block (num_dst < num_src) feeds the first num_dst rows as the roots."""
    torch.manual_seed(0)
    g = random_graph(n=20, f=4, seed=2)
    indptr, indices, values = propagation_matrix(g, "mean")
    n_dst = 8
    block = SparseOperator(indptr[:n_dst + 1], indices[:indptr[n_dst]], values[:indptr[n_dst]],
                           (n_dst, g.num_nodes))
    full = SparseOperator(indptr, indices, values, (g.num_nodes, g.num_nodes))
    model = GNN("sage", 4, 6, 3, layers=2, dropout=0.0)
    x = torch.as_tensor(g.x)
    out_block = model([full, block], x)
    out_full = model(full, x)[:n_dst]
    torch.testing.assert_close(out_block, out_full)
    with pytest.raises(ValueError, match="operators for 2 layers"):
        model([full], x)


def test_reused_outputs_give_identical_training_and_stay_bounded():
    """The serial runtime's reused SpMM buffers change nothing but speed."""
    from gnnpar.training.serial import SerialRuntime
    from gnnpar.training.trainer import TrainConfig, fit
    g = random_graph(n=60, f=5, seed=4)
    curves, params = [], []
    for reuse in (False, True):
        rt = SerialRuntime(g, "gcn")
        if not reuse:
            rt.op.fwd_buffers = rt.op.bwd_buffers = None
        torch.manual_seed(0)
        model = GNN("gcn", 5, 8, 3, layers=3, dropout=0.5)
        curves.append([r["loss"] for r in fit(model, rt, TrainConfig(epochs=4))])
        params.append([p.detach().clone() for p in model.parameters()])
    assert curves[0] == curves[1]
    assert all(torch.equal(a, b) for a, b in zip(*params))
    # a caller that never rewinds gets fresh tensors past the cap, not an ever-growing cache
    op = SerialRuntime(g, "gcn").op
    for _ in range(100):
        op(torch.randn(60, 4))
    assert len(op.fwd_buffers.slots) == op.fwd_buffers.max_slots
