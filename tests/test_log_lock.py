"""One writer per ``--log-json`` (issue 23, defect 4): a second run on a log that a live run
writes exits 2 naming the holder, before any work, and the first run's log stays whole.

The race test pairs the test process with one warm worker process (it runs
``gnnpar.train.main`` in-process on command), so 24 rounds of two concurrent runs with random
offsets stay affordable."""
import json
import os
import random
import subprocess
import sys
import threading
import time

import pytest

import gnnpar.training.shard_source
from gnnpar.training.logged import LogLock, lock_folder
from gnnpar.train import main

from .cli_util import ROOT

DATA = ["--dataset", "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02", "--quiet"]
EPOCHS = 4


def no_work(monkeypatch):
    """Fail the test if the run gets as far as loading its data."""
    def boom(*a, **k):
        raise AssertionError("the run started working before refusing its busy log")
    monkeypatch.setattr(gnnpar.training.shard_source, "load_dataset", boom)


@pytest.mark.parametrize("extra", [[], ["--algo", "1d-halo", "--nprocs", "2"],
                                   ["--checkpoint-dir", "CK", "--resume"]])
def test_a_busy_log_is_exit_2_naming_the_holder_before_any_work(tmp_path, capsys, monkeypatch,
                                                                extra):
    log = tmp_path / "log.jsonl"
    log.write_text('{"epoch": 0}\n')
    extra = [str(tmp_path / "ck") if a == "CK" else a for a in extra]
    held = LogLock(str(log))  # a live run's lock (flock: per open file, so also in-process)
    try:
        no_work(monkeypatch)
        assert main([*DATA, "--epochs", "2", "--log-json", str(log), *extra]) == 2
        err = capsys.readouterr().err
        assert f"--log-json {log} is being written by another run (pid {os.getpid()})" in err
        assert log.read_text() == '{"epoch": 0}\n'
        assert os.path.isdir(lock_folder(str(log)))  # the refused run left the holder's lock
    finally:
        held.release()
    assert not os.path.exists(lock_folder(str(log)))  # the holder removes its lock folder
    monkeypatch.undo()
    if not extra:  # the holder is gone: the log is free again
        assert main([*DATA, "--epochs", "2", "--log-json", str(log)]) == 0
        assert sorted(os.listdir(tmp_path)) == ["log.jsonl"]  # and no lock folder stays


def test_a_log_that_is_no_file_is_not_locked(tmp_path):
    assert LogLock(os.devnull).lock is None
    LogLock(os.devnull).release()
    assert not os.path.exists(lock_folder(str(tmp_path / "never.jsonl")))


WORKER = r"""
import contextlib, io, json, sys, warnings
from gnnpar.train import main
warnings.simplefilter("ignore")
main(json.loads(sys.argv[1]))  # warm: imports and the first run's set-up
print("ready", flush=True)
for line in sys.stdin:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(json.loads(line))
        except SystemExit as e:
            rc = e.code
    print(json.dumps({"rc": rc, "err": err.getvalue()}), flush=True)
"""


class Worker:
    """A warm Python process that runs ``main(argv)`` for each line sent to it."""

    def __init__(self, warm_argv):
        self.p = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(warm_argv)],
                                  cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ready(self):
        assert self.p.stdout.readline().strip() == "ready"

    def send(self, argv):
        self.p.stdin.write(json.dumps(argv) + "\n")
        self.p.stdin.flush()

    def result(self) -> dict:
        line = self.p.stdout.readline()
        assert line, "the worker died"
        return json.loads(line)

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def check_log(log):
    """No NUL byte, every line strict JSON, the epochs once in order, then one final record."""
    data = log.read_bytes()
    assert b"\0" not in data
    recs = [json.loads(ln) for ln in data.decode().splitlines()]
    assert [r.get("epoch") for r in recs[:-1]] == list(range(EPOCHS)), recs
    assert recs[-1].get("final") is True and recs[-1]["epochs"] == EPOCHS


def test_two_runs_started_together_on_one_log_never_corrupt_it(tmp_path, capsys):
    """24 rounds of two runs on one log — this process and a warm worker process, the later
    started at a random offset within a run's time: either both finish one after the other,
    or one exits 2 naming the other's pid and the log is exactly the winner's."""
    worker = Worker([*DATA, "--epochs", "1", "--log-json", str(tmp_path / "warm.jsonl")])
    try:
        assert main([*DATA, "--epochs", "1"]) == 0  # warm this process meanwhile
        worker.ready()
        t0 = time.monotonic()
        worker.send([*DATA, "--epochs", str(EPOCHS), "--log-json", str(tmp_path / "c.jsonl")])
        assert worker.result()["rc"] == 0
        run_s = time.monotonic() - t0
        rng = random.Random(4)
        refused = 0
        for i in range(24):
            log = tmp_path / f"log{i}.jsonl"
            argv = [*DATA, "--epochs", str(EPOCHS), "--log-json", str(log)]
            delay = rng.uniform(0.0, 0.8 * run_s)
            capsys.readouterr()
            if rng.random() < 0.5:  # the worker first
                worker.send(argv)
                time.sleep(delay)
                mine = main(argv)
            else:  # this process first, the worker from a timer
                timer = threading.Timer(delay, worker.send, (argv,))
                timer.start()
                mine = main(argv)
                timer.join()
            theirs = worker.result()
            assert sorted([mine, theirs["rc"]]) in ([0, 0], [0, 2]), (mine, theirs)
            if theirs["rc"] == 2:
                refused += 1
                assert (f"--log-json {log} is being written by another run "
                        f"(pid {os.getpid()})") in theirs["err"], theirs["err"]
            if mine == 2:
                refused += 1
                err = capsys.readouterr().err
                assert (f"--log-json {log} is being written by another run "
                        f"(pid {worker.p.pid})") in err, err
            check_log(log)
            assert not os.path.exists(lock_folder(str(log)))  # both runs ended: none left
        assert refused >= 3, f"only {refused} of 24 rounds overlapped"
    finally:
        worker.close()
