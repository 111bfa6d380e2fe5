"""A user's model through ``gnnpar-train --model package.module:factory``
(``gnnpar/nn/custom_model.py``), the one operator type a model receives (``LayerOps``), and the
refusals of a factory that cannot give a model."""
import json
import os
import textwrap

import pytest
import torch

from gnnpar.datasets import InputError
from gnnpar.interfaces import LayerOps
from gnnpar.nn.models import GNN, build_model
from gnnpar.train import main

from .cli_util import ROOT, readme_gin, run_installed, run_train

TINY = "sbm:n=90,blocks=3,p_in=0.15,p_out=0.02"

FACTORIES = textwrap.dedent('''
    import torch

    class Mean(torch.nn.Module):
        """Two layers of mean aggregation and a linear map, each layer its own operator."""
        norm = "mean"

        def __init__(self, f_in, hidden, f_out, layers, dropout):
            super().__init__()
            widths = [f_in] + [hidden] * (layers - 1) + [f_out]
            self.lins = torch.nn.ModuleList(torch.nn.Linear(a, b)
                                            for a, b in zip(widths, widths[1:]))

        def forward(self, ops, x):
            h = x
            for i, lin in enumerate(self.lins):
                h = lin(ops[i](h))
                if i < len(self.lins) - 1:
                    h = torch.relu(h)
            return h

    def mean(f_in, hidden, f_out, layers, dropout):
        return Mean(f_in, hidden, f_out, layers, dropout)

    def not_a_model(*args):
        return [1, 2]

    def raises(*args):
        raise RuntimeError("no GPU here")

    def odd_norm(*args):
        m = torch.nn.Linear(2, 2)
        m.norm = "laplacian"
        return m

    value = 3
''')


@pytest.fixture
def factories(tmp_path, monkeypatch):
    (tmp_path / "user_models.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


REFUSED = [
    ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
    ("user_models:missing", "has no 'missing'"),
    ("user_models:value", "is not callable"),
    ("user_models:not_a_model", "returned a list, not a torch.nn.Module"),
    ("user_models:raises", "the factory raised RuntimeError: no GPU here"),
    ("user_models:odd_norm", "norm 'laplacian' is not one of gcn, mean, sum"),
    ("gin", "choose one of gcn, sage, gat or name your own as package.module:factory"),
    (":make", "a custom model is named package.module:factory"),
]


@pytest.mark.parametrize("name,message", REFUSED, ids=[n for n, _ in REFUSED])
def test_bad_model_exits_2_with_one_line_before_any_work(factories, name, message, capsys,
                                                         no_work):
    assert main(["--dataset", TINY, "--epochs", "1", "--quiet", "--model", name]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert message in lines[0], lines[0]


def test_heads_with_a_custom_model_is_refused(factories, capsys):
    assert main(["--dataset", TINY, "--quiet", "--model", "user_models:mean",
                 "--heads", "4"]) == 2
    assert "--heads sets the attention of --model gat" in capsys.readouterr().err


def test_layer_ops_one_type_for_a_shared_operator_and_one_a_layer():
    shared, per = LayerOps("A"), LayerOps(["A0", "A1"])
    assert shared[0] == shared[5] == "A" and shared.layers is None
    assert (per[0], per[1], per.layers) == ("A0", "A1", 2)
    assert LayerOps(per)[1] == "A1"
    with pytest.raises(IndexError, match="the model's layer count must equal --layers"):
        per[2]


def test_build_model_gives_the_factorys_model_and_gnn_takes_layer_ops(factories):
    model = build_model("user_models:mean", 5, 8, 3, 2, 0.0)
    assert type(model).__name__ == "Mean" and model.norm == "mean"
    with pytest.raises(InputError, match="returned a list"):
        build_model("user_models:not_a_model", 5, 8, 3, 2, 0.0)
    gnn = GNN("gcn", 4, 6, 2, 2, 0.0).eval()
    op = lambda h: h * 0.5  # noqa: E731 - an operator as a layer sees it
    op_obj = type("Op", (), {"__call__": lambda self, h: op(h), "num_dst": 7})()
    x = torch.randn(7, 4)
    assert torch.equal(gnn(op_obj, x), gnn(LayerOps(op_obj), x))
    assert torch.equal(gnn([op_obj, op_obj], x), gnn(LayerOps([op_obj, op_obj]), x))


@pytest.mark.parametrize("run", [
    ["--algo", "serial"],
    ["--algo", "1d-halo", "--nprocs", "2"],
    ["--algo", "3d", "--nprocs", "2", "--grid", "1x1x2"],  # one operator a layer
    ["--mode", "minibatch", "--fanouts", "4,4", "--batch-size", "16"],
], ids=["serial", "1d-halo", "3d", "minibatch"])
def test_custom_model_trains_through_the_cli(factories, tmp_path, run):
    log = tmp_path / "run.jsonl"
    env_path = os.pathsep.join([str(factories), ROOT])
    res = run_train("--dataset", TINY, "--model", "user_models:mean", "--layers", "2",
                    "--hidden", "8", "--epochs", "2", "--quiet", "--log-json", str(log), *run,
                    env={"PYTHONPATH": env_path})
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    epochs = [r for r in records if "epoch" in r and not r.get("final")]
    assert len(epochs) == 2 and all(r["loss"] == r["loss"] for r in epochs)  # no NaN
    assert records[-1]["final"]


def test_readme_example_trains_as_printed(tmp_path):
    """The README's GIN, saved as printed, trains through the installed gnnpar-train run from
    its folder (no PYTHONPATH) in full batch on one operator per layer (3d) and in mini
    batch."""
    (tmp_path / "my_gnn.py").write_text(readme_gin())
    for run in (["--algo", "3d", "--nprocs", "2", "--grid", "1x1x2"],
                ["--mode", "minibatch", "--fanouts", "4,4", "--batch-size", "16"]):
        res = run_installed("gnnpar-train", "--dataset", TINY, "--model", "my_gnn:gin",
                            "--epochs", "1", "--hidden", "8", "--quiet", *run, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]



def test_custom_model_resumes_bit_for_bit(factories, tmp_path):
    """2 epochs, then --resume to 4, log the same losses as 4 epochs straight (2 ranks)."""
    env = {"PYTHONPATH": os.pathsep.join([str(factories), ROOT])}
    common = ["--dataset", TINY, "--model", "user_models:mean", "--hidden", "8", "--quiet",
              "--algo", "1d-halo", "--nprocs", "2", "--dropout", "0.3"]
    straight, resumed = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert run_train(*common, "--epochs", "4", "--log-json", str(straight),
                     env=env).returncode == 0
    ckpt = str(tmp_path / "ckpt")
    first = run_train(*common, "--epochs", "2", "--checkpoint-dir", ckpt, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    second = run_train(*common, "--epochs", "4", "--checkpoint-dir", ckpt, "--resume",
                       "--log-json", str(resumed), env=env)
    assert second.returncode == 0, second.stderr[-2000:]

    def losses(path):
        return {r["epoch"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())
                if "epoch" in r and not r.get("final")}
    a, b = losses(straight), losses(resumed)
    assert b and all(a[e] == b[e] for e in b), (a, b)


@pytest.mark.parametrize("weighted", [False, True])
def test_sum_values_come_from_raw_weights_when_a_shard_lacks_them(weighted):
    """A GIN-style model (norm "sum") on shards written with the default gcn,mean: the values
    are S's raw weights, bit for bit what a shard written with "sum" holds."""
    import numpy as np
    from gnnpar.kernels.dist_op import shard_values
    from gnnpar.partitioners import partition_graph
    from gnnpar.partitioners.shard_build import build_shard
    from .graphs import random_graph
    g = random_graph(n=40, avg_deg=4, seed=5, weighted=weighted, self_loops=True)
    part = partition_graph(g, 3, "random", seed=1)
    for rank in range(3):
        stored = build_shard(g, part, rank, norms=("gcn", "sum")).values["sum"]
        derived = shard_values(build_shard(g, part, rank, norms=("gcn", "mean")), "sum")
        assert derived.dtype == np.float32 and np.array_equal(derived.view(np.int32),
                                                              stored.view(np.int32))
    with pytest.raises(InputError, match="not 'mean'; repartition with it"):
        shard_values(build_shard(g, part, 0, norms=("gcn",)), "mean")
