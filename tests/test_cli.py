"""gnnpar-train end to end: JSON log schema, determinism, saved model, exit codes and
one-line errors for bad input, reserved flags, and the package importing from anywhere."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from gnnpar.train import main

from .cli_util import ROOT, run_train as run_cli
SMALL = "sbm:n=300,blocks=3,p_in=0.05,p_out=0.005,feat=8,seed=1"
EPOCH_KEYS = {"epoch", "loss", "train_acc", "val_acc", "test_acc", "epoch_s", "compute_s",
              "comm_s", "comm_bytes", "comm_bytes_max_rank", "peak_mem_bytes", "algo",
              "world_size", "grid"}


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_log_schema_determinism_and_save(tmp_path):
    logs = []
    for i in range(2):
        path = tmp_path / f"log{i}.jsonl"
        assert main(["--dataset", SMALL, "--epochs", "4", "--quiet", "--log-json", str(path),
                     "--save-model", str(tmp_path / "m.pt")]) == 0
        logs.append(read_log(path))
    recs, final = logs[0][:-1], logs[0][-1]
    assert len(recs) == 4 and all(EPOCH_KEYS <= set(r) for r in recs)
    assert [r["epoch"] for r in recs] == [0, 1, 2, 3]
    assert final["final"] is True and final["epochs"] == 4
    assert final["loss"] == recs[-1]["loss"]
    # same seed -> identical loss curve
    assert [r["loss"] for r in logs[0][:-1]] == [r["loss"] for r in logs[1][:-1]]
    saved = torch.load(tmp_path / "m.pt", weights_only=True)
    assert saved["model"] == "gcn" and "layers.0.lin.weight" in saved["state_dict"]


def test_default_dataset_learns():
    r = run_cli("--epochs", "60", "--quiet", "--log-json", "/dev/stdout")
    assert r.returncode == 0, r.stderr
    final = json.loads(r.stdout.strip().splitlines()[-1])
    assert final["test_acc"] > 0.85


@pytest.mark.parametrize("argv,needle", [
    (["--dataset", "npz:/no/such/file.npz"], "not found"),
    (["--dataset", "rmat:scale=5,ef=2,colour=3"], "colour"),
    (["--dataset", "rmat:scale=-3,ef=2"], "scale"),
    (["--dataset", "nope:x=1"], "nope"),
    (["--epochs", "-1"], "--epochs"),
    (["--hidden", "0"], "--hidden"),
    (["--dropout", "1.5"], "--dropout"),
    (["--resume"], "--checkpoint-dir"),
    (["--profile", "7", "--epochs", "3"], "--profile"),
    (["--checkpoint-dir", "/tmp/x", "--checkpoint-every", "0"], "--checkpoint-every"),
    (["--algo", "1d"], "--nprocs"),
    (["--device", "cuda"] if not torch.cuda.is_available() else ["--layers", "0"], "cuda" if not torch.cuda.is_available() else "--layers"),
    (["--algo", "2d", "--nprocs", "3"], "--grid"),
    (["--algo", "2d", "--nprocs", "4", "--grid", "3x2"], "world size"),
    (["--algo", "1.5d", "--nprocs", "4", "--replication", "3"], "replication"),
])
def test_bad_input_one_line_exit_2(argv, needle):
    r = run_cli(*argv, "--quiet")
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle.lower() in lines[0].lower()


def test_npz_errors_and_debug_traceback(tmp_path):
    n = 10
    bad = tmp_path / "bad.npz"
    np.savez(bad, edge_index=np.array([[0, 1], [1, 99]]), x=np.zeros((n, 2), np.float32),
             y=np.zeros(n, np.int64), train_mask=np.ones(n, bool), val_mask=np.ones(n, bool),
             test_mask=np.ones(n, bool))
    r = run_cli("--dataset", f"npz:{bad}", "--quiet")
    assert r.returncode == 2 and "99" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("--dataset", f"npz:{bad}", "--quiet", "--debug")
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_imports_from_another_folder_and_regular_install(tmp_path):
    """Flat layout: gnnpar.kernels must resolve from the checkout and from a real install, and
    a real install holds every module of the checkout (a package missing from setup.cfg's
    list is left out of a wheel) and imports each console script's module."""
    code = "import gnnpar.kernels.local, gnnpar.datasets.graph, gnnpar.partitioners.partition; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.stdout.strip() == "ok", r.stderr
    target, src = tmp_path / "site", tmp_path / "src"
    # from a copy without the checkout's build/ folder, whose stale files setuptools would reuse
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".venv", "*.npy", "*.pt"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"pip could not build the package here: {r.stderr.strip()[-200:]}")
    assert (target / "gnnpar" / "kernels" / "local.py").exists()
    assert not (target / "kernels").exists() and not (target / "datasets").exists()
    homes = {"gnnpar": "gnnpar", "kernels": "gnnpar/kernels",
             "partitioners": "gnnpar/partitioners", "datasets": "gnnpar/datasets"}
    for top, installed_at in homes.items():
        for src in pathlib.Path(ROOT, top).rglob("*.py"):
            rel = src.relative_to(pathlib.Path(ROOT, top))
            assert (target / installed_at / rel).exists(), f"{top}/{rel} is not installed"
    scripts = ["gnnpar.train", "gnnpar.cli.partition_cli", "gnnpar.cli.plan_cli", "gnnpar.cli.report",
               "gnnpar.predict"]
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = subprocess.run([sys.executable, "-c", code + "; import gnnpar; print(gnnpar.__file__)"
                        + "".join(f"; import {m}" for m in scripts)],
                       cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.stdout.splitlines()[0] == "ok", r.stderr
    assert str(target) in r.stdout


def test_profile_writes_a_trace_of_the_chosen_epoch(tmp_path):
    assert main(["--dataset", SMALL, "--epochs", "3", "--quiet", "--profile", "1",
                 "--profile-dir", str(tmp_path)]) == 0
    trace = json.loads((tmp_path / "profile-epoch1-rank0.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any("mm" in n for n in names)  # the epoch's matrix products were recorded
    assert main(["--dataset", SMALL, "--epochs", "3", "--quiet", "--profile", "5"]) == 2


def test_help_states_each_default_once():
    """A flag whose help states its own default (``--macrobatch``, ``--prefetch``: parser
    default None) does not also get argparse's "(default: None)"; one that does not
    (``--dropout``) still gets the parser's default appended."""
    from gnnpar.cli.options import build_parser
    text = " ".join(build_parser().format_help().split())
    assert "1 where the device may) --sampler-workers" in text
    assert "else one per sampler worker) --cache-frac" in text
    assert "(default: None)" not in text.split("--macrobatch", 1)[1].split("--cache-frac")[0]
    assert "dropout probability (default: 0.5)" in text
