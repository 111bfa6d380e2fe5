"""Ranks fork from a fork server (gnnpar/launcher/rank_start.py), yet behave as spawned ones: each takes
the caller's environment and folder of the moment of the call, a SIGTERM to the launcher's
whole process group still lets every rank write its checkpoint (exit 143), and the server's
folder in $TMPDIR is removed at exit, or by the next launch when the launcher was SIGKILLed.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile

import psutil

from gnnpar.launcher.rank_start import SERVER_PREFIX
from gnnpar.launcher.spawn import spawn

from .cli_util import ROOT
from .test_spawn_liveness import epochs_logged, reap, train, wait_for_training


def report(rank, world):
    """What a rank sees: its parent, one variable, its folder."""
    return os.getppid(), os.environ.get("GNNPAR_TEST_SETTING"), os.getcwd()


def compiler_state(rank, world):
    """Whether numba's compiler contexts exist in a rank before its first kernel, and whether
    numba's threading layer has started."""
    import numba.np.ufunc.parallel as numba_parallel
    from numba.core.registry import cpu_target
    built = all(name in vars(cpu_target)
                for name in ("_toplevel_typing_context", "_toplevel_target_context"))
    return built, bool(numba_parallel._is_initialized)


def test_ranks_start_with_numbas_compiler_set_up_and_no_thread_pool():
    """The fork server built numba's typing and target contexts (kernels/numba_warm.py), so a
    rank does not build them again, and started no threading layer, so forking stayed safe."""
    assert spawn(compiler_state, 2, timeout_s=60) == [(True, False), (True, False)]


def test_ranks_take_the_environment_and_folder_of_the_call(tmp_path, monkeypatch):
    spawn(report, 1, timeout_s=60)  # the server exists before the settings change
    monkeypatch.setenv("GNNPAR_TEST_SETTING", "after the server started")
    monkeypatch.chdir(tmp_path)
    first, second = spawn(report, 2, timeout_s=60)
    assert first == second
    parent, setting, cwd = first
    assert parent != os.getpid()  # forked by the server, not spawned by this process
    assert setting == "after the server started"
    assert cwd == str(tmp_path)
    monkeypatch.delenv("GNNPAR_TEST_SETTING")
    assert spawn(report, 1, timeout_s=60)[0][1] is None


def test_sigterm_to_the_whole_group_is_a_preemption_with_a_checkpoint(tmp_path):
    """A scheduler signals every process of the job, the fork server included; the only
    checkpoint is the one the preemption writes."""
    log, ck = tmp_path / "log.jsonl", tmp_path / "ck"
    p = train("--epochs", "100000", "--timeout", "10", "--log-json", str(log),
              "--checkpoint-dir", str(ck), "--checkpoint-every", "1000000")
    try:
        wait_for_training(p, log)
        os.killpg(p.pid, signal.SIGTERM)
        err = p.communicate(timeout=60)[1]
    finally:
        reap(p)
    assert p.returncode == 143, err
    assert "preempted (SIGTERM): checkpoint written" in err, err  # not "no new checkpoint"
    assert len(epochs_logged(log)) >= 3


LAUNCHER = r"""
import os, sys, time
from tests.test_rank_start import report
from gnnpar.launcher.spawn import spawn
spawn(report, 1, timeout_s=60)
print(os.getpid(), flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_the_server_folder_goes_at_exit_or_with_the_next_launch():
    tmp = tempfile.mkdtemp(prefix="gnnpar-t-", dir="/tmp")  # short: the socket's path fits
    env = {**os.environ, "PYTHONPATH": ROOT, "TMPDIR": tmp,  # torch's cache elsewhere:
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(tempfile.gettempdir(), "gnnpar-t-inductor")}
    try:
        killed = subprocess.Popen([sys.executable, "-c", LAUNCHER, "600"], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, text=True)
        pid = int(killed.stdout.readline())
        server = psutil.Process(pid).children()
        killed.kill()
        killed.wait()
        psutil.wait_procs(server, timeout=10)  # the server leaves with its launcher
        assert not any(s.is_running() and s.status() != psutil.STATUS_ZOMBIE for s in server)
        left = os.listdir(tmp)
        assert left and all(n.startswith(f"{SERVER_PREFIX}{pid}-") for n in left), left

        res = subprocess.run([sys.executable, "-c", LAUNCHER, "0"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert os.listdir(tmp) == []  # the stale folder removed, its own gone at exit
    finally:
        subprocess.run(["rm", "-rf", tmp])


def test_a_deep_tmpdir_spawns_the_ranks(tmp_path):
    """A Unix socket's path cannot exceed 107 bytes: under a deeper $TMPDIR ranks are spawned."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    code = ("from tests.test_rank_start import report\nfrom gnnpar.launcher.spawn import spawn\n"
            "import json, os\nprint(json.dumps([os.getpid(), spawn(report, 2, timeout_s=60)]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT, "TMPDIR": str(deep),
                              "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
                         timeout=120)
    assert res.returncode == 0, res.stderr
    pid, ranks = json.loads(res.stdout)
    assert all(parent == pid for parent, _, _ in ranks)  # spawned by the launcher itself
    assert os.listdir(deep) == []
