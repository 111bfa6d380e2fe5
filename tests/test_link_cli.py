"""``gnnpar-train --task link`` as a user runs it: the installed console script, from a
working folder (issue 42, in progress).

- a serial run and 2- and 3-rank runs of the same split give the same loss curve and metrics
  (dropout 0; the negatives do not depend on the partition), and ``gnnpar-report`` draws the
  log;
- bad link input exits 2 with one line, before any work.
"""
import json
import os

import pytest

from .cli_util import run_installed, run_main
from .test_promises_cli import one_line

DATA = "sbm:n=160,blocks=4,p_in=0.1,p_out=0.01"
LINK = ["--task", "link", "--dataset", DATA, "--hidden", "8", "--epochs", "4", "--dropout",
        "0", "--neg-ratio", "2", "--quiet"]
METRICS = ("val_auc", "test_auc", "val_mrr", "test_mrr", "test_hits@20", "test_hits@50",
           "test_hits@100")


def records(log):
    return [json.loads(line) for line in open(log).read().splitlines()]


def train(cwd, *argv):
    res = run_installed("gnnpar-train", *argv, cwd=cwd)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
def test_link_runs_agree_serial_and_distributed(tmp_path):
    train(tmp_path, *LINK, "--log-json", "serial.jsonl")
    train(tmp_path, *LINK, "--algo", "1d-halo", "--nprocs", "2", "--log-json", "halo.jsonl")
    train(tmp_path, *LINK, "--algo", "2d", "--grid", "3x1", "--nprocs", "3", "--decoder", "dot",
          "--log-json", "2d.jsonl")
    ref = records(tmp_path / "serial.jsonl")
    assert ref[-1]["final"] and ref[-1]["task"] == "link" and ref[-1]["reorder"] == "none"
    assert all(0.0 <= ref[-1][k] <= 1.0 for k in METRICS)
    for name in ("halo.jsonl", "2d.jsonl"):
        got = records(tmp_path / name)
        assert got[-1]["world_size"] in (2, 3) and got[-1]["comm_bytes"] > 0
        for a, b in zip(got, ref):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
            for k in METRICS:
                assert a[k] == pytest.approx(b[k], abs=1e-5), (name, k)
    res = run_installed("gnnpar-report", "halo.jsonl", "-o", "halo.png", cwd=tmp_path)
    assert res.returncode == 0 and (tmp_path / "halo.png").stat().st_size > 0, res.stderr


@pytest.mark.parametrize("argv,says", [
    (["--task", "link", "--link-split", "0,0.5,0.5"], "no training share"),
    (["--task", "link", "--link-split", "0.5,0.5"], "three shares"),
    (["--task", "link", "--neg-ratio", "0"], "--neg-ratio must be in 1..1024"),
    (["--task", "link", "--neg-ratio", "1025"], "--neg-ratio must be in 1..1024"),
    (["--neg-ratio", "3"], "applies to --task link"),
    (["--task", "link", "--decoder", "cosine"], "unknown decoder 'cosine'"),
    (["--task", "link", "--decoder", "nowhere:make"], "--decoder nowhere:make: cannot import"),
    (["--task", "link", "--save-predictions", "p"], "link runs write no node predictions"),
    (["--task", "link", "--partition-dir", "shards"],
     "shards written before do not carry the edge split"),
    (["--task", "link", "--reorder", "rcm"], "the edge split is in the dataset's own order"),
    (["--task", "link", "--dataset", "sbm:n=6,blocks=2,p_in=0.3,p_out=0.01"], "too few"),
])
def test_bad_link_input_exits_2_with_one_line(tmp_path, argv, says):
    res = run_installed("gnnpar-train", *argv, "--epochs", "1", "--quiet", cwd=tmp_path)
    assert says in one_line(res)


def test_saved_link_model_loads_with_its_decoder(tmp_path):
    """``--save-model`` of a link run keeps encoder and decoder; the loaded pair scores as
    the run's final weights do (its test AUC recomputed from the saved model equals the
    log's), and gnnpar-predict writes its embeddings and the scores of given pairs."""
    import numpy as np
    import torch

    import gnnpar
    from gnnpar.link.metrics import auc
    from gnnpar.training.shard_source import load_graph
    from gnnpar.cli.spec import RunSpec

    train(tmp_path, *LINK, "--decoder", "mlp", "--save-model", "link.pt",
          "--log-json", "log.jsonl")
    model = gnnpar.load_model(str(tmp_path / "link.pt"))
    assert isinstance(model.decoder, torch.nn.Module)
    g = load_graph(RunSpec.of(task="link", dataset=DATA, reorder="none"))
    split = g.meta["link_split"]
    z = gnnpar.predict(model, g)  # the output rows: the embeddings pairs are scored on
    with torch.no_grad():
        score = lambda p: model.decoder(z[torch.as_tensor(p[0])],  # noqa: E731
                                        z[torch.as_tensor(p[1])]).numpy()
        got = auc(score(split.test_pos), score(split.test_neg))
    assert got == pytest.approx(records(tmp_path / "log.jsonl")[-1]["test_auc"], abs=1e-6)
    assert np.isfinite(got)
    # gnnpar-predict writes the embeddings of the graph it is given (here the whole dataset,
    # every edge in it) and the scores of given pairs, serially and on 2 ranks (the pairs:
    # the test positives, then their negatives)
    pairs = np.concatenate([split.test_pos, split.test_neg], axis=1).astype(np.int64)
    np.save(tmp_path / "pairs.npy", pairs)
    z = gnnpar.predict(model, DATA)
    with torch.no_grad():
        want = score(pairs)
    for out, extra in (("p1", []), ("p2", ["--algo", "1d-halo", "--nprocs", "2"])):
        res = run_installed("gnnpar-predict", "--model-file", "link.pt", "--dataset", DATA,
                            "--out", out, "--pairs", "pairs.npy", "--quiet", *extra,
                            cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        meta = json.load(open(tmp_path / out / "predict.json"))
        assert meta["task"] == "link" and set(meta["files"]) == {"embeddings", "scores"}
        assert meta["files"]["scores"]["shape"] == [pairs.shape[1]]
        emb = np.load(tmp_path / out / "embeddings.npy")
        assert np.abs(emb - z.numpy()).max() < 1e-5, out
        scores = np.load(tmp_path / out / "scores.npy")
        assert scores.dtype == np.float32 and scores.shape == (pairs.shape[1],)
        assert np.abs(scores - want).max() < 1e-5, out
        assert not os.path.exists(tmp_path / out / "predictions.npy")


def test_bad_pairs_exit_2_with_one_line(tmp_path):
    """``--pairs`` of the wrong shape, dtype or ids, with a node classifier, with
    ``--per-rank``; ``--embeddings`` with a link model: one line, exit 2, no output."""
    import numpy as np
    train(tmp_path, *LINK, "--epochs", "1", "--save-model", "link.pt")
    train(tmp_path, "--dataset", DATA, "--hidden", "8", "--epochs", "1", "--quiet",
          "--save-model", "node.pt")
    np.save(tmp_path / "ok.npy", np.zeros((2, 3), np.int64))
    np.save(tmp_path / "far.npy", np.array([[0, 1], [2, 160]]))
    np.save(tmp_path / "neg.npy", np.array([[0, -1], [2, 3]], np.int32))
    np.save(tmp_path / "three.npy", np.zeros((3, 4), np.int64))
    np.save(tmp_path / "float.npy", np.zeros((2, 4)))
    (tmp_path / "text.npy").write_text("0 1\n2 3\n")
    cases = [
        ("link.pt", ["--pairs", "far.npy"], "pair 1 (1, 160) names a vertex outside 0..159"),
        ("link.pt", ["--pairs", "neg.npy"], "pair 1 (-1, 3) names a vertex outside"),
        ("link.pt", ["--pairs", "three.npy"], "shape (3, 4); give a (2, K) array"),
        ("link.pt", ["--pairs", "float.npy"], "dtype float64; vertex ids must be integers"),
        ("link.pt", ["--pairs", "text.npy"], "not a .npy array"),
        ("link.pt", ["--pairs", "missing.npy"], "no such file"),
        ("link.pt", ["--pairs", "ok.npy", "--per-rank"], "drop --per-rank"),
        ("link.pt", ["--embeddings"], "its output rows are the node embeddings"),
        ("node.pt", ["--pairs", "ok.npy"], "is a node classifier"),
    ]
    for i, (model, argv, says) in enumerate(cases):  # the first through the installed script
        res = (run_installed if i == 0 else run_main)(
            "gnnpar-predict", "--model-file", model, "--dataset", DATA, "--out", "o", *argv,
            cwd=tmp_path)
        assert says in one_line(res), (argv, res.stderr)
    assert not (tmp_path / "o").exists()


DECODER = """
import torch


class Bilinear(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.w = torch.nn.Parameter(torch.eye(width) + 0.1)

    def forward(self, zu, zv):
        return ((zu @ self.w) * zv).sum(-1)


def bilinear(width):
    return Bilinear(width)
"""


@pytest.mark.slow
def test_a_users_decoder(tmp_path):
    """``--decoder package.module:factory`` from the working folder: trained on one process and
    on 2 ranks alike, saved and loaded back with the model."""
    import gnnpar
    (tmp_path / "mydec.py").write_text(DECODER)
    argv = [*LINK, "--decoder", "mydec:bilinear"]
    train(tmp_path, *argv, "--log-json", "s.jsonl", "--save-model", "m.pt")
    train(tmp_path, *argv, "--algo", "1d-halo", "--nprocs", "2", "--log-json", "d.jsonl")
    a, b = records(tmp_path / "s.jsonl"), records(tmp_path / "d.jsonl")
    assert a[-1]["decoder"] == "mydec:bilinear"
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
    here = os.getcwd()
    try:
        os.chdir(tmp_path)  # the factory is imported from the working folder, as in training
        assert type(gnnpar.load_model("m.pt").decoder).__name__ == "Bilinear"
    finally:
        os.chdir(here)


@pytest.mark.slow
def test_link_run_resumes_bit_for_bit(tmp_path):
    """Checkpoints keep the decoder and optimiser with the encoder; the negatives are keyed
    by epoch: 2 + 2 resumed epochs (on 2 ranks, with dropout) log what 4 unbroken ones do."""
    argv = ["--task", "link", "--dataset", DATA, "--hidden", "8", "--dropout", "0.3",
            "--neg-ratio", "2", "--decoder", "mlp", "--algo", "1d-halo", "--nprocs", "2",
            "--quiet"]
    train(tmp_path, *argv, "--epochs", "4", "--log-json", "whole.jsonl")
    train(tmp_path, *argv, "--epochs", "2", "--checkpoint-dir", "ck", "--log-json", "cut.jsonl")
    train(tmp_path, *argv, "--epochs", "4", "--checkpoint-dir", "ck", "--resume",
          "--log-json", "cut.jsonl")
    whole, cut = records(tmp_path / "whole.jsonl"), records(tmp_path / "cut.jsonl")
    assert [r["epoch"] for r in cut[:-1]] == [0, 1, 2, 3]
    for a, b in zip(whole, cut):
        assert a["loss"] == b["loss"]
        assert all(a[k] == b[k] for k in METRICS)
    res = run_installed("gnnpar-train", *argv, "--epochs", "4", "--checkpoint-dir", "ck",
                        "--resume", "--neg-ratio", "3", cwd=tmp_path)
    assert res.returncode == 2 and "neg_ratio" in res.stderr, res.stderr[-2000:]
