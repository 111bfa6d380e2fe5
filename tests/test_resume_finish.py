"""A preempted run always finishes (issue 23, defect 3 and item 9): a SIGTERM in the last epoch,
or after the final record, exits 143, and ``--resume`` then writes the final record and the
model and exits 0, so a requeue loop ends; the final record's totals cover every segment; the
profiler prints nothing under ``--quiet``.

The signal test runs in the test process (warm: no import, no first-epoch set-up per run), so
24 rounds of real SIGTERMs at random times stay affordable."""
import json
import os
import random
import signal
import threading
import time
import warnings

import pytest
import torch

from gnnpar.training.checkpoint import CheckpointWarning
from gnnpar.train import main

DATA = ["--dataset", "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02", "--quiet"]
EPOCHS = 3


def train(*argv):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        return main([*DATA, *argv])


class Killed(BaseException):
    """What the default action of SIGTERM would do here: end the run at once."""


class Preempter:
    """SIGTERM to this process from a thread, at a random moment after the log holds
    ``after_lines`` lines; while no gnnpar handler is installed the signal raises
    :class:`Killed` in the main thread, as if the process died there (between bytecodes)."""

    def __init__(self, log, after_lines: int, delay: float):
        self.log, self.after_lines, self.delay = log, after_lines, delay
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            if self.log.exists() and self.log.read_bytes().count(b"\n") >= self.after_lines:
                if not self.stop.wait(self.delay):
                    os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.001)

    def run(self, argv) -> int:
        """``train(*argv)`` under the timer; its exit code (143 when killed)."""
        def die(signum, frame):
            raise Killed()
        old = signal.signal(signal.SIGTERM, die)
        try:
            self.thread.start()
            try:
                return train(*argv)
            except SystemExit as e:  # the gnnpar hook's exit: checkpoint written
                return e.code
            except Killed:
                return 143
            finally:
                self.stop.set()
                self.thread.join()
        except Killed:  # the signal came after the run had returned: it is over anyway
            return 143
        finally:
            signal.signal(signal.SIGTERM, old)


def records(log):
    lines = log.read_bytes().split(b"\n")
    assert lines[-1] == b"", "the log ends with a whole line"
    return [json.loads(ln) for ln in lines[:-1]]


def check_finished(log, model, reference):
    """Every epoch once, in order, then one final record covering them all; the model saved
    and bitwise the uninterrupted run's."""
    recs = records(log)
    assert [r.get("epoch") for r in recs[:-1]] == list(range(EPOCHS)), recs
    final = recs[-1]
    assert final.get("final") is True and final["epochs"] == EPOCHS, final
    assert final["loss"] == recs[-2]["loss"]
    assert final["total_s"] == pytest.approx(sum(r["epoch_s"] for r in recs[:-1]), rel=1e-9)
    saved = torch.load(model, weights_only=True)["state_dict"]
    for k, v in reference.items():
        assert torch.equal(saved[k], v), k


def test_sigterm_around_the_last_epoch_then_resume_always_finishes(tmp_path):
    """24 rounds: SIGTERM at a random moment from the start of the last epoch to shortly after
    the run's end (mid-epoch, at the checkpoint, while the final record or the model is
    written, after the handler is gone); every 143 is followed by ``--resume``, which must
    exit 0 with all outputs, bitwise the uninterrupted run's model; resuming a finished run
    exits 0 too."""
    ref = tmp_path / "ref.pt"
    assert train("--epochs", "1") == 0  # the first run in a process sets up for seconds
    t0 = time.monotonic()
    assert train("--epochs", str(EPOCHS), "--save-model", str(ref)) == 0
    reference = torch.load(ref, weights_only=True)["state_dict"]
    run_s = time.monotonic() - t0  # a warm run, set-up to saved model
    rng = random.Random(23)
    preempted = 0
    for i in range(24):
        d = tmp_path / f"r{i}"
        log, model, ck = d / "log.jsonl", d / "m.pt", d / "ck"
        every = rng.choice(["1", "2"])
        argv = ["--epochs", str(EPOCHS), "--checkpoint-dir", str(ck), "--checkpoint-every",
                every, "--log-json", str(log), "--save-model", str(model)]
        rc = Preempter(log, EPOCHS - 1, rng.uniform(0.0, 0.7 * run_s)).run(argv)
        assert rc in (0, 143), rc
        preempted += rc == 143
        if rc == 143:  # the requeue loop: one resume finishes
            assert train(*argv, "--resume") == 0, i
        check_finished(log, model, reference)
        before = log.read_bytes()
        assert train(*argv, "--resume") == 0
        if every == "1":  # the last epoch is checkpointed: the same final record again
            assert log.read_bytes() == before
        check_finished(log, model, reference)
    assert preempted >= 3, f"only {preempted} of 24 rounds were preempted"


def test_resume_at_the_last_checkpoint_writes_the_final_record_and_model(tmp_path, capsys):
    """The checkpoint of the last epoch and no final record or model (a SIGTERM in the last
    epoch): ``--resume`` exits 0, appends the final record, saves the model."""
    ck, log, model = tmp_path / "ck", tmp_path / "log.jsonl", tmp_path / "m.pt"
    argv = ["--epochs", "2", "--checkpoint-dir", str(ck), "--log-json", str(log)]
    assert train(*argv) == 0
    recs = records(log)
    log.write_text("".join(json.dumps(r) + "\n" for r in recs[:-1]))  # as SIGTERM leaves it
    assert train(*argv, "--save-model", str(model), "--resume") == 0
    again = records(log)
    assert again[:-1] == recs[:-1] and again[-1] == recs[-1]
    assert "state_dict" in torch.load(model, weights_only=True)


def test_checkpoints_past_the_last_epoch_are_refused(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert train("--epochs", "3", "--checkpoint-dir", str(ck)) == 0
    capsys.readouterr()
    assert train("--epochs", "2", "--checkpoint-dir", str(ck), "--resume") == 2
    assert "reach epoch 2, past the last of --epochs 2" in capsys.readouterr().err


def test_final_record_totals_cover_every_segment(tmp_path):
    """Item 9: after ``--resume`` the final record's ``epochs``, ``total_s`` and
    ``comm_bytes`` are the whole run's, not the last segment's."""
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    assert train("--epochs", "2", "--checkpoint-dir", str(ck), "--log-json", str(log)) == 0
    assert train("--epochs", "5", "--checkpoint-dir", str(ck), "--log-json", str(log),
                 "--resume") == 0
    recs = records(log)
    epochs, final = recs[:-1], recs[-1]
    assert [r["epoch"] for r in epochs] == list(range(5))
    assert final["epochs"] == 5
    assert final["total_s"] == pytest.approx(sum(r["epoch_s"] for r in epochs), rel=1e-9)
    assert final["comm_bytes"] == sum(r["comm_bytes"] for r in epochs)
    assert final["peak_mem_bytes"] == max(r["peak_mem_bytes"] for r in epochs)


def test_profiler_prints_nothing_under_quiet(tmp_path, capfd):
    """Item 9: ``--profile`` with ``--quiet`` writes its trace and nothing on stderr (the
    profiler's C++ side prints a line when it starts and one when it stops)."""
    out = tmp_path / "prof"
    assert train("--epochs", "2", "--profile", "1", "--profile-dir", str(out)) == 0
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == "", captured.err
    assert os.listdir(out) == ["profile-epoch1-rank0.json"]
