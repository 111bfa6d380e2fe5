"""METIS runs in a forked child (gnnpar.datasets.metis_call): the same partition as a call in
this process, errors come back, and a SIGTERM that lands while METIS runs reaches Python's
handler at once (METIS, in-process, took it for itself and failed or crashed)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from gnnpar.datasets.metis_call import _pymetis_call, metis_part_graph, run_forked
from gnnpar.partitioners.metis import undirected_structure, vertex_weights

from .cli_util import ROOT
from .graphs import random_graph

pymetis = pytest.importorskip("pymetis")


def test_forked_call_gives_the_in_process_partition():
    g = random_graph(n=400, avg_deg=6, seed=3)
    indptr, indices = undirected_structure(g)
    vw = vertex_weights(indptr, "edges")
    for parts, seed in ((3, 0), (5, 7)):
        forked = metis_part_graph(parts, indptr, indices, seed=seed, ufactor=30, vweights=vw)
        here = _pymetis_call(pymetis, parts, indptr, indices, seed, 30, vw)
        assert forked.dtype == np.int32 and forked.shape == (400,)
        np.testing.assert_array_equal(forked, here)
        assert set(np.unique(forked)) == set(range(parts))


def test_the_childs_exception_is_raised_here():
    with pytest.raises(ZeroDivisionError):
        run_forked(lambda: 1 // 0)


def test_a_child_killed_by_a_signal_is_an_error():
    with pytest.raises(RuntimeError, match="^the forked child was killed by signal 9 before"):
        run_forked(lambda: os.kill(os.getpid(), signal.SIGKILL))
    with pytest.raises(RuntimeError, match="^the METIS process exited with code 1 before it "
                                          "returned a partition$"):
        run_forked(lambda: os._exit(1), "the METIS process", "a partition")


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(c) for c in fh.read().split()]
    except FileNotFoundError:
        return []


@pytest.mark.parametrize("hook", ["before", "after_in_parent"])
def test_sigterm_during_the_fork_is_not_lost(hook):
    """A SIGTERM that lands while ``os.fork`` runs its at-fork hooks (here a hook sends it):
    the caller's handler still raises from ``run_forked`` (exit 143) and the child is killed
    at once. Unblocked, the handler ran inside the hook, where Python drops its exception;
    the call then waited out the child's 30 s and the process exited 0."""
    code = textwrap.dedent(f"""
        import os, signal, time
        from gnnpar.datasets.metis_call import run_forked
        def preempted(signum, frame):
            raise SystemExit(143)
        signal.signal(signal.SIGTERM, preempted)
        os.register_at_fork({hook}=lambda: os.kill(os.getpid(), signal.SIGTERM))
        run_forked(lambda: time.sleep(30))
        raise SystemExit(0)  # the signal was lost
    """)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, text=True, timeout=90)
    assert done.returncode == 143, done.stderr
    assert time.monotonic() - started < 20


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"),
                    reason="needs /proc/<pid>/task/<pid>/children (Linux)")
def test_sigterm_while_metis_runs_reaches_pythons_handler():
    """SIGTERM sent while the METIS child exists: the caller's handler raises at once (exit
    143), and the child is gone. Were METIS in the caller, it would take the signal itself."""
    code = textwrap.dedent("""
        import signal, sys, time
        from gnnpar.datasets import load_dataset
        from gnnpar.partitioners.metis import metis_partition
        g = load_dataset("rmat:scale=15,ef=16")
        def preempted(signum, frame):
            raise SystemExit(143)
        signal.signal(signal.SIGTERM, preempted)
        print("ready", flush=True)
        for _ in range(20):  # the test signals during one of these calls
            metis_partition(g, 8)
        time.sleep(60)  # a lost signal ends here, exit 0
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": ROOT}, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while not (kids := _children(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, "no METIS child"
            time.sleep(0.002)
        child = kids[0]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
        assert time.monotonic() - sent < 5
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not os.path.exists(f"/proc/{child}"), "the METIS child outlived its parent"
    finally:
        proc.kill()
        proc.wait()
