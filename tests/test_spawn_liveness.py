"""Local ranks (``spawn``, ``--nprocs``) are watched by heartbeat, not by a deadline on the run:
a healthy run longer than ``--timeout`` is never cut short; a rank that stops (SIGSTOP, or
frozen in a C call that holds the GIL) is named within about ``--timeout``, even while its
peers wait for it in a collective, with exit code 3, as is a rank that is killed; a SIGTERM
at any moment of the ranks' start ends the run as a preemption (exit 143), never as a failure.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from gnnpar.launcher.spawn import SpawnError, spawn
from gnnpar.launcher.watchdog import on_sigterm

from .cli_util import ROOT

DATA = "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02"
ENV = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1",
       "TORCH_CPP_LOG_LEVEL": "ERROR"}


# ---------------------------------------------------------------- rank bodies (spawned)
def marks_at_exit(rank, world, folder, delay_s):
    """Returns at once; its interpreter's exit clean-up (a multiprocessing finaliser, as the
    one that unlinks numba's named semaphore) writes ``folder/rank<r>`` after ``delay_s``."""
    from multiprocessing import util

    def mark():
        time.sleep(delay_s)
        open(os.path.join(folder, f"rank{rank}"), "w").close()
    util.Finalize(None, mark, exitpriority=1)
    return rank


def stop_while_peers_wait(rank, world, victim, how):
    """Every rank meets once; then ``victim`` stops while the others wait for it in an
    all-reduce (gloo gives up after the same timeout the heartbeat has)."""
    import ctypes
    dist.barrier()
    if rank == victim:
        if how == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:  # a C call that keeps the GIL: the rank's heartbeat thread cannot run either
            ctypes.PyDLL(None).sleep(600)
    dist.all_reduce(torch.ones(1))
    return rank


def collectives_for(rank, world, seconds):
    """All-reduce every 50 ms until rank 0's clock says ``seconds`` passed; the count."""
    end = time.monotonic() + seconds
    count = 0
    while True:
        go = torch.tensor([1.0 if time.monotonic() < end else 0.0])
        dist.all_reduce(go, op=dist.ReduceOp.MIN)
        if not go.item():
            return count
        count += 1
        time.sleep(0.05)


def preemptible(rank, world, setup_s):
    """Like a gnnpar rank: a setup of random length (a SIGTERM then finds no handler of the
    rank's own), then a deferred SIGTERM hook checked at every "epoch" end (exit 143)."""
    time.sleep(random.Random(os.getpid()).uniform(0, setup_s))
    hook = on_sigterm(lambda: None)
    for _ in range(1000):
        time.sleep(0.02)
        hook.check()
    return "finished"


# ---------------------------------------------------------------- library level
@pytest.mark.parametrize("how", ["sigstop", "gil"])
def test_a_stopped_rank_is_named_not_the_ranks_waiting_for_it(how):
    timeout = 2.0
    t = time.monotonic()
    with pytest.raises(SpawnError) as info:
        spawn(stop_while_peers_wait, 3, args=(1, how), timeout_s=timeout, threads=1)
    elapsed = time.monotonic() - t
    assert info.value.rank == 1, info.value.headline
    assert info.value.failure.kind == "hung", info.value.headline
    assert ("stopped" in info.value.headline) == (how == "sigstop"), info.value.headline
    assert elapsed < 30, elapsed  # the ranks' start, then about one timeout


def test_ranks_that_reported_leave_through_their_clean_up(tmp_path):
    """Ranks that have sent their results exit by themselves, their interpreters' clean-up run
    (killed at once, numba's named semaphore was left for the resource tracker to warn of)."""
    assert spawn(marks_at_exit, 2, args=(str(tmp_path), 0.5), threads=1) == [0, 1]
    assert sorted(os.listdir(tmp_path)) == ["rank0", "rank1"]


def test_a_healthy_run_longer_than_the_timeout_is_not_cut_short():
    counts = spawn(collectives_for, 2, args=(6.0,), timeout_s=1.0, threads=1)
    assert counts[0] == counts[1] > 20


# ---------------------------------------------------------------- SIGTERM while ranks start
DRIVER = r"""
import json, os, random, signal, sys, threading
from gnnpar.launcher.spawn import SpawnError, spawn
from tests.test_spawn_liveness import preemptible

class Preempted(Exception):
    pass

def preempted(signum, frame):  # like gnnpar-train's own handler around spawn
    raise Preempted()

signal.signal(signal.SIGTERM, preempted)
rounds, max_delay, seed = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
for i in range(rounds):
    delay = rng.uniform(0, max_delay)
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        timer.start()  # in the try: on a loaded machine the signal may land while it starts
        spawn(preemptible, 2, args=(1.0,), timeout_s=10, threads=1)
        how = "finished"
    except Preempted:
        how = "143:parent"
    except SpawnError as e:
        how = (f"143:{e.failure.kind}" if e.failure.exit_code == 143 else
               f"{e.failure.kind}: {e.headline}")
    timer.join()
    print(json.dumps({"delay": round(delay, 3), "outcome": how}), flush=True)
"""


def test_sigterm_while_ranks_start_is_always_a_preemption():
    """20+ rounds, SIGTERM at a random moment of the ranks' start (before they exist, while
    their interpreters start, before and after each installs its own handler)."""
    rounds = 20
    r = subprocess.run([sys.executable, "-c", DRIVER, str(rounds), "2.0",
                        str(random.randrange(1 << 30))], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=240)
    outcomes = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and len(outcomes) == rounds, r.stderr[-3000:]
    bad = [o for o in outcomes if not o["outcome"].startswith("143")]
    assert not bad, bad


# ---------------------------------------------------------------- gnnpar-train --nprocs
def train(*argv):
    return subprocess.Popen([sys.executable, "-m", "gnnpar.train", "--dataset", DATA,
                             "--algo", "1d-halo", "--nprocs", "2", "--hidden", "8", "--quiet",
                             *argv], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def epochs_logged(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def wait_for_training(p, log, limit=120):
    deadline = time.monotonic() + limit
    while len(epochs_logged(log)) < 3:
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.05)


def ranks_of(p):
    """``{name: process}`` of the ranks of the command ``p`` (grandchildren: ranks fork from
    gnnpar's fork server); a process that ends while it is looked at is skipped."""
    out = {}
    for c in psutil.Process(p.pid).children(recursive=True):
        try:
            name = c.name()
        except psutil.NoSuchProcess:
            continue
        if name.startswith("gnnpar-rank-"):
            out[name] = c
    return out


def rank_process(p, rank):
    return ranks_of(p)[f"gnnpar-rank-{rank}"]


def reap(p):
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_healthy_run_past_its_timeout_exits_0_with_every_epoch_once(tmp_path):
    log = tmp_path / "log.jsonl"
    p = train("--epochs", "500", "--timeout", "2", "--log-json", str(log))
    try:
        err = p.communicate(timeout=240)[1]
    finally:
        reap(p)
    assert p.returncode == 0, err
    records = epochs_logged(log)
    assert [r["epoch"] for r in records if not r.get("final")] == list(range(500))
    assert records[-1].get("final")


@pytest.mark.parametrize("victim, sig", [(1, "SIGSTOP"), (0, "SIGSTOP"), (1, "SIGKILL")])
def test_a_lost_local_rank_is_named_with_exit_3(tmp_path, victim, sig):
    timeout = 3.0
    log = tmp_path / "log.jsonl"
    p = train("--epochs", "100000", "--timeout", str(timeout), "--log-json", str(log))
    try:
        wait_for_training(p, log)
        target = rank_process(p, victim)
        time.sleep(random.uniform(0, 0.5))
        target.send_signal(getattr(signal, sig))
        t = time.monotonic()
        err = p.stderr.readline()  # the verdict is the command's first line on stderr
        elapsed = time.monotonic() - t  # when the user is told; the exit follows after the
        err += p.communicate(timeout=60)[1]  # helper processes (fork server, tracker) end
    finally:
        reap(p)
    assert p.returncode == 3, err
    assert f"rank {victim} lost" in err.splitlines()[0], err
    limit = 2 * timeout + 3 if sig == "SIGSTOP" else 5  # about 2x --timeout; a death at once
    assert elapsed < limit, (elapsed, err)
    assert not psutil.pid_exists(target.pid) or target.status() == psutil.STATUS_ZOMBIE


def test_sigterm_while_ranks_start_exits_143(tmp_path):
    """The command itself: SIGTERM at random moments from the ranks' start to the first
    epochs."""
    for i in range(3):
        p = train("--epochs", "100000", "--timeout", "10",
                  "--checkpoint-dir", str(tmp_path / f"ck-{i}"))
        try:
            deadline = time.monotonic() + 120
            while not ranks_of(p):
                assert p.poll() is None, p.communicate()[1]
                assert time.monotonic() < deadline, "no rank started"
                time.sleep(0.01)
            time.sleep(random.uniform(0, 3.0))
            p.send_signal(signal.SIGTERM)
            err = p.communicate(timeout=60)[1]
        finally:
            reap(p)
        assert p.returncode == 143, err
        assert "preempted" in err, err
