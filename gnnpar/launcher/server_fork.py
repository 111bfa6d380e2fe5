"""Start the ranks' fork server by forking the launching process, not as a new interpreter.

multiprocessing starts a fork server (:mod:`gnnpar.launcher.rank_start`) as a new interpreter
that imports its preload modules: torch, numba and gnnpar, about three seconds of CPU on a
small machine, paid by every ``--nprocs`` run before its first rank starts. A command such as
``gnnpar-train`` has imported the same modules already. While it is still *clean* — no thread
started since gnnpar's launcher was imported (no OpenMP, MKL or numba pool, no Python thread;
numpy's OpenBLAS starts its pool when numpy is imported, and forks safely: its fork handlers
stop and restart it, which the new interpreter's forks rely on as well), CUDA not initialised,
no data loaded — a fork of it is what that new interpreter would be once its imports were done,
and costs a few milliseconds: :func:`start_now` makes the server that way.

The server runs the very command multiprocessing built for the new interpreter (so whatever
that command carries in this Python version, it carries), in a child that keeps only the file
descriptors the new interpreter would have had (standard input, output and error and the two
multiprocessing passes: a copy of the "alive" pipe's write end would keep the server from
ever seeing its launcher leave), with SIGTERM blocked as ``rank_start`` blocks it in a server,
and that leaves with ``os._exit`` (the launcher's ``atexit`` work and buffered output are the
launcher's, not the server's). Where any condition fails — another thread, CUDA initialised,
not Linux, a server already running, a multiprocessing that does not start its server the way
this module expects, or ``GNNPAR_SERVER_FORK=0`` in the environment — nothing is forked and
the server starts as a new interpreter, as before.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from multiprocessing import forkserver, resource_tracker, util

import torch  # before the threads are counted: numpy's OpenBLAS starts its pool on import

from gnnpar.launcher.rank_start import context

#: ``0`` here: never fork the server (start it as a new interpreter)
ENV = "GNNPAR_SERVER_FORK"
#: how multiprocessing's command for a new fork server begins (``ForkServer.ensure_running``)
SERVER_COMMAND = "from multiprocessing.forkserver import main"


def start_now(dynamo: bool = False) -> bool:
    """Start this process's fork server now, forked from this process, if it is clean (see
    the module docstring); ``dynamo`` as :func:`gnnpar.launcher.rank_start.context`'s.
    Returns whether the server was forked; otherwise nothing changed and the first spawn
    starts it as a new interpreter."""
    if os.environ.get(ENV) == "0" or not _clean():
        return False
    if context(dynamo).get_start_method() != "forkserver":
        return False
    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        return False  # running already (a second run in this process)
    resource_tracker.ensure_running()  # a small interpreter of its own, as multiprocessing has it
    spawnv_passfds = util.spawnv_passfds
    forked = {}

    def fork_instead(path, args, passfds):
        if not (args and str(args[-1]).startswith(SERVER_COMMAND) and _clean()):
            return spawnv_passfds(path, args, passfds)
        forked["pid"] = _fork_server(str(args[-1]), passfds)
        return forked["pid"]

    util.spawnv_passfds = fork_instead
    try:
        server.ensure_running()
    finally:
        util.spawnv_passfds = spawnv_passfds
    return "pid" in forked


def _threads() -> int:
    """This process's threads, its own and native ones (0 where ``/proc`` does not say)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


#: the threads of this process when this module was imported (gnnpar's launcher's imports)
THREADS_AT_IMPORT = _threads()


def _clean() -> bool:
    """Linux (``/proc`` counts the threads), no thread since :data:`THREADS_AT_IMPORT` and no
    Python thread but this one, CUDA not initialised."""
    if not sys.platform.startswith("linux") or not THREADS_AT_IMPORT:
        return False
    if _threads() > THREADS_AT_IMPORT or threading.active_count() != 1:
        return False
    return not torch.cuda.is_initialized()


def _fork_server(command: str, passfds) -> int:
    """Fork; the child runs ``command`` (the server's main loop) and never returns."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()  # else the server, and every rank, would write this buffer again
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        keep = {0, 1, 2, *passfds}
        for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass  # the listing's own descriptor, already closed
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        exec(compile(command, "<gnnpar fork server>", "exec"), {"__name__": "__mp_server__"})
    except SystemExit as e:  # the server's way out once its launcher has gone
        code = e.code if isinstance(e.code, int) else 0
    except BaseException:  # noqa: BLE001 - said on stderr, as a new interpreter would
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        os._exit(code)
