"""``gnnpar-predict`` and ``gnnpar-train --save-predictions`` as a user runs them: the
installed console scripts, from a working folder, no ``PYTHONPATH`` (issue 41).

- the accuracy ``predict.json`` reports equals the training log's final ``test_acc`` for the
  same weights (serial and distributed), and ``--save-predictions`` writes the same files;
- a model trained in mini batch predicts layer-wise (one process and data parallel) as its
  full forward pass does; shards of a reordered graph and ``--per-rank`` files come back in
  the dataset's order; ``mpirun`` ranks each run the console script;
- bad input exits 2 with one line before any output is written, and a write that runs out of
  room (``ulimit -f``) leaves no file named like a finished one.
"""
import glob
import json
import os
import subprocess

import numpy as np
import pytest

from .cli_util import installed, run_installed, run_main
from .required import mpirun
from .test_promises_cli import one_line, readme_gin

DATA = "sbm:n=120,blocks=3,p_in=0.12,p_out=0.02"
TRAIN = ["--dataset", DATA, "--hidden", "8", "--epochs", "3", "--quiet"]
TOL = 1e-5


def train(cwd, *argv, **kw):
    res = run_installed("gnnpar-train", *argv, cwd=cwd, **kw)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def predict(cwd, *argv, code=0, **kw):
    res = run_installed("gnnpar-predict", *argv, cwd=cwd, **kw)
    if code is not None:
        assert res.returncode == code, res.stderr[-3000:]
    return res


def final(log) -> dict:
    return json.loads(open(log).read().splitlines()[-1])


def outputs(folder) -> dict:
    meta = json.load(open(os.path.join(folder, "predict.json")))
    arrays = {name: np.load(os.path.join(folder, entry["file"]))
              for name, entry in meta["files"].items() if "file" in entry}
    return {"meta": meta, **arrays}


def close(a, b) -> bool:
    return float(np.abs(a.astype(np.float64) - b).max()) <= TOL * max(1.0, np.abs(b).max())


@pytest.fixture(scope="module")
def serial_model(tmp_path_factory):
    """A GCN trained serially: its folder, with m.pt, log.jsonl and --save-predictions tp/."""
    d = tmp_path_factory.mktemp("serial")
    train(d, *TRAIN, "--layers", "3", "--save-model", "m.pt", "--log-json", "log.jsonl",
          "--save-predictions", "tp")
    return d


def test_train_predictions_and_predict_agree_with_the_log(serial_model):
    d = serial_model
    res = predict(d, "--model-file", "m.pt", "--dataset", DATA, "--out", "p", "--embeddings")
    assert "test_acc=" in res.stderr and "gnnpar-predict: wrote" in res.stderr
    got, saved, log = outputs(d / "p"), outputs(d / "tp"), final(d / "log.jsonl")
    assert got["meta"]["accuracy"]["test"] == log["test_acc"]
    assert saved["meta"]["accuracy"]["test"] == log["test_acc"]
    assert got["predictions"].shape == (120, 3) and got["embeddings"].shape == (120, 8)
    assert np.array_equal(got["predictions"], saved["predictions"])  # the same run
    assert np.array_equal(got["embeddings"], saved["embeddings"])
    assert got["meta"]["files"]["embeddings"]["dtype"] == "float32"
    assert got["meta"]["reorder"] == "degree"  # rows still in the dataset's order (above)


@pytest.mark.slow
@pytest.mark.parametrize("run", [["--algo", "2d", "--grid", "3x1", "--nprocs", "3",
                                  "--reorder", "rcm"],
                                 ["--algo", "3d", "--grid", "1x1x2", "--nprocs", "2",
                                  "--precision", "bf16"]],
                         ids=["2d-p3-rcm", "3d-p2-bf16"])
def test_distributed_predict_in_dataset_order(serial_model, run):
    """Shards of a reordered graph (``vertex_order.npy`` beside them) and bf16 embeddings
    (stored as their bits, said in predict.json)."""
    d = serial_model
    out = f"p-{run[1]}"
    predict(d, "--model-file", "m.pt", "--dataset", DATA, "--out", out, "--embeddings",
            "--quiet", *run)
    got, ref = outputs(d / out), outputs(d / "tp")
    if "bf16" in run:
        assert got["meta"]["files"]["embeddings"]["dtype"] == "bfloat16"
        assert got["embeddings"].dtype == np.uint16
        assert np.abs(got["predictions"] - ref["predictions"]).max() < 0.1  # bf16 rounding
    else:
        assert close(got["predictions"], ref["predictions"])
        assert close(got["embeddings"], ref["embeddings"])


@pytest.mark.slow
def test_distributed_training_accuracy_equals_predict(tmp_path):
    train(tmp_path, *TRAIN, "--algo", "1d-halo", "--nprocs", "2", "--save-model", "m.pt",
          "--log-json", "log.jsonl", "--save-predictions", "tp")
    log = final(tmp_path / "log.jsonl")
    predict(tmp_path, "--model-file", "m.pt", "--dataset", DATA, "--out", "p", "--algo",
            "1d-halo", "--nprocs", "2", "--quiet")
    assert outputs(tmp_path / "p")["meta"]["accuracy"]["test"] == log["test_acc"]
    assert outputs(tmp_path / "tp")["meta"]["accuracy"]["test"] == log["test_acc"]
    assert np.array_equal(outputs(tmp_path / "p")["predictions"],
                          outputs(tmp_path / "tp")["predictions"])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sage", "gat"])
def test_minibatch_model_predicts_layerwise(tmp_path, model):
    """Layer-wise inference of a mini-batch-trained model (serial and on 2 ranks) equals the
    full forward pass of the same weights."""
    train(tmp_path, *TRAIN, "--model", model, "--mode", "minibatch", "--fanouts", "4,4",
          "--batch-size", "32", "--save-model", "m.pt")
    predict(tmp_path, "--model-file", "m.pt", "--dataset", DATA, "--out", "full", "--quiet")
    ref = outputs(tmp_path / "full")["predictions"]
    for name, run in (("lw1", []), ("lw2", ["--nprocs", "2"])):
        predict(tmp_path, "--model-file", "m.pt", "--dataset", DATA, "--out", name,
                "--batch-size", "16", "--quiet", *run)
        got = outputs(tmp_path / name)
        assert got["meta"]["inference"] == "layer-wise" and close(got["predictions"], ref)


@pytest.mark.slow
def test_per_rank_files_from_partition_dir(serial_model, tmp_path):
    d = serial_model
    res = run_installed("gnnpar-partition", "--dataset", DATA, "--parts", "2", "--out",
                        str(tmp_path / "shards"), cwd=d)
    assert res.returncode == 0, res.stderr[-2000:]
    predict(d, "--model-file", "m.pt", "--partition-dir", str(tmp_path / "shards"), "--out",
            str(tmp_path / "pr"), "--algo", "1d", "--nprocs", "2", "--per-rank", "--quiet")
    ids = [np.load(f) for f in sorted(glob.glob(str(tmp_path / "pr" / "ids.rank*.npy")))]
    rows = [np.load(f) for f in
            sorted(glob.glob(str(tmp_path / "pr" / "predictions.rank*.npy")))]
    assert len(ids) == 2 and np.array_equal(np.sort(np.concatenate(ids)), np.arange(120))
    ref = outputs(d / "tp")["predictions"]
    assert close(np.concatenate(rows), ref[np.concatenate(ids)])


@pytest.mark.slow
def test_predict_under_mpirun(serial_model):
    d = serial_model
    res = run_installed("gnnpar-predict", "--model-file", "m.pt", "--dataset", DATA,
                        "--out", "p-mpi", "--algo", "1d-halo", "--quiet", cwd=d,
                        launcher=[mpirun(), "-n", "2"], env={"TORCH_CPP_LOG_LEVEL": "ERROR"})
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    got = outputs(d / "p-mpi")
    assert got["meta"]["world_size"] == 2
    assert close(got["predictions"], outputs(d / "tp")["predictions"])


@pytest.mark.slow
def test_save_predictions_on_resume_completion(tmp_path):
    train(tmp_path, *TRAIN, "--checkpoint-dir", "ck")
    train(tmp_path, *TRAIN[:-3], "--epochs", "5", "--quiet", "--checkpoint-dir", "ck",
          "--resume", "--save-model", "m.pt", "--save-predictions", "tp")
    predict(tmp_path, "--model-file", "m.pt", "--dataset", DATA, "--out", "p", "--quiet")
    assert np.array_equal(outputs(tmp_path / "p")["predictions"],
                          outputs(tmp_path / "tp")["predictions"])


# ---------------------------------------------------------------- bad input
class Evil:
    """Unpickling it would write a file: a model file must never be unpickled as code."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_bad_input_exits_2_with_one_line(serial_model, tmp_path):
    import torch
    d = serial_model
    base = ["--dataset", DATA, "--out", str(tmp_path / "o")]
    trap = tmp_path / "unpickled"
    torch.save({"state_dict": Evil(str(trap))}, tmp_path / "evil.pt")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    cases = [
        (["--model-file", "nope.pt", *base], "not found"),
        (["--model-file", str(tmp_path / "evil.pt"), *base], "not a gnnpar model file"),
        (["--model-file", "m.pt", "--dataset", "sbm:n=90,blocks=4,p_in=0.1,p_out=0.01",
          "--out", str(tmp_path / "o")], "gives 3 classes; the dataset: 32 features, 4 classes"),
        (["--model-file", "m.pt", "--dataset", DATA, "--out", str(tmp_path / "foreign")],
         "holds files gnnpar did not write"),
        (["--model-file", "m.pt", "--dataset", DATA, "--out", str(d / "tp" / "inner")],
         "a gnnpar predictions folder"),
        (["--model-file", "m.pt", *base, "--embeddings-layer", "3"], "out of range"),
        (["--model-file", "m.pt", *base, "--batch-size", "8", "--algo", "2d"],
         "layer-wise"),
    ]
    for i, (argv, words) in enumerate(cases):  # the first through the installed script
        res = predict(d, *argv, code=None) if i == 0 else run_main("gnnpar-predict", *argv,
                                                                   cwd=d)
        line = one_line(res)
        assert words in line, (argv, line)
    assert not trap.exists()
    assert not (tmp_path / "o").exists()


def test_factory_that_no_longer_imports(tmp_path):
    (tmp_path / "my_gnn.py").write_text(readme_gin())
    train(tmp_path, *TRAIN, "--model", "my_gnn:gin", "--save-model", "m.pt")
    line = one_line(predict(tmp_path, "--model-file", "m.pt", "--dataset", DATA, "--out", "o",
                            "--batch-size", "8", code=None))
    assert "layer-wise" in line  # a user's model is one forward pass
    os.remove(tmp_path / "my_gnn.py")
    line = one_line(predict(tmp_path, "--model-file", "m.pt", "--dataset", DATA, "--out", "o",
                            code=None))
    assert "my_gnn" in line and not (tmp_path / "o").exists()


def test_full_disk_leaves_no_finished_file(serial_model, tmp_path):
    """``ulimit -f``: the reservation of embeddings.npy (120 x 8 x 4 bytes and more) fails;
    exit 2 naming the path, and no file under a finished name."""
    out = tmp_path / "full"
    cmd = (f"ulimit -f 2; exec {installed('gnnpar-predict')} --model-file m.pt --dataset "
           f"{DATA} --out {out} --embeddings --embeddings-layer 1 --quiet")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(["bash", "-c", cmd], cwd=serial_model, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    left = set(os.listdir(out))
    assert not left & {"predictions.npy", "embeddings.npy", "predict.json"}, left
    assert not [name for name in left if name.endswith(".partial")], left  # debris removed
