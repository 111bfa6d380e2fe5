"""gnnpar.launcher.spawn leaves nothing in $TMPDIR: its rendezvous folder ``gnnpar-rdzv-<pid>-*`` is
removed when a rank is SIGKILLed and when the parent gets SIGTERM or SIGINT; the folder of a
parent that was itself SIGKILLed is removed by the next spawn, while a live parent's folder and
anything not provably gnnpar's are kept."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from gnnpar.launcher.rank_start import SERVER_PREFIX
from gnnpar.launcher.scratch import OWNER_FILE
from gnnpar.launcher.spawn import SpawnError, make_rdzv_dir, spawn

from .cli_util import ROOT
from .dist_cases import fail_mid_epoch


def sleeper(rank, world, ready_dir, seconds):
    """A rank that says it runs (``ready_dir/ready-<rank>``), then sleeps."""
    open(os.path.join(ready_dir, f"ready-{rank}"), "w").close()
    time.sleep(seconds)
    return rank


def noop(rank, world):
    return rank


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    """$TMPDIR is an empty folder, for this process and all it starts; torch's own per-user
    cache (``torchinductor_<user>``, made once torch.optim loads dynamo) goes elsewhere."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads $TMPDIR again
    return tmp


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def start_parent(tmp, ready, nprocs=2):
    """A gnnpar parent process whose ranks sleep; returns it once every rank runs."""
    # a shell's background job starts with SIGINT ignored (and Python keeps it so): put back
    # Python's Ctrl-C, as a user's foreground run has it
    code = ("import signal, sys\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from gnnpar.launcher.spawn import spawn\n"
            "from tests.test_tmp_cleanup import sleeper\n"
            f"spawn(sleeper, {nprocs}, args=({str(ready)!r}, 120), timeout_s=60)\n")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not all((ready / f"ready-{r}").exists() for r in range(nprocs)):
        if parent.poll() is not None or time.monotonic() > deadline:
            parent.kill()
            pytest.fail(f"the ranks never ran: {parent.communicate()}")
        time.sleep(0.1)
    folders = [f for f in os.listdir(tmp) if f.startswith(f"gnnpar-rdzv-{parent.pid}-")]
    assert len(folders) == 1, os.listdir(tmp)
    return parent, tmp / folders[0]


def test_sigkilled_rank_leaves_nothing(tmpdir_env):
    with pytest.raises(SpawnError) as info:
        spawn(fail_mid_epoch, 3, args=(1, "kill"), timeout_s=30)
    assert info.value.rank == 1 and "signal 9" in str(info.value)
    assert os.listdir(tmpdir_env) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signalled_parent_removes_its_folder(tmpdir_env, tmp_path, sig):
    ready = tmp_path / "ready"
    ready.mkdir()
    parent, folder = start_parent(tmpdir_env, ready)
    try:
        assert (folder / OWNER_FILE).exists()
        os.kill(parent.pid, sig)
        _, err = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert parent.returncode != 0, err
    assert os.listdir(tmpdir_env) == [], err


def test_next_spawn_removes_the_folder_of_a_sigkilled_parent_only(tmpdir_env, tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    parent, stale = start_parent(tmpdir_env, ready)
    parent.kill()
    parent.communicate()
    assert stale.is_dir()  # nothing could run in the parent: it is left behind

    # A live owner's folder, made the way spawn makes it, in a process that stays up.
    code = ("import sys, time\nfrom gnnpar.launcher.spawn import make_rdzv_dir\n"
            "print(make_rdzv_dir(), flush=True)\ntime.sleep(120)\n")
    live_owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        live = live_owner.stdout.readline().strip()
        assert os.path.dirname(live) == str(tmpdir_env)
        # Not provably gnnpar's, or not provably abandoned: kept.
        dead_pid = parent.pid
        kept = [tmpdir_env / "gnnpar-rdzv-k2j3h4ab",  # another naming: no pid
                tmpdir_env / f"gnnpar-rdzv-{dead_pid}-noowner",  # no owner file
                tmpdir_env / f"gnnpar-rdzv-{dead_pid}-subdir",  # holds a folder
                tmpdir_env / f"gnnpar-rdzv-{dead_pid}-otherhost",  # owner on another host
                tmpdir_env / "unrelated"]
        for k in kept:
            k.mkdir()
            (k / "data").write_text("user data")
        owner = json.loads((stale / OWNER_FILE).read_text())
        (kept[2] / OWNER_FILE).write_text(json.dumps(owner))
        (kept[2] / "nested").mkdir()
        (kept[3] / OWNER_FILE).write_text(json.dumps({**owner, "host": "elsewhere"}))
        assert not _alive(dead_pid)

        assert spawn(noop, 1, timeout_s=60) == [0]

        assert not stale.exists()
        left = sorted(os.listdir(tmpdir_env))
        # this process keeps its fork server's folder, if it was made here (rank_start.py)
        server = [n for n in left if n.startswith(f"{SERVER_PREFIX}{os.getpid()}-")]
        assert len(server) <= 1, left
        assert left == sorted([os.path.basename(live)] + [k.name for k in kept] + server), left
        assert all((k / "data").read_text() == "user data" for k in kept)
    finally:
        live_owner.kill()
        live_owner.wait()


def test_a_reused_pid_does_not_keep_a_folder_alive(tmpdir_env):
    """The owner file's start time tells a dead owner from a new process with its pid."""
    folder = make_rdzv_dir()
    owner = json.loads(open(os.path.join(folder, OWNER_FILE)).read())
    if not owner["start"]:
        pytest.skip("no /proc start times here")
    owner["start"] = str(int(owner["start"]) - 1)  # "our" pid, but an earlier process
    with open(os.path.join(folder, OWNER_FILE), "w") as fh:
        json.dump(owner, fh)
    from gnnpar.launcher.spawn import remove_stale_rdzv_dirs
    assert remove_stale_rdzv_dirs() == []  # our own pid is skipped outright
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        renamed = os.path.join(str(tmpdir_env), f"gnnpar-rdzv-{child.pid}-reused")
        os.rename(folder, renamed)
        owner["pid"] = child.pid  # a live pid, but its start time is not the owner's
        with open(os.path.join(renamed, OWNER_FILE), "w") as fh:
            json.dump(owner, fh)
        assert remove_stale_rdzv_dirs() == [renamed]
    finally:
        child.kill()
        child.wait()


def test_sigterm_while_shards_are_written_leaves_nothing(tmpdir_env):
    """SIGTERM to a --nprocs parent still partitioning (before any rank exists): exit 143 and
    its temporary shards are gone. METIS runs in a child of its own, so the signal reaches the
    parent's handler (tests/test_metis_call.py). Many epochs: a test process slow to see the
    folder still signals a run that has not ended (a SIGTERM that comes once training has
    begun must end the same way)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-m", "gnnpar.train", "--algo", "1d-halo",
                             "--nprocs", "2", "--dataset", "rmat:scale=15,ef=16",
                             "--partitioner", "metis", "--epochs", "500", "--quiet"],
                            env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(n.startswith("gnnpar-shards-") for n in os.listdir(tmpdir_env)):
        assert proc.poll() is None and time.monotonic() < deadline, "no shard folder appeared"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert [n for n in os.listdir(tmpdir_env) if n.startswith("gnnpar-")] == []
