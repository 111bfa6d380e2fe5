"""The input features' dropout done by the mini-batch sampler (``ServiceConfig.input_dropout``,
gnnpar/sampling/service.py) instead of the model: the hash mask of a seed of (seed, epoch,
stream, step), bit for bit; a step on such a minibatch equals the model dropping the same
mask itself; :class:`gnnpar.nn.models.GNN` refuses features dropped with another p, or while
it evaluates; the run's setup hands the sampler a GNN's p on a CPU run, and nothing for a
model of one's own or on a GPU."""
import numpy as np
import pytest
import torch

from gnnpar.nn import models
from gnnpar.nn.dropout import _units
from gnnpar.interfaces import LayerOps
from gnnpar.kernels import cpu_dropout
from gnnpar.nn.models import GNN, sampler_input_dropout
from gnnpar.sampling import row_gather
from gnnpar.training.minibatch_loop import DataParallel, train_step
from gnnpar.sampling.neighbor import input_dropout_seed
from gnnpar.sampling.service import SamplingStats, ServiceConfig
from gnnpar.training.trainer import TrainConfig, make_optimizer

from .graphs import random_graph
from .test_minibatch_speed_parts import _service

pytestmark = pytest.mark.skipif(not cpu_dropout.usable(torch.ones(1)),
                                reason="the sampler's pass is the compiled one (numba)")
GRAPH = random_graph(150, 6, f=5, seed=1)
P = 0.5


def _reference(x, seed):
    """``x`` under the hash mask of ``seed`` (numpy's keep decisions, a select)."""
    units, scale = _units(P)
    keep = torch.from_numpy(cpu_dropout.keep_mask(x.numel(), seed, units)).view(x.shape)
    return torch.where(keep, x * scale, 0.0)


def _batches(cfg, epochs=2):
    model = GNN("sage", 5, 8, GRAPH.num_classes, 2, P)
    service = _service(GRAPH, model, cfg, batch=12)
    service.start(0, epochs)
    try:
        return [b for e in range(epochs) for b in service.epoch(e, SamplingStats())]
    finally:
        service.close()


def test_the_sampler_drops_the_input_with_the_seeded_mask():
    raw = _batches(ServiceConfig(macrobatch=2, inline=True, seed=5))
    dropped = _batches(ServiceConfig(macrobatch=2, inline=True, seed=5, input_dropout=P))
    seeds = set()
    for a, b in zip(raw, dropped):
        assert (a.x_dropout, b.x_dropout) == (None, P)
        seed = input_dropout_seed(5, b.epoch, 0, b.step)
        seeds.add(seed)
        assert torch.equal(b.x, _reference(a.x, seed))
    assert len(seeds) == len(dropped)  # a mask of its own per minibatch, epochs included


def test_threads_and_bursts_drop_alike():
    ref = _batches(ServiceConfig(macrobatch=2, inline=True, input_dropout=P))
    for cfg in (ServiceConfig(macrobatch=3, workers=2, prefetch=1, input_dropout=P),
                ServiceConfig(macrobatch=1, workers=2, prefetch=2, burst=True,
                              input_dropout=P)):
        got = _batches(cfg)
        assert [torch.equal(a.x, b.x) for a, b in zip(ref, got)] == [True] * len(ref)


def test_a_step_on_dropped_input_equals_the_model_dropping_it(monkeypatch):
    """Two runs from one initialisation: the sampler drops the input (the model skips its
    dropout), or the model drops it with the same mask through its own ``dropout`` (patched
    to take the minibatch's seed, not one from torch's generator). Same losses and
    parameters, bit for bit, the hidden layers' dropout included."""
    def run(cfg, patched):
        torch.manual_seed(3)
        model = GNN("sage", 5, 8, GRAPH.num_classes, 2, P)
        opt = make_optimizer(model, TrainConfig())
        service = _service(GRAPH, model, cfg, batch=12)
        service.start(0, 2)
        current = {}
        if patched:
            def own(x, p, training=True):
                assert p == P and training
                seed = input_dropout_seed(cfg.seed, current["epoch"], 0, current["step"])
                return _reference(x, seed)
            monkeypatch.setattr(models, "dropout", own)
        losses = []
        for e in range(2):
            for b in service.epoch(e, SamplingStats()):
                current.update(epoch=b.epoch, step=b.step)
                losses.append(float(train_step(model, opt, DataParallel(), b, 90)))
        service.close()
        monkeypatch.undo()
        return losses, [p.detach().clone() for p in model.parameters()]

    a, pa = run(ServiceConfig(macrobatch=2, inline=True, input_dropout=P), False)
    b, pb = run(ServiceConfig(macrobatch=2, inline=True), True)
    assert a == b
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))


def test_gnn_refuses_features_dropped_with_another_p_or_while_evaluating():
    model = GNN("gcn", 5, 8, 3, 2, P)
    x = torch.randn(4, 5)
    op = torch.eye(4).to_sparse_csr()
    with pytest.raises(ValueError, match="dropped with p=0.3"):
        model(LayerOps(op, 0.3), x)
    model.eval()
    with pytest.raises(ValueError, match="evaluates"):
        model(LayerOps(op, P), x)


def test_the_setup_hands_the_sampler_a_gnn_p_only():
    assert sampler_input_dropout(GNN("sage", 5, 8, 3, 2, 0.25), "cpu") == 0.25
    assert sampler_input_dropout(GNN("sage", 5, 8, 3, 2, 0.25), "cuda") == 0.0

    class Own(torch.nn.Module):
        dropout = 0.5
    assert sampler_input_dropout(Own(), "cpu") == 0.0
    with pytest.raises(Exception, match="input dropout"):
        ServiceConfig(input_dropout=1.0)
    np.testing.assert_array_equal(input_dropout_seed(1, 2, 3, 4), input_dropout_seed(1, 2, 3, 4))
    assert 0 <= input_dropout_seed(1, 2, 3, 4) < 2 ** 62


@pytest.mark.parametrize("f", [5, 32, 130])
@pytest.mark.parametrize("lists", [1, 3])
def test_the_copy_drops_each_list_with_its_own_seed(f, lists):
    """The compiled copy (non-temporal stores where f is a multiple of 16), rows shared by
    the lists and repeated within one: each output is its plain copy under its seed's
    mask, bit for bit."""
    rng = np.random.default_rng(f + lists)
    x = torch.randn(300, f)
    x[0, 0], x[1, 1] = float("nan"), float("inf")  # selects, not products: kept as they are
    ids = [rng.integers(0, 300, int(rng.integers(0, 400))) for _ in range(lists)]
    seeds = [int(s) for s in rng.integers(0, 2 ** 62, lists)]
    got = row_gather.gather_groups(x, ids, None, (seeds, P))
    for g, i, s in zip(got, ids, seeds):
        torch.testing.assert_close(g, _reference(x[torch.from_numpy(i)], s), rtol=0, atol=0,
                                   equal_nan=True)
    with pytest.raises(ValueError, match="seeds"):
        row_gather.gather_groups(x, ids, None, (seeds + [1], P))
    with pytest.raises(ValueError, match="compiled copy"):
        row_gather.gather_groups(x.double(), ids, None, (seeds, P))
