"""Operations, end to end through gnnpar-train: exact resume after SIGKILL of the whole job,
a checkpoint on SIGTERM, a rank killed mid-epoch (named, nothing left behind), and mpirun
giving the same loss curve as --nprocs."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from .cli_util import ROOT
from .required import mpirun
from .test_spawn_liveness import ranks_of
DATA = "rmat:scale=12,ef=8,feat=16,classes=4"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def train_cmd(*argv):
    return [sys.executable, "-m", "gnnpar.train", "--dataset", DATA, "--hidden", "32",
            "--quiet", *argv]


def run(*argv, timeout=300):
    r = subprocess.run(train_cmd(*argv), cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r


def weights(path):
    return torch.load(path, weights_only=True)["state_dict"]


def assert_bitwise_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def newest_epoch(ckdir, ranks):
    """Newest checkpoint epoch every rank holds (-1 if some rank has none yet)."""
    steps = []
    for r in range(ranks):
        files = glob.glob(os.path.join(ckdir, f"rank-{r:05d}", "ckpt-*.pt"))
        steps.append(max((int(os.path.basename(f)[5:-3]) for f in files), default=-1))
    return min(steps)


def kill_job_after(cmd, ckdir, ranks, epoch, timeout=240):
    """Start ``cmd`` in its own session; SIGKILL the whole job once every rank has the
    checkpoint of ``epoch``. Returns the newest epoch every rank holds after the kill."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout
    while newest_epoch(ckdir, ranks) < epoch:
        assert p.poll() is None, f"the run ended before epoch {epoch}: {p.stderr.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    return newest_epoch(ckdir, ranks)


@pytest.mark.parametrize("mode", [
    ["--algo", "2d", "--grid", "2x2", "--nprocs", "4"],
    ["--mode", "minibatch", "--nprocs", "2", "--fanouts", "5,5", "--batch-size", "64"],
], ids=["fullbatch-2d-p4", "minibatch-p2"])
def test_kill_and_resume_is_bitwise_exact(tmp_path, mode):
    epochs = 10
    straight, resumed = tmp_path / "straight.pt", tmp_path / "resumed.pt"
    ck = tmp_path / "ck"
    ranks = int(mode[mode.index("--nprocs") + 1])
    mode = [*mode, "--partition-dir", str(tmp_path / "shards")]  # a killed job cannot clean up
    run(*mode, "--epochs", str(epochs), "--save-model", str(straight))
    left = kill_job_after(train_cmd(*mode, "--epochs", str(epochs), "--checkpoint-dir", str(ck)),
                          str(ck), ranks, epoch=2)
    assert 2 <= left < epochs - 1  # killed mid-run, with epochs left to resume
    run(*mode, "--epochs", str(epochs), "--checkpoint-dir", str(ck), "--resume",
            "--save-model", str(resumed))
    assert_bitwise_equal(weights(straight), weights(resumed))


def test_resume_refuses_another_world_size(tmp_path):
    ck = tmp_path / "ck"
    run("--algo", "1d-halo", "--nprocs", "2", "--epochs", "2", "--checkpoint-dir", str(ck))
    shutil.copytree(ck / "rank-00000", ck / "rank-00002")
    shutil.copytree(ck / "rank-00001", ck / "rank-00003")
    r = subprocess.run(train_cmd("--algo", "1d-halo", "--nprocs", "4", "--epochs", "4",
                                 "--checkpoint-dir", str(ck), "--resume"),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "world_size" in r.stderr, r.stderr


def test_sigterm_writes_a_checkpoint_then_exits_143(tmp_path):
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    p = subprocess.Popen(train_cmd("--algo", "1d-halo", "--nprocs", "2", "--epochs", "100000",
                                   "--checkpoint-dir", str(ck), "--checkpoint-every", "1000",
                                   "--log-json", str(log)),
                         cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text().count("\n") >= 2):  # training is under way
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    assert newest_epoch(str(ck), 2) == -1  # every-1000: no regular checkpoint yet
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=120)[1]
    assert p.returncode == 143, err
    assert "preempted" in err
    assert newest_epoch(str(ck), 2) >= 0


def test_sigkill_of_one_rank_is_named_and_nothing_is_left(tmp_path):
    timeout = 20
    p = subprocess.Popen(train_cmd("--algo", "1d-halo", "--nprocs", "4", "--epochs", "100000",
                                   "--timeout", str(timeout)),
                         cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.monotonic() + 120
    victim = None
    while victim is None and time.monotonic() < deadline:
        victim = ranks_of(p).get("gnnpar-rank-2")
        time.sleep(0.1)
    assert victim is not None, "rank 2 never started"
    others = [c for c in ranks_of(p).values() if c != victim]
    time.sleep(3.0)  # mid-training
    victim.kill()
    t = time.monotonic()
    err = p.communicate(timeout=timeout + 30)[1]
    assert time.monotonic() - t < timeout + 30
    assert p.returncode != 0
    assert "rank 2" in err and "signal 9" in err, err
    gone, alive = psutil.wait_procs(others, timeout=10)
    assert not alive, f"ranks left behind: {alive}"
    assert all(q.returncode != 0 for q in gone)


def test_mpirun_matches_nprocs(tmp_path):
    launcher = mpirun()
    common = ["--algo", "1d-halo", "--epochs", "5", "--dropout", "0.5"]
    run(*common, "--nprocs", "4", "--log-json", str(tmp_path / "local.jsonl"))
    r = subprocess.run([launcher, "-n", "4", *train_cmd(*common, "--log-json",
                                                      str(tmp_path / "mpi.jsonl"))],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout[-3000:]  # mpirun names the rank that died

    def losses(name):
        return [json.loads(line)["loss"] for line in open(tmp_path / name)
                if "final" not in json.loads(line)]

    assert losses("mpi.jsonl") == losses("local.jsonl")
