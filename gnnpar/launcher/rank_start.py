"""How :func:`gnnpar.launcher.spawn.spawn` starts its ranks: forked from a fork server that has
already imported torch and gnnpar.

A rank started with multiprocessing's ``spawn`` method is a new interpreter that imports torch
(and, to train on a GPU, ``torch._dynamo``) before it can do anything: two to three seconds per
rank on a small machine, paid again on every call. multiprocessing's ``forkserver`` method
starts one server process per launching process, the first time it is needed; the server
imports the modules in :data:`PRELOAD` once and forks each rank from itself, so a rank starts
in a few hundredths of a second with those modules in place. The server has only imported
modules — it has run no torch operation, started no thread pool and touched no GPU — so forking
it is as safe as a fresh interpreter. Where ``forkserver`` does not exist (not POSIX) ranks are
started with ``spawn``.

Three things a forked rank would otherwise take from the server rather than from the call,
and how each is made the caller's:

- **environment and working folder**: the server keeps those of the moment it started;
  :func:`caller_state` records the caller's at each call and :func:`adopt` installs them in
  the rank before anything else runs. Settings that a module reads when it is *imported* are
  the exception: modules in :data:`PRELOAD` read them when the server started (torch's
  ``OMP_NUM_THREADS`` is overridden per rank anyway by ``threads``, and numba's
  ``NUMBA_NUM_THREADS`` by :func:`gnnpar.kernels.cpu_spmm.size_pool`, which sets the pool's
  size in an imported numba whose pool has not started);
- **SIGTERM**: a SIGTERM to the whole process group (a scheduler's preemption, ``kill`` of
  the group) reaches the server too. Were it to die of it, every rank (whose parent it is, so
  whose death signal it triggers, :func:`gnnpar.launcher.watchdog.die_with_parent`) would be killed
  before writing its checkpoint. So the server blocks SIGTERM (set when this module is
  imported inside it) and leaves when its launching process does (multiprocessing closes
  it then). A rank inherits the block, so a SIGTERM sent to it while it starts waits, pending,
  until :func:`adopt` puts SIGTERM's default back and unblocks it: the rank then dies of it,
  as a spawned rank would, and the launcher counts a preemption — it is never lost;
- **the parent**: a rank's parent is the server, which outlives no launching process, so
  "no rank outlives the call" still holds through the server.

**The server's folder.** multiprocessing puts the server's socket in a temporary folder of the
launching process, which a SIGKILLed launcher would leave in ``$TMPDIR``. Here that folder is
a gnnpar scratch folder, ``$TMPDIR/gnnpar-forkserver-<pid>-<random>`` with an owner file
(:mod:`gnnpar.launcher.scratch`): removed when the launching process exits, and, when that process
was killed, by the next launch on the host. It is the one thing a launching process keeps in
``$TMPDIR`` between calls.
"""
from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict

from gnnpar.launcher.scratch import make_scratch_dir, remove_stale_scratch_dirs

#: imported once by the fork server; ``__main__``: the launching script, as ``spawn`` would
#: import it (a rank body defined there stays importable); ``numba``, which ranks import for
#: their kernels (a fifth of a second each), and its compiler's contexts
#: (:mod:`gnnpar.kernels.numba_warm`, half a second), set up only: no kernel is loaded and
#: its thread pool does not start until a rank's first parallel call
PRELOAD = ("__main__", "torch", "numba", "gnnpar.kernels.numba_warm",
           "gnnpar.launcher.rank_start", "gnnpar.launcher.launch")
#: imported too by a server whose first ranks train with torch's optimiser (``dynamo=True``)
DYNAMO = "torch._dynamo"
SERVER_PREFIX = "gnnpar-forkserver-"


def context(dynamo: bool = False):
    """The multiprocessing context the ranks start from: ``forkserver`` where it exists and
    its socket's path fits (a Unix socket's path is at most 107 bytes: a deep ``$TMPDIR``
    does not fit), else ``spawn``. ``dynamo``: the ranks will import ``torch._dynamo``
    (:func:`gnnpar.kernels.comm.import_dynamo_first`), so a server started now imports it
    once for all of them (a server already running keeps what it imported)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    remove_stale_scratch_dirs(SERVER_PREFIX)
    if not _server_folder():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD) + ([DYNAMO] if dynamo else []))
    return ctx


SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating zero


def _server_folder() -> bool:
    """Make this process's multiprocessing temporary folder (where the server's socket will be)
    a gnnpar scratch folder, unless there is one already; False if the socket's path in it
    would be too long."""
    config = mp.current_process()._config  # what multiprocessing.util.get_temp_dir reads
    folder = config.get("tempdir")
    if not folder:
        # mkdtemp and the socket name ("listener-" + mktemp's) add 8 random characters each
        folder = os.path.join(tempfile.gettempdir(), f"{SERVER_PREFIX}{os.getpid()}-xxxxxxxx")
    if len(os.fsencode(os.path.join(folder, "listener-xxxxxxxx"))) > SOCKET_PATH_MAX:
        return False
    if not config.get("tempdir"):
        config["tempdir"] = folder = make_scratch_dir(SERVER_PREFIX)
        atexit.register(shutil.rmtree, folder, True)
    return True


@dataclass(frozen=True)
class CallerState:
    """What a rank takes from the process that called :func:`~gnnpar.launcher.spawn.spawn`."""

    env: Dict[str, str]
    cwd: str


def caller_state() -> CallerState:
    return CallerState(dict(os.environ), os.getcwd())


def adopt(state: CallerState) -> None:
    """In a rank, first thing: the caller's environment and folder; SIGTERM's default, then
    any SIGTERM that came while the rank started."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if dict(os.environ) != state.env:
        os.environ.clear()
        os.environ.update(state.env)
    if os.getcwd() != state.cwd:
        os.chdir(state.cwd)


def _in_fork_server() -> bool:
    """This import runs inside multiprocessing's fork server (its ``main`` is on the stack)."""
    frame = sys._getframe(1)
    tail = os.path.join("multiprocessing", "forkserver.py")
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_code.co_filename.endswith(tail):
            return True
        frame = frame.f_back
    return False


if _in_fork_server():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
