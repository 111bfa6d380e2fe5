"""A model file ``--save-model`` writes makes the trained model again (``gnnpar.load_model``):
the same logits bit for bit in process, the training log's test accuracy through the installed
``gnnpar-train``, and one-line refusals of files that are not gnnpar's."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import gnnpar
from gnnpar.datasets import InputError, load_dataset
from gnnpar.interfaces import LayerOps
from gnnpar.nn.models import build_model
from gnnpar.infer.saved_model import model_payload, write_model_file
from gnnpar.training.serial import SerialRuntime
from gnnpar.cli.spec import RunSpec
from gnnpar.training.trainer import TrainConfig, evaluate, fit

from .cli_util import ROOT

SMALL = "sbm:n=240,blocks=3,p_in=0.06,p_out=0.006,feat=8,seed=3"
TRAIN = os.path.join(os.path.dirname(sys.executable), "gnnpar-train")


def _spec(model, **kw):
    return RunSpec.of(model=model, layers=kw.get("layers", 2), hidden=16, dropout=0.3,
                   heads=kw.get("heads"))


@pytest.mark.parametrize("kind,heads", [("gcn", None), ("sage", None), ("gat", None),
                                        ("gat", 2)])
def test_load_model_gives_the_trained_logits_bit_for_bit(tmp_path, kind, heads):
    graph = load_dataset(SMALL)
    torch.manual_seed(0)
    model = build_model(kind, graph.num_features, 16, graph.num_classes, 2, 0.3, heads=heads)
    runtime = SerialRuntime(graph, model.norm)
    fit(model, runtime, TrainConfig(epochs=3, lr=0.01, weight_decay=0.0))
    path = str(tmp_path / "m.pt")
    write_model_file(path, model_payload(model, _spec(kind, heads=heads),
                                         {"f_in": graph.num_features, "f_out": graph.num_classes}))
    loaded = gnnpar.load_model(path)
    assert not loaded.training and loaded.norm == model.norm
    model.eval()
    with torch.no_grad():
        runtime.start_pass()
        want = model(LayerOps(runtime.op), runtime.x).clone()
        runtime.start_pass()
        got = loaded(LayerOps(runtime.op), runtime.x)
    assert torch.equal(got, want)
    saved = torch.load(path, weights_only=True)
    if kind == "gat":
        assert saved["heads"] == (heads or 8)  # resolved, never None


@pytest.mark.skipif(not os.path.exists(TRAIN), reason="gnnpar-train is not installed")
@pytest.mark.parametrize("argv", [["--model", "gcn"], ["--model", "gat", "--hidden", "16"],
                                  ["--model", "custom_gnn:gin", "--hidden", "16"]])
def test_saved_model_reproduces_the_logged_test_accuracy(tmp_path, argv):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "scripts"))  # custom_gnn's folder
    log, saved = tmp_path / "log.jsonl", tmp_path / "m.pt"
    res = subprocess.run([TRAIN, "--dataset", SMALL, "--epochs", "5", "--quiet",
                          "--log-json", str(log), "--save-model", str(saved), *argv],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    final = json.loads(log.read_text().splitlines()[-1])
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        model = gnnpar.load_model(str(saved))
    finally:
        sys.path.remove(os.path.join(ROOT, "scripts"))
    accs = evaluate(model, SerialRuntime(load_dataset(SMALL), model.norm))
    assert accs["test_acc"] == final["test_acc"]
    assert accs["val_acc"] == final["val_acc"]


def test_files_that_are_not_models_are_refused_in_one_line(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    alist = tmp_path / "list.pt"
    torch.save([1, 2, 3], alist)
    code = tmp_path / "code.pt"
    torch.save({"state_dict": {}, "model": shutil.copy}, code)  # a function: never unpickled
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    for path, needle in [(tmp_path / "none.pt", "not found"), (tmp_path, "not a file"),
                         (text, "not a gnnpar model file"), (alist, "not a gnnpar model file"),
                         (code, "not a gnnpar model file"), (other, "not a gnnpar model file")]:
        with pytest.raises(InputError, match=needle) as info:
            gnnpar.load_model(str(path))
        assert "\n" not in str(info.value)


def test_weights_of_another_shape_are_refused(tmp_path):
    graph = load_dataset(SMALL)
    model = build_model("gcn", graph.num_features, 16, graph.num_classes, 2, 0.0)
    payload = model_payload(model, _spec("gcn"), {"f_in": graph.num_features,
                                                  "f_out": graph.num_classes})
    payload["hidden"] = 32
    path = str(tmp_path / "m.pt")
    write_model_file(path, payload)
    with pytest.raises(InputError, match="do not fit"):
        gnnpar.load_model(path)
