"""The ranks' fork server forked from a clean launcher (gnnpar/launcher/server_fork.py): it is
the launcher's fork (not a new interpreter), its ranks run, it blocks SIGTERM as a server does,
it leaves when its launcher leaves (it kept no copy of the pipe that tells it so), and the
launcher's buffered output is written once; a launcher that has started a thread gets the new
interpreter as before. (What a `gnnpar-train --nprocs` run gains: scripts/bench_server_fork.py.)"""
import json
import os
import subprocess
import sys
import time

import psutil

from .cli_util import ROOT

LAUNCHER = r"""
import json, os, sys, threading, time
from gnnpar.launcher import server_fork
from gnnpar.launcher.spawn import spawn
from tests.test_server_fork import server_view
print("said once")  # buffered (stdout is a pipe): the server and the ranks must not repeat it
if sys.argv[1] == "thread":
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
forked = server_fork.start_now()
print(json.dumps({"pid": os.getpid(), "forked": forked, "ranks": spawn(server_view, 2)}))
"""

SIGTERM_BIT = 1 << (15 - 1)  # /proc's SigBlk: bit n-1 for signal n


def server_view(rank, world):
    """The process that forked this rank (the server): its pid, parent, command line, and
    whether it blocks SIGTERM. It writes to stdout (which it has from the server, its buffer
    from the launcher at the fork)."""
    print(f"rank {rank} here", flush=True)
    server = psutil.Process(os.getppid())
    with open(f"/proc/{server.pid}/status") as f:
        blocked = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    return {"server": server.pid, "parent": server.ppid(), "cmdline": server.cmdline(),
            "blocks_sigterm": bool(blocked & SIGTERM_BIT), "rank": rank}


def _launch(mode):
    argv = [sys.executable, "-c", LAUNCHER, mode]
    res = subprocess.run(argv, cwd=ROOT, env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
                              "PYTHONPATH": ROOT},  # buffered output, as a user has it
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines().count("said once") == 1, res.stdout
    return argv, json.loads(res.stdout.splitlines()[-1])


def _gone(pid, within_s=10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_a_clean_launcher_forks_its_server_which_leaves_with_it():
    argv, out = _launch("clean")
    assert out["forked"] is True
    ranks = out["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    server = ranks[0]["server"]
    assert all(r["server"] == server for r in ranks)
    assert ranks[0]["parent"] == out["pid"]
    assert ranks[0]["cmdline"] == argv  # the launcher's fork, not a new interpreter's command
    assert ranks[0]["blocks_sigterm"]
    assert _gone(server)  # the launcher has exited: so has its server


def test_a_launcher_with_a_thread_starts_a_new_interpreter():
    argv, out = _launch("thread")
    assert out["forked"] is False
    view = out["ranks"][0]
    assert view["parent"] == out["pid"]
    assert view["cmdline"] != argv and "multiprocessing.forkserver" in " ".join(view["cmdline"])
    assert view["blocks_sigterm"]
    assert _gone(view["server"])
