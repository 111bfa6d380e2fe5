"""The model seam as code (issue 43, item 1): the ``Operator``/``EdgeOperator`` protocols every
runtime's operator satisfies, a user's layer class joining ``GNN`` with one line
(``gnnpar.register_layer``: the README's GIN layer and the user guide's attention layer) and
training on every algorithm and in mini batch as the serial run does, ``--model-arg`` values
reaching a user's layer or factory, and ``norm`` read where users put it."""
import json

import numpy as np
import pytest
import torch

import gnnpar
from gnnpar.datasets import InputError
from gnnpar.training.distributed import DistRuntime
from gnnpar.interfaces import EdgeOperator, Operator
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.algorithms import make_grid
from gnnpar.nn.models import GNN, LAYERS, build_model, sampler_input_dropout
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.sampling import NeighborSampler, SamplerConfig, Topology, batch_rng
from gnnpar.infer.saved_model import load_model
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn

from . import readme_layers
from .cli_util import readme_gin, run_installed
from .dist_cases import GRAD_FLOOR, equivalence_many
from .graphs import random_graph

KINDS = (readme_layers.GIN_KIND, readme_layers.ATTENTION_KIND)
#: every algorithm, at an even and an odd world size (uneven blocks: 47 rows)
CASES = {2: [("1d", "1d", None, 1, {}), ("1.5d-c2", "1.5d", None, 2, {"variant": "halo"}),
             ("4d-1x1x1x2", "4d", (1, 1, 1, 2), 1, {"layers": 3})],
         3: [("1d-halo", "1d-halo", None, 1, {}), ("2d-3x1", "2d", (3, 1), 1, {}),
             ("2d-1x3-halo", "2d", (1, 3), 1, {"variant": "halo"}),
             ("3d-1x3x1", "3d", (1, 3, 1), 1, {"layers": 3})]}
TINY = "sbm:n=90,blocks=3,p_in=0.15,p_out=0.02"


def seam_world(rank, world, cases):
    """The registered layers on every case against the serial run (``equivalence_many``; the
    attention layer's gradients within GAT's documented bound, ``GRAD_FLOOR``), and
    whether every operator each algorithm hands a layer is an ``Operator`` whose ``edges()`` is
    an ``EdgeOperator``."""
    out = equivalence_many(rank, world, cases, 47, True, "metis", KINDS, norms=("gcn", "sum"),
                           grad_floors={readme_layers.ATTENTION_KIND: GRAD_FLOOR[torch.float32]})
    g = random_graph(n=47, f=6, classes=3, seed=11, directed=True)
    shard = build_shard(g, partition_graph(g, world, "metis", seed=3), rank, norms=("gcn",))
    for label, algo, dims, replication, kw in cases:
        rt = DistRuntime(make_grid(algo, world, dims, replication), shard, algorithm(algo), "gcn", "cpu",
                         **kw)
        ops = rt.op if isinstance(rt.op, (list, tuple)) else [rt.op]
        out[label]["operators"] = [isinstance(o, Operator) and isinstance(o.edges(), EdgeOperator)
                                   for o in ops]
    return out


@pytest.mark.parametrize("world", sorted(CASES))
def test_registered_layers_train_on_every_algorithm_as_serially(world):
    out = spawn(seam_world, world, args=(CASES[world],), timeout_s=300)
    for rank, per_label in enumerate(out):
        for label, res in per_label.items():
            assert res["operators"] and all(res["operators"]), (rank, label)
            for what, err in res["errs"].items():
                assert err <= 1e-5, f"rank {rank} {label} {what}: {err:.3g}"


def test_serial_and_sampled_operators_are_operators():
    g = random_graph(n=60, f=4, classes=3, seed=2)
    op = SerialRuntime(g, "gcn").op
    assert isinstance(op, Operator) and isinstance(op.edges(), EdgeOperator)
    blocks = NeighborSampler(Topology.from_graph(g, ("gcn",)), SamplerConfig((3, 3), "gcn")
                             ).sample(np.arange(5), batch_rng(0, 0, 0, 0))
    for b in blocks:
        assert isinstance(b.operator(), Operator)
        assert isinstance(b.operator().edges(), EdgeOperator)
    assert not isinstance(object(), Operator)


@pytest.mark.parametrize("kind", KINDS, ids=["gin", "attention"])
def test_registered_layer_all_neighbour_step_equals_full_batch(kind):
    """GNN of a registered layer on sampled blocks (every neighbour) gives the full-batch
    step's outputs and gradients: the mini-batch path runs it as it runs gnnpar's layers."""
    graph = random_graph(n=120, avg_deg=5, f=6, classes=3, seed=4)
    seeds = np.flatnonzero(graph.train_mask)[::2]
    torch.manual_seed(0)
    model = GNN(kind, graph.num_features, 8, graph.num_classes, layers=3, dropout=0.0)
    rt = SerialRuntime(graph, model.norm)
    y = rt.y[torch.from_numpy(seeds)]
    model.zero_grad()
    out = model(rt.op, rt.x)[torch.from_numpy(seeds)]
    torch.nn.functional.cross_entropy(out, y).backward()
    full = [p.grad.clone() for p in model.parameters()]
    blocks = NeighborSampler(Topology.from_graph(graph, (model.norm,)),
                             SamplerConfig((-1, -1, -1), model.norm)).sample(
        seeds, batch_rng(0, 0, 0, 0))
    model.zero_grad()
    out_mb = model([b.operator() for b in blocks], rt.x[torch.from_numpy(blocks[0].src_ids)])
    torch.nn.functional.cross_entropy(out_mb, y).backward()
    torch.testing.assert_close(out_mb, out, rtol=1e-5, atol=1e-6)
    for (name, p), g in zip(model.named_parameters(), full):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6, msg=name)


def test_a_registered_layer_gets_gnns_stack_its_norm_and_its_arguments():
    model = build_model(readme_layers.GIN_KIND, 6, 8, 3, 3, 0.3, model_args={"eps": 0.25})
    assert isinstance(model, GNN) and model.norm == "sum"
    assert [type(m) for m in model.layers] == [readme_layers.GINLayer] * 3
    assert all(m.eps == 0.25 for m in model.layers)
    assert sampler_input_dropout(model, "cpu") == 0.3  # the sampler drops its input features
    assert readme_layers.GIN_KIND in LAYERS and "gcn" in LAYERS
    with pytest.raises(ValueError, match="takes no layer arguments"):
        GNN("gcn", 6, 8, 3, 2, 0.0, layer_args={"eps": 1})
    with pytest.raises(InputError, match="building the layer raised TypeError"):
        build_model(readme_layers.GIN_KIND, 6, 8, 3, 2, 0.0, model_args={"width": 2})


def test_register_layer_refuses_what_is_not_a_layer_class():
    with pytest.raises(TypeError, match="torch.nn.Module class"):
        gnnpar.register_layer(lambda f_in, f_out: None)
    odd = type("Odd", (torch.nn.Module,), {"norm": "laplacian"})
    with pytest.raises(ValueError, match="norm 'laplacian'"):
        gnnpar.register_layer(odd)


LAYER_NORMS = '''
import torch

class MeanLayer(torch.nn.Module):
    norm = "mean"
    def __init__(self, f_in, f_out):
        super().__init__()
        self.lin = torch.nn.Linear(f_in, f_out)
    def forward(self, op, h):
        return self.lin(op(h))

class SumLayer(MeanLayer):
    norm = "sum"

class Stack(torch.nn.Module):
    def __init__(self, layers, f_in, f_out):
        super().__init__()
        self.layers = torch.nn.ModuleList(c(f_in if i == 0 else f_out, f_out)
                                          for i, c in enumerate(layers))
    def forward(self, ops, x):
        for i, layer in enumerate(self.layers):
            x = layer(ops[i], x)
        return x

def mean_layers(f_in, hidden, f_out, layers, dropout, scale=1.0, tag="x"):
    model = Stack([MeanLayer] * layers, f_in, f_out)
    model.scale, model.tag = scale, tag
    return model

def mixed(f_in, hidden, f_out, layers, dropout):
    return Stack([MeanLayer, SumLayer], f_in, f_out)
'''


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "seam_models.py").write_text(LAYER_NORMS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_norm_is_read_from_the_layers_where_the_model_has_none(user_models):
    assert build_model("seam_models:mean_layers", 5, 8, 3, 2, 0.0).norm == "mean"
    with pytest.raises(InputError, match="different norms"):
        build_model("seam_models:mixed", 5, 8, 3, 2, 0.0)


def test_model_args_reach_a_factory_with_their_types(user_models):
    model = build_model("seam_models:mean_layers", 5, 8, 3, 2, 0.0,
                        model_args={"scale": 0.5, "tag": "y"})
    assert (model.scale, model.tag) == (0.5, "y")
    with pytest.raises(InputError, match="unexpected keyword argument 'nope'"):
        build_model("seam_models:mean_layers", 5, 8, 3, 2, 0.0, model_args={"nope": 1})


def test_model_arg_flags_train_save_and_predict_with_the_values(tmp_path):
    """Through the installed gnnpar-train: ``--model-arg`` values typed and given to the
    README's registered GIN layer, recorded in the model file, which gives the same layer back;
    refused with a built-in model, twice, or malformed."""
    (tmp_path / "my_gnn.py").write_text(readme_gin())
    base = ["--dataset", TINY, "--epochs", "2", "--hidden", "8", "--quiet"]
    res = run_installed("gnnpar-train", *base, "--model", "my_gnn:GINLayer", "--model-arg",
                        "eps=0.5", "--save-model", "m.pt", "--log-json", "run.jsonl",
                        cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "run.jsonl").read_text().splitlines()[-1])["final"]
    payload = torch.load(tmp_path / "m.pt", weights_only=True)
    assert payload["model_args"] == {"eps": 0.5} and payload["model"] == "my_gnn:GINLayer"
    res = run_installed("gnnpar-predict", "--model-file", "m.pt", "--dataset", TINY,
                        "--out", "preds", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    for argv, needle in (
            (["--model", "gcn", "--model-arg", "eps=1"], "--model-arg is for your own model"),
            (["--model", "my_gnn:GINLayer", "--model-arg", "eps=1", "--model-arg", "eps=2"],
             "--model-arg eps is given twice"),
            (["--model", "my_gnn:GINLayer", "--model-arg", "eps"], "KEY=VALUE"),
            (["--model", "my_gnn:GINLayer", "--model-arg", "depth=3"],
             "unexpected keyword argument 'depth'")):
        res = run_installed("gnnpar-train", *base, *argv, cwd=tmp_path)
        assert res.returncode == 2 and needle in res.stderr, (argv, res.stderr[-2000:])
        assert "Traceback" not in res.stderr


def test_a_saved_registered_layer_model_loads_in_python(tmp_path, monkeypatch):
    (tmp_path / "my_gnn.py").write_text(readme_gin())
    res = run_installed("gnnpar-train", "--dataset", TINY, "--epochs", "1", "--hidden", "8",
                        "--quiet", "--model", "my_gnn:GINLayer", "--model-arg", "eps=0.5",
                        "--save-model", "m.pt", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    model = load_model("m.pt")
    assert isinstance(model, GNN) and all(m.eps == 0.5 for m in model.layers)


def test_the_model_table_agrees_with_the_layers_and_the_tools():
    """gnnpar/nn/model_registry.py's facts are the layers' own, and the tools read their names
    from it."""
    from gnnpar.nn.model_registry import MODELS, USER, facts
    from gnnpar.cli.plan_cli import build_parser as plan_parser
    for name, f in MODELS.items():
        assert LAYERS[name].norm == f.norm, name
        assert GNN(name, 4, 8, 2, 2, 0.0).norm == f.norm
    assert facts(readme_layers.GIN_KIND) is USER and facts("gat").attention
    choices = next(a.choices for a in plan_parser()._actions if a.dest == "model")
    assert tuple(choices) == tuple(MODELS)
