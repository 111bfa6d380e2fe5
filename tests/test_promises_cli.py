"""Promises of the README that the installed ``gnnpar-train`` keeps (issue 40, defects 1, 5,
7, 8 and 9), each run as a user runs it: the console script, from a temporary working
directory, no ``PYTHONPATH``.

1. ``--model my_gnn:gin`` imports ``my_gnn.py`` from the working directory (serially, in
   ``--nprocs`` ranks and in ``mpirun`` ranks);
5. a module that fails at import is exit 2 with one line naming the exception;
7. ``--log-json`` leaves no lock folder behind, however the run ends;
8. a GAT's heads and attention dropout are recorded resolved, so ``--resume`` with the
   defaults spelled out is the same run and ``--save-model`` names its heads;
9. ``--timeout`` has a range (exit 2, one line) instead of overflowing in every rank.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from gnnpar.training.checkpoint import MAGIC
from gnnpar.training.logged import lock_folder
from gnnpar.cli.options import build_parser
from gnnpar.train import main

from .cli_util import doc_text, installed, readme_gin, run_installed
from .required import mpirun

TINY = "sbm:n=90,blocks=3,p_in=0.15,p_out=0.02"
BASE = ["--dataset", TINY, "--hidden", "8", "--quiet"]
#: the longest --timeout (seconds): a week
MAX_TIMEOUT_S = 7 * 24 * 3600


def train(cwd, *argv, **kw):
    return run_installed("gnnpar-train", *argv, cwd=cwd, **kw)


def one_line(res, code=2) -> str:
    """The single stderr line of a run that exited ``code``."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == code and len(lines) == 1, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr
    return lines[0]


@pytest.fixture
def user_dir(tmp_path):
    """A working directory holding the README's ``my_gnn.py``."""
    (tmp_path / "my_gnn.py").write_text(readme_gin())
    return tmp_path


# ---------------------------------------------------------------- 1. --model from the cwd
@pytest.mark.parametrize("run", [[], ["--algo", "1d-halo", "--nprocs", "2"]],
                         ids=["serial", "nprocs2"])
def test_readme_model_trains_from_its_folder_through_the_console_script(user_dir, run):
    log = user_dir / "log.jsonl"
    res = train(user_dir, *BASE, "--model", "my_gnn:gin", "--epochs", "2",
                "--log-json", str(log), *run)
    assert res.returncode == 0, res.stderr[-3000:]
    final = json.loads(log.read_text().splitlines()[-1])
    assert final["final"] and final["epochs"] == 2 and final["loss"] is not None


def test_readme_model_trains_under_mpirun_through_the_console_script(user_dir):
    """Every mpirun rank is a ``gnnpar-train`` of its own, in mpirun's working directory."""
    log = user_dir / "log.jsonl"
    res = train(user_dir, *BASE, "--model", "my_gnn:gin", "--epochs", "2", "--algo", "1d",
                "--log-json", str(log), launcher=[mpirun(), "-n", "2"],
                env={"TORCH_CPP_LOG_LEVEL": "ERROR"})
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    final = json.loads(log.read_text().splitlines()[-1])
    assert final["final"] and final["world_size"] == 2


def test_a_module_in_the_cwd_can_import_its_neighbours_later(tmp_path, monkeypatch):
    """The working directory stays reachable after ``--model``'s import: a factory that
    imports a sibling module when it is called (not at import) finds it."""
    from gnnpar.nn.custom_model import build_custom
    (tmp_path / "lazy_gnn_x1.py").write_text(
        "def gin(*args):\n    from my_gnn_x1 import gin as real\n    return real(*args)\n")
    (tmp_path / "my_gnn_x1.py").write_text(readme_gin())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for name in ("lazy_gnn_x1", "my_gnn_x1"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    model = build_custom("lazy_gnn_x1:gin", 5, 8, 3, 2, 0.0)
    assert type(model).__name__ == "GIN" and model.norm == "sum"


# ---------------------------------------------------------------- 5. a module that raises
@pytest.mark.parametrize("source,needles", [
    ("def gin(:\n    pass\n", ("SyntaxError", "bad_gnn.py:1")),
    ("import torch\nraise ValueError('no GPU here')\n", ("ValueError: no GPU here",)),
    ("import no_such_dependency_xyz\n",
     ("ModuleNotFoundError", "No module named 'no_such_dependency_xyz'")),
], ids=["syntax", "raises", "missing-dependency"])
def test_a_module_that_fails_at_import_is_exit_2_with_one_line(tmp_path, source, needles):
    (tmp_path / "bad_gnn.py").write_text(source)
    line = one_line(train(tmp_path, *BASE, "--model", "bad_gnn:gin", "--epochs", "1"))
    assert line.startswith("gnnpar-train: error: --model bad_gnn:gin: "), line
    assert all(n in line for n in needles), line
    assert "put its folder on PYTHONPATH" not in line  # it was found: the advice would mislead


# ---------------------------------------------------------------- 7. the log's lock folder
#: rank 1 raises in its first forward while rank 0 is still at work (asleep), so the parent
#: kills rank 0 (SIGKILL): the lead rank cannot remove its own lock folder
RAISES_ON_RANK_1 = """
import time
import torch, torch.distributed as dist

class Lin(torch.nn.Module):
    norm = "mean"
    def __init__(self, f_in, f_out):
        super().__init__()
        self.lin = torch.nn.Linear(f_in, f_out)
    def forward(self, ops, x):
        if dist.is_initialized() and dist.get_rank() == 1:
            raise RuntimeError("rank 1 breaks")
        if dist.is_initialized():
            time.sleep(120)
        return self.lin(ops[0](x))

def make(f_in, hidden, f_out, layers, dropout):
    return Lin(f_in, f_out)
"""


@pytest.mark.parametrize("log,argv,code", [
    ("log.jsonl", [], 0),
    ("log.jsonl", ["--resume"], 2),  # refused after the log was checked (no --checkpoint-dir)
    ("new/log.jsonl", ["--resume"], 2),  # nor the log's folder
    ("log.jsonl", ["--lr", "1e30", "--epochs", "4"], 4),  # diverged
    ("log.jsonl", ["--model", "breaks:make", "--algo", "1d", "--nprocs", "2"], 1),  # a rank
], ids=["ok", "refused", "refused-new-folder", "diverged", "rank-failed"])
def test_no_lock_folder_is_left_beside_the_log(tmp_path, log, argv, code):
    (tmp_path / "breaks.py").write_text(RAISES_ON_RANK_1)
    res = train(tmp_path, "--dataset", "sbm:n=300,blocks=3,p_in=0.05,p_out=0.005,feat=8",
                "--hidden", "8", "--quiet", "--epochs", "2", "--log-json", str(tmp_path / log),
                *argv)
    assert res.returncode == code, res.stderr[-3000:]
    left = sorted(os.path.relpath(os.path.join(d, f), tmp_path)
                  for d, dirs, files in os.walk(tmp_path) for f in dirs + files
                  if "__pycache__" not in os.path.join(d, f))  # breaks.py's, if compiled
    assert left == sorted(["breaks.py"] + ([log] if code != 2 else [])), left


def test_no_lock_folder_is_left_after_sigterm(tmp_path):
    log = tmp_path / "log.jsonl"
    p = subprocess.Popen([installed("gnnpar-train"), *BASE, "--epochs", "100000",
                          "--log-json", str(log)], cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text().count("\n") >= 2):  # training is under way
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()
        time.sleep(0.05)
    assert os.path.isdir(lock_folder(str(log)))  # held while the run lives
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert p.returncode in (-signal.SIGTERM, 143), p.returncode
    assert os.listdir(tmp_path) == ["log.jsonl"]


def test_a_stale_lock_folder_neither_blocks_nor_stays(tmp_path):
    """A killed run's folder (its lock file names a pid that is gone, no flock held): the next
    run takes the log and removes the folder when it ends."""
    log = tmp_path / "log.jsonl"
    folder = lock_folder(str(log))
    os.makedirs(folder)
    with open(os.path.join(folder, ".gnnpar-lock"), "w") as f:
        f.write("999999999 elsewhere\n")
    res = train(tmp_path, *BASE, "--epochs", "1", "--log-json", str(log))
    assert res.returncode == 0, res.stderr[-3000:]
    assert os.listdir(tmp_path) == ["log.jsonl"]


# ---------------------------------------------------------------- 8. a GAT's resolved settings
GAT = [*BASE, "--model", "gat", "--dropout", "0.3"]


def test_resume_of_a_gat_with_its_defaults_spelled_out(tmp_path):
    ck = str(tmp_path / "ck")
    first = train(tmp_path, *GAT, "--epochs", "1", "--checkpoint-dir", ck)
    assert first.returncode == 0, first.stderr[-3000:]
    again = train(tmp_path, *GAT, "--epochs", "2", "--checkpoint-dir", ck, "--resume",
                  "--heads", "8", "--attn-dropout", "0.3")
    assert again.returncode == 0, again.stderr[-3000:]


def test_save_model_records_a_gats_heads_resolved(tmp_path):
    path = tmp_path / "gat.pt"
    res = train(tmp_path, *GAT, "--epochs", "1", "--save-model", str(path))
    assert res.returncode == 0, res.stderr[-3000:]
    saved = torch.load(path, weights_only=True)
    assert saved["heads"] == 8 and saved["attn_dropout"] == pytest.approx(0.3, abs=0)


def _as_old_gnnpar_wrote_it(ck):
    """Rewrite a checkpoint folder's identity (marker and every header) as gnnpar recorded a
    GAT before its settings were resolved: heads and attn_dropout None."""
    marker = os.path.join(ck, ".gnnpar-owner.json")
    claim = json.load(open(marker))
    claim["identity"].update(heads=None, attn_dropout=None)
    json.dump(claim, open(marker, "w"))
    for rank in os.listdir(ck):
        folder = os.path.join(ck, rank)
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            path = os.path.join(folder, name)
            data = open(path, "rb").read()
            end = data.index(b"\n", len(MAGIC))
            header = json.loads(data[len(MAGIC):end])
            header["meta"].update(heads=None, attn_dropout=None)
            open(path, "wb").write(MAGIC + json.dumps(header, sort_keys=True).encode()
                                   + data[end:])


@pytest.mark.parametrize("flags,code", [
    ([], 0), (["--heads", "8", "--attn-dropout", "0.3"], 0),
    (["--heads", "4"], 2),  # None meant 8: another run
], ids=["defaults", "spelled-out", "other-heads"])
def test_an_old_gat_checkpoint_with_none_resumes_as_the_defaults(tmp_path, flags, code):
    ck = str(tmp_path / "ck")
    assert train(tmp_path, *GAT, "--epochs", "1", "--checkpoint-dir", ck).returncode == 0
    _as_old_gnnpar_wrote_it(ck)
    again = train(tmp_path, *GAT, "--epochs", "2", "--checkpoint-dir", ck, "--resume", *flags)
    if code == 2:
        assert "heads: folder has None, this run 4" in one_line(again), again.stderr
        return
    assert again.returncode == 0, again.stderr[-3000:]
    newest = open(os.path.join(ck, "rank-00000", "ckpt-000000001.pt"), "rb").read()
    header = json.loads(newest[len(MAGIC):newest.index(b"\n", len(MAGIC))])
    assert header["meta"]["heads"] is None  # the folder keeps the identity it has


# ---------------------------------------------------------------- 9. --timeout's range
def test_a_huge_timeout_is_exit_2_with_one_line(tmp_path):
    line = one_line(train(tmp_path, *BASE, "--epochs", "1", "--algo", "1d", "--nprocs", "2",
                          "--timeout", "1e300"))
    assert f"--timeout must be at most {MAX_TIMEOUT_S:,}" in line, line


@pytest.mark.parametrize("value", ["1e300", str(MAX_TIMEOUT_S + 1), "inf", "nan", "0", "-5"])
def test_timeout_outside_its_range_is_refused_before_any_work(value, capsys, no_work):
    assert main([*BASE, "--epochs", "1", "--timeout", value]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--timeout must be" in err, err


def test_timeout_range_is_in_help_and_guide():
    help_text = " ".join(build_parser().format_help().split())
    assert f"at most {MAX_TIMEOUT_S:,}" in help_text
    guide = " ".join(doc_text("guide.md").split())
    assert f"`--timeout` 0–{MAX_TIMEOUT_S:,} s" in guide
