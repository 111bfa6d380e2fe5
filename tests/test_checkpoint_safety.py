"""Never lose a user's data: a checkpoint folder belongs to one run identity, is locked by the
run writing it, rotation touches only that run's verified checkpoints, and every refusal is
exit 2 with one line before any work (``gnnpar.training.resume``, ``gnnpar.training.checkpoint``)."""
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import warnings

import pytest
import torch

import gnnpar.training.shard_source
from gnnpar.training.checkpoint import (MAGIC, CheckpointWarning, file_name, list_steps, rank_dir,
                                        read_verified, save_checkpoint)
from gnnpar.cli.cli_common import run_cli
from gnnpar.datasets import InputError
from gnnpar.train import main

from .cli_util import ROOT

DATA = ["--dataset", "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02", "--quiet"]


def train(*argv):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        return main([*DATA, *argv])


def err_line(capsys):
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def steps(ck, rank=0):
    return sorted(list_steps(rank_dir(str(ck), rank)))


def write_raw(path, meta, step, payload_obj):
    """A checkpoint file with a valid checksum around ``payload_obj`` (pickled as is)."""
    buf = io.BytesIO()
    torch.save(payload_obj, buf)
    payload = buf.getvalue()
    header = {"step": step, "nbytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
              "meta": meta, "torch": torch.__version__}
    with open(path, "wb") as fh:
        fh.write(MAGIC + json.dumps(header).encode() + b"\n" + payload)


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/gnnpar-evil-ran-safety",))


def no_work(monkeypatch):
    """Fail the test if the run gets as far as loading its data."""
    def boom(*a, **k):
        raise AssertionError("the run started working before refusing its checkpoint folder")
    monkeypatch.setattr(gnnpar.training.shard_source, "load_dataset", boom)


# ------------------------------------------------------------------ item 2: rotation
def test_rotation_never_counts_or_deletes_junk_or_other_runs(tmp_path):
    d = str(tmp_path)
    junk = {}
    for s in (91, 92, 93):  # named like checkpoints, but not gnnpar's
        junk[s] = os.urandom(64)
        (tmp_path / file_name(s)).write_bytes(junk[s])
    other = {"seed": 1}
    for s in (50, 51, 52, 53):  # intact, but another run's
        save_checkpoint(d, {"s": s}, s, keep=10, meta=other)
    mine = {"seed": 0}
    for s in range(6):
        save_checkpoint(d, {"s": s}, s, keep=3, meta=mine)
    assert list_steps(d) == [93, 92, 91, 53, 52, 51, 50, 5, 4, 3]
    for s, data in junk.items():
        assert (tmp_path / file_name(s)).read_bytes() == data


def test_rotation_keeps_the_file_just_written(tmp_path):
    """A shorter run of the same folder used to lose each new checkpoint as it wrote it."""
    d = str(tmp_path)
    for s in (10, 11, 12):
        save_checkpoint(d, {"s": s}, s, keep=3, meta={"seed": 0})
    save_checkpoint(d, {"s": 0}, 0, keep=3, meta={"seed": 0})
    assert list_steps(d) == [12, 11, 0]  # the new one and the 2 newest others
    save_checkpoint(d, {"s": 1}, 1, keep=1, meta={"seed": 5})  # another run: counts alone
    assert list_steps(d) == [12, 11, 1, 0]


def test_save_sets_aside_a_foreign_file_instead_of_overwriting_it(tmp_path):
    path = tmp_path / file_name(4)
    path.write_bytes(b"user data")
    with pytest.warns(CheckpointWarning, match="not-overwritten"):
        save_checkpoint(str(tmp_path), {"a": 1}, 4, meta={"seed": 0})
    assert (tmp_path / (file_name(4) + ".not-overwritten")).read_bytes() == b"user data"
    assert read_verified(str(path))[0]["meta"] == {"seed": 0}


def test_resume_with_junk_checkpoint_names_keeps_real_checkpoints(tmp_path):
    ck = tmp_path / "ck"
    assert train("--epochs", "3", "--checkpoint-dir", str(ck)) == 0
    junk = {}
    for s in (91, 92, 93):
        junk[s] = os.urandom(100)
        (ck / "rank-00000" / file_name(s)).write_bytes(junk[s])
    assert train("--epochs", "6", "--checkpoint-dir", str(ck), "--resume") == 0
    assert steps(ck) == [3, 4, 5, 91, 92, 93]
    for s, data in junk.items():
        assert (ck / "rank-00000" / file_name(s)).read_bytes() == data


# ------------------------------------------------------------------ item 3: ownership
def test_checkpoints_record_the_run_identity(tmp_path):
    ck = tmp_path / "ck"
    assert train("--epochs", "1", "--checkpoint-dir", str(ck), "--seed", "3", "--lr", "0.02",
                 "--weight-decay", "0.001", "--dropout", "0.25") == 0
    meta = read_verified(str(ck / "rank-00000" / file_name(0)))[0]["meta"]
    assert {"seed": 3, "lr": 0.02, "weight_decay": 0.001, "dropout": 0.25, "model": "gcn",
            "layers": 2, "hidden": 64, "world_size": 1, "algo": "serial",
            "mode": "fullbatch"}.items() <= meta.items()
    assert meta["fingerprint"]
    marker = json.loads((ck / ".gnnpar-owner.json").read_text())
    assert marker["kind"] == "checkpoints" and marker["identity"] == meta


def test_rerun_without_resume_is_refused_and_nothing_deleted(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert train("--epochs", "3", "--checkpoint-dir", str(ck)) == 0
    before = {p: p.read_bytes() for p in (ck / "rank-00000").iterdir()}
    capsys.readouterr()
    assert train("--epochs", "2", "--checkpoint-dir", str(ck)) == 2
    line = err_line(capsys)
    assert "--resume" in line and str(ck) in line and "already holds checkpoints" in line
    assert {p: p.read_bytes() for p in (ck / "rank-00000").iterdir()} == before


@pytest.mark.parametrize("flag, value, key", [("--seed", "1", "seed"), ("--lr", "0.05", "lr"),
                                              ("--weight-decay", "0", "weight_decay"),
                                              ("--hidden", "32", "hidden")])
def test_another_identity_is_refused_naming_the_key(tmp_path, capsys, flag, value, key):
    ck = tmp_path / "ck"
    assert train("--epochs", "2", "--checkpoint-dir", str(ck)) == 0
    capsys.readouterr()
    for resume in ([], ["--resume"]):
        assert train("--epochs", "4", "--checkpoint-dir", str(ck), flag, value, *resume) == 2
        line = err_line(capsys)
        assert "belongs to another run" in line and f"{key}:" in line, line
    assert steps(ck) == [0, 1]


def test_a_second_concurrent_run_gets_exit_2_naming_the_holder(tmp_path, capsys):
    ck, log = tmp_path / "ck", tmp_path / "a.jsonl"
    env = {**os.environ, "PYTHONPATH": ROOT}
    a = subprocess.Popen([sys.executable, "-m", "gnnpar.train", *DATA, "--epochs", "1000000",
                          "--checkpoint-dir", str(ck), "--checkpoint-every", "1000000",
                          "--log-json", str(log)],
                         cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and log.read_text().count("\n") >= 1):  # A is training
            assert a.poll() is None, a.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        capsys.readouterr()
        for resume in ([], ["--resume"]):
            assert train("--epochs", "2", "--checkpoint-dir", str(ck), *resume) == 2
            line = err_line(capsys)
            assert f"--checkpoint-dir {ck} is in use by another run (pid {a.pid})" in line, line
        assert a.poll() is None  # the first run goes on
    finally:
        a.kill()
        a.wait()
    # the holder is gone: the kernel dropped its lock, the folder is usable again
    assert train("--epochs", "1", "--checkpoint-dir", str(ck), "--resume") == 0


def test_file_not_found_during_a_run_is_an_internal_error(capsys):
    def body():
        raise FileNotFoundError(2, "No such file or directory", "/ck/rank-00000/ckpt-1.pt")
    assert run_cli(body, False, "gnnpar-x") == 1
    assert "internal error" in capsys.readouterr().err

    def bad():
        raise InputError("npz file not found: /x.npz")
    assert run_cli(bad, False, "gnnpar-x") == 2


# ------------------------------------------------------------------ item 7: damaged resume
def test_resume_with_every_checkpoint_damaged_is_exit_2(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert train("--epochs", "3", "--checkpoint-dir", str(ck)) == 0
    for s in steps(ck):
        os.truncate(ck / "rank-00000" / file_name(s), 50)
    capsys.readouterr()
    log = tmp_path / "log.jsonl"
    assert train("--epochs", "5", "--checkpoint-dir", str(ck), "--resume",
                 "--log-json", str(log)) == 2
    line = err_line(capsys)
    assert "no usable checkpoint" in line and str(ck) in line, line
    assert not log.exists()  # nothing trained


def test_payload_refused_by_the_safe_loader_falls_back_to_the_previous(tmp_path):
    ck = tmp_path / "ck"
    assert train("--epochs", "3", "--checkpoint-dir", str(ck)) == 0
    newest = ck / "rank-00000" / file_name(2)
    meta = read_verified(str(newest))[0]["meta"]
    write_raw(newest, meta, 2, {"x": Evil()})
    if os.path.exists("/tmp/gnnpar-evil-ran-safety"):
        os.unlink("/tmp/gnnpar-evil-ran-safety")
    log = tmp_path / "log.jsonl"
    with pytest.warns(CheckpointWarning, match="safe loader"):
        assert main([*DATA, "--epochs", "4", "--checkpoint-dir", str(ck), "--resume",
                     "--log-json", str(log)]) == 0
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["epoch"] for r in recs if not r.get("final")] == [2, 3]  # resumed after epoch 1
    assert not os.path.exists("/tmp/gnnpar-evil-ran-safety")
    # epoch 2 was trained again and its new checkpoint loads safely
    from gnnpar.training.checkpoint import load_step
    assert load_step(str(ck / "rank-00000"), 2).state["epoch"] == 2


def test_only_refused_payloads_is_exit_2(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert train("--epochs", "1", "--checkpoint-dir", str(ck)) == 0
    only = ck / "rank-00000" / file_name(0)
    write_raw(only, read_verified(str(only))[0]["meta"], 0, {"x": Evil()})
    capsys.readouterr()
    assert train("--epochs", "3", "--checkpoint-dir", str(ck), "--resume") == 2
    line = err_line(capsys)
    assert "no usable checkpoint" in line and "safe loader" in line, line


def test_resume_on_a_new_folder_starts_fresh(tmp_path):
    ck = tmp_path / "new"
    assert train("--epochs", "2", "--checkpoint-dir", str(ck), "--resume") == 0
    assert steps(ck) == [0, 1]


def test_two_ranks_agree_to_fall_back_when_one_rank_newest_is_refused(tmp_path):
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    dist = ["--algo", "1d-halo", "--nprocs", "2", "--partitioner", "random",
            "--partition-dir", str(tmp_path / "shards")]
    assert train(*dist, "--epochs", "3", "--checkpoint-dir", str(ck)) == 0
    newest = ck / "rank-00001" / file_name(2)
    write_raw(newest, read_verified(str(newest))[0]["meta"], 2, {"x": Evil()})
    assert train(*dist, "--epochs", "4", "--checkpoint-dir", str(ck), "--resume",
                 "--log-json", str(log)) == 0
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["epoch"] for r in recs if not r.get("final")] == [2, 3]


def test_two_ranks_one_rank_all_damaged_is_exit_2(tmp_path, capfd):
    ck = tmp_path / "ck"
    dist = ["--algo", "1d-halo", "--nprocs", "2", "--partitioner", "random",
            "--partition-dir", str(tmp_path / "shards")]
    assert train(*dist, "--epochs", "2", "--checkpoint-dir", str(ck)) == 0
    for s in steps(ck, 1):
        os.truncate(ck / "rank-00001" / file_name(s), 10)
    capfd.readouterr()
    assert train(*dist, "--epochs", "4", "--checkpoint-dir", str(ck), "--resume") == 2
    assert "no usable checkpoint" in capfd.readouterr().err


# ------------------------------------------------------------------ item 8: checked up front
def test_checkpoint_dir_that_is_a_file_is_refused_before_any_work(tmp_path, capsys,
                                                                 monkeypatch):
    f = tmp_path / "afile"
    f.write_text("mine")
    no_work(monkeypatch)
    for path in (f, f / "sub"):
        assert main([*DATA, "--epochs", "2", "--checkpoint-dir", str(path)]) == 2
        assert "--checkpoint-dir" in err_line(capsys)
    assert f.read_text() == "mine"


def test_unwritable_checkpoint_dir_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    d = tmp_path / "ro"
    d.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if os.fspath(p) == str(d)
                        else real(p, m, *a, **k))
    no_work(monkeypatch)
    assert main([*DATA, "--epochs", "2", "--checkpoint-dir", str(d)]) == 2
    assert "no permission" in err_line(capsys)


def test_folder_with_foreign_files_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    d = tmp_path / "thesis"
    d.mkdir()
    (d / "chapter1.tex").write_text("precious")
    (d / "rank-00000").mkdir()
    (d / "rank-00000" / file_name(1)).write_text("also precious")
    no_work(monkeypatch)
    for resume in ([], ["--resume"]):
        assert main([*DATA, "--epochs", "2", "--checkpoint-dir", str(d), *resume]) == 2
        assert "gnnpar did not write" in err_line(capsys)
    assert sorted(os.listdir(d)) == ["chapter1.tex", "rank-00000"]
    assert (d / "rank-00000" / file_name(1)).read_text() == "also precious"


def test_rerun_and_other_identity_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """A rerun without --resume, and a run whose flags give another identity, are refused in
    the argument checks: before the dataset is loaded (or shards written, ranks spawned)."""
    ck = tmp_path / "ck"
    assert main([*DATA, "--epochs", "2", "--checkpoint-dir", str(ck)]) == 0
    capsys.readouterr()
    no_work(monkeypatch)
    assert main([*DATA, "--epochs", "3", "--checkpoint-dir", str(ck)]) == 2
    assert "already holds checkpoints" in err_line(capsys)
    assert main([*DATA, "--epochs", "3", "--checkpoint-dir", str(ck), "--resume",
                 "--lr", "0.5"]) == 2
    assert "belongs to another run" in err_line(capsys)


def test_checkpoint_folder_of_an_older_gnnpar_is_named_as_such(tmp_path, capsys, monkeypatch):
    ck = tmp_path / "old"
    (ck / "rank-00000").mkdir(parents=True)
    (ck / "rank-00000" / "ckpt-000000001.pt").write_bytes(b"x")
    no_work(monkeypatch)
    assert main([*DATA, "--epochs", "3", "--checkpoint-dir", str(ck), "--resume"]) == 2
    assert "older gnnpar" in err_line(capsys)
    assert (ck / "rank-00000" / "ckpt-000000001.pt").read_bytes() == b"x"


def test_resuming_a_finished_run_keeps_its_log(tmp_path, capsys):
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    assert main([*DATA, "--epochs", "2", "--checkpoint-dir", str(ck), "--log-json", str(log)]) == 0
    before = log.read_text()
    # a requeued finished run finishes again (exit 0) and leaves the same log
    assert main([*DATA, "--epochs", "2", "--checkpoint-dir", str(ck), "--log-json", str(log),
                 "--resume"]) == 0
    assert log.read_text() == before
