"""gnnpar.launcher.watchdog: SIGKILL of one rank mid-loop makes every other rank exit non-zero within
timeout + 30 s naming the lost rank and its phase, with no process left; a hung rank is named;
a clean finish raises no alarm (not even when a rank stops while its last "run" beat is in
flight, or when its peers finished long before the store's owner); SIGTERM on one rank
checkpoints on all, then exit 143."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from gnnpar.launcher.bootstrap import free_port
from gnnpar.launcher.watchdog import (EXIT_PEER_LOST, EXIT_PREEMPTED, Watchdog, on_sigterm)

from .cli_util import ROOT
WORKER = os.path.join(ROOT, "tests", "watchdog_worker.py")
TIMEOUT = 4.0


def launch(world, init, out, mode):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1",
           "TORCH_CPP_LOG_LEVEL": "ERROR"}
    return [subprocess.Popen([sys.executable, WORKER, str(r), str(world), init, str(out), mode,
                              str(TIMEOUT)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for r in range(world)]


def wait_for(path_fn, world, procs, limit=90):
    deadline = time.monotonic() + limit
    while not all(os.path.exists(path_fn(r)) for r in range(world)):
        dead = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() is not None]
        assert not dead, f"ranks died early: {dead}: " + "".join(p.stderr.read() for p in procs
                                                                  if p.poll() is not None)
        assert time.monotonic() < deadline, "ranks never got going"
        time.sleep(0.1)


def finish(procs, limit):
    """Wait for every process up to ``limit`` seconds; kill leftovers and fail if any."""
    deadline = time.monotonic() + limit
    try:
        for p in procs:
            p.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        left = [p.pid for p in procs if p.poll() is None]
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not left, f"processes still running after {limit:.0f} s: {left}"
    return [(p.returncode, p.stderr.read()) for p in procs]


def init_method(kind, tmp_path):
    if kind == "tcp":
        return f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    return f"file://{tmp_path}/store"


@pytest.mark.parametrize("kind, world, victim", [("tcp", 4, 2), ("tcp", 3, 0), ("file", 3, 1)])
def test_sigkill_of_one_rank_is_named_on_every_other(tmp_path, kind, world, victim):
    procs = launch(world, init_method(kind, tmp_path), tmp_path, "loop")
    try:
        wait_for(lambda r: tmp_path / f"ready-{r}", world, procs)
        time.sleep(1.0)  # a few beats into the loop
        killed_at = time.monotonic()
        os.kill(procs[victim].pid, signal.SIGKILL)
        results = finish(procs, TIMEOUT + 30)
        elapsed = time.monotonic() - killed_at
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert elapsed < TIMEOUT + 30
    assert results[victim][0] == -signal.SIGKILL
    for r, (code, err) in enumerate(results):
        if r == victim:
            continue
        assert code == EXIT_PEER_LOST, (r, code, err)
        assert f"gnnpar: rank {victim} lost during epoch " in err, (r, err)
        assert f"; rank {r} stops" in err
        assert "Traceback" not in err, err


def test_hung_rank_is_named(tmp_path):
    procs = launch(3, init_method("tcp", tmp_path), tmp_path, "hang1")
    results = finish(procs, 60)
    for r, (code, err) in enumerate(results):
        assert code == EXIT_PEER_LOST, (r, code, err)
        assert "gnnpar: rank 1 hung during epoch 2/forward" in err, (r, err)


@pytest.mark.parametrize("mode", ["finish", "finish-inflight"])
def test_clean_finish_raises_no_alarm(tmp_path, mode):
    """Ranks 1 and 2 finish and leave; rank 0 (the store's host) lingers past the timeout.
    finish-inflight: ranks 1 and 2 stop while a "run" beat is in flight (it used to land after
    "done", and rank 0 then exited 3 naming a rank that had finished)."""
    procs = launch(3, init_method("tcp", tmp_path), tmp_path, mode)
    results = finish(procs, 60)
    for r, (code, err) in enumerate(results):
        assert code == 0, (r, code, err)
        assert "lost" not in err and f"rank {r} finished after 5 epochs" in err


def test_sigterm_on_one_rank_checkpoints_everywhere_then_exits_143(tmp_path):
    procs = launch(2, init_method("tcp", tmp_path), tmp_path, "sigterm")
    try:
        wait_for(lambda r: tmp_path / f"ready-{r}", 2, procs)
        os.kill(procs[1].pid, signal.SIGTERM)
        results = finish(procs, 30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [code for code, _ in results] == [EXIT_PREEMPTED] * 2, results
    epochs = [(tmp_path / f"preempted-{r}").read_text() for r in range(2)]
    assert epochs[0] == epochs[1] and int(epochs[0]) >= 1  # same safe point on both ranks


def test_immediate_sigterm_hook_runs_callback_and_exits():
    code = ("import os, signal, sys, time; sys.path.insert(0, %r)\n"
            "from gnnpar.launcher.watchdog import on_sigterm\n"
            "on_sigterm(lambda: print('saved', flush=True), deferred=False)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30); print('not reached')\n") % ROOT
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == EXIT_PREEMPTED and res.stdout == "saved\n", res


class FakeStore:
    """A dict with the Store methods the watchdog uses."""

    def __init__(self):
        self.d = {}

    def set(self, k, v):
        self.d[k] = v.encode() if isinstance(v, str) else v

    def check(self, keys):
        return all(k in self.d for k in keys)

    def get(self, k):
        return self.d[k]


class BeatInFlightStore(FakeStore):
    """Every beat of a watchdog thread takes 1 s to land (a busy store, a descheduled
    thread); ``in_flight`` is set when one starts."""

    def __init__(self):
        super().__init__()
        self.in_flight = threading.Event()

    def set(self, k, v):
        if threading.current_thread().name.startswith("gnnpar-watchdog"):
            self.in_flight.set()
            time.sleep(1.0)
        super().set(k, v)


def tame(wd):
    """``wd.alarms`` collects the verdicts that would end the process (not pytest's)."""
    wd.alarms = []
    wd._die = lambda verdict, write=True, lost=-1: wd.alarms.append(verdict)
    return wd


def checker(store, rank=0, world=2):
    """A watchdog driven by hand (no thread), 0.5 s timeout."""
    wd = tame(Watchdog(rank, world, store=store, timeout=0.5, interval=0.1, store_owner=None))
    wd._changed = {r: time.monotonic() for r in range(world) if r != rank}
    return wd


def test_a_beat_in_flight_never_lands_after_done():
    store = BeatInFlightStore()
    finisher = tame(Watchdog(1, 2, store=store, timeout=30, interval=0.1, store_owner=None))
    finisher.start()
    store.in_flight.clear()
    assert store.in_flight.wait(5)
    finisher.stop()  # races the beat in flight: "done" must still be the last one stored
    assert store.d["gnnpar/watchdog/1"].decode().split(":")[2] == "done"
    assert "gnnpar/watchdog/done/1" in store.d
    wd = checker(store)
    now = time.monotonic()
    wd._tick(now)
    wd._tick(now + 5)  # long past the timeout
    assert wd.alarms == [] and wd._done == {1}


def test_a_done_key_outweighs_a_stale_run_beat():
    store = FakeStore()
    store.set("gnnpar/watchdog/1", "7:12:run:epoch 4/backward")
    store.set("gnnpar/watchdog/done/1", "8")
    wd = checker(store)
    now = time.monotonic()
    wd._tick(now)
    wd._tick(now + 5)
    assert wd.alarms == [] and wd._done == {1}
    store.set("gnnpar/watchdog/2", "7:12:run:epoch 4/backward")  # no done key: lost
    wd = checker(store, world=3)
    wd._done = {1}
    wd._tick(now)
    wd._tick(now + 5)
    assert len(wd.alarms) == 1 and "rank 2 lost during epoch 4/backward" in wd.alarms[0]


def test_store_owner_waits_for_its_peers_done_keys():
    store = FakeStore()
    owner = tame(Watchdog(0, 2, store=store, timeout=8, interval=0.1, store_owner=0)).start()
    threading.Timer(0.5, store.set, ("gnnpar/watchdog/done/1", "3")).start()
    t0 = time.monotonic()
    owner.stop()  # rank 1 never beat: only its done key says it finished
    assert 0.4 < time.monotonic() - t0 < 5 and owner.alarms == []


def test_sigterm_hook_without_process_group_and_uninstall():
    calls = []
    hook = on_sigterm(lambda: calls.append(1))
    try:
        hook.check()  # nothing requested: returns
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert hook.requested and calls == []  # deferred: nothing ran yet
        with pytest.raises(SystemExit) as ex:
            hook.check()
        assert ex.value.code == EXIT_PREEMPTED and calls == [1]
    finally:
        hook.uninstall()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_phases_and_guard_reraise_non_comm_errors():
    wd = Watchdog(0, 1, store=FakeStore(), timeout=1.0, store_owner=None)
    with wd.phase("epoch 0/forward"):
        assert wd.current_phase == "epoch 0/forward"
    assert wd.current_phase == "startup"
    wd.start()
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="shape"):
        with wd.guard():
            raise ValueError("bad shape")
    assert time.monotonic() - t0 < 0.5  # not a communication error: no waiting
    wd.stop()
    assert wd.store.d["gnnpar/watchdog/0"].decode().split(":")[2] == "done"
    with pytest.raises(ValueError, match="timeout"):
        Watchdog(0, 1, store=FakeStore(), timeout=0)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()
    except FileNotFoundError:
        return False


def test_die_with_parent_takes_the_child_down():
    if not sys.platform.startswith("linux"):
        pytest.skip("prctl(PR_SET_PDEATHSIG) is Linux-only")
    child = ("import sys, time; sys.path.insert(0, %r)\n"
             "from gnnpar.launcher.watchdog import die_with_parent\n"
             "assert die_with_parent(); print('armed', flush=True); time.sleep(60)\n") % ROOT
    parent = ("import subprocess, sys, time\n"
              "c = subprocess.Popen([sys.executable, '-c', %r], stdout=subprocess.PIPE, text=True)\n"
              "assert c.stdout.readline().strip() == 'armed'\n"
              "print(c.pid, flush=True); time.sleep(60)\n") % child
    p = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(p.stdout.readline())
        assert _alive(child_pid)
        p.kill()
        p.wait()
        deadline = time.monotonic() + 10
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child_pid), "the child outlived its parent"
    finally:
        if p.poll() is None:
            p.kill()
