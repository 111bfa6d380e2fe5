"""One METIS k-way call through ``pymetis``, run in a forked child process.

**Why a child.** METIS (its GKlib) installs a SIGTERM handler of its own for the length of
each call and, when it fires, jumps out of the partitioner. So a SIGTERM that arrives
mid-call is taken by METIS, not by Python. That SIGTERM may be a SLURM preemption, or
``gnnpar-train`` passing one on. On rmat:scale=15–16 the call then failed ("Failed during
initial partitioning", then pymetis's "RuntimeError: Caught an unknown exception!") or the
process died of SIGSEGV. Python's handler never ran, so ``gnnpar-train`` did not exit 143
and left its temporary shards behind.

In a child that blocks SIGTERM and SIGINT, METIS never sees either. Blocking holds there
because a forked child has a single thread. The parent waits in a read that a signal
interrupts, so its own handler runs at once. On every way out it kills the child (SIGKILL)
and reaps it. Ctrl-C and preemption therefore stop a long METIS call at once rather than
wait for it to end. The child also dies with its parent (``PR_SET_PDEATHSIG``), so a
SIGKILLed parent leaves no orphan partitioning on.

The graph reaches the child copy-on-write (fork): nothing is copied up front. The part
vector comes back through a pipe, 4 bytes a vertex. Where the platform has no ``fork``, the
call runs in this process.

Shapes: ``indptr`` (n + 1,) and ``indices`` (nnz,) int64, the symmetric structure without
self loops; ``vweights`` (n,) integer or None; the result ``owner`` (n,) int32, values in
``range(parts)``.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import threading

import numpy as np

PR_SET_PDEATHSIG = 1  # linux/prctl.h
READ_CHUNK = 1 << 20
CHILD_BLOCKS = {signal.SIGTERM, signal.SIGINT}  # held from before the fork, for the child's life


def metis_part_graph(parts: int, indptr: np.ndarray, indices: np.ndarray, *, seed: int,
                     ufactor: int = 30, vweights=None) -> np.ndarray:
    """METIS k-way (``recursive=False``) partition of ``parts`` parts; ``owner`` int32."""
    import pymetis  # here, so a missing package is reported before anything forks

    def call():
        return _pymetis_call(pymetis, parts, indptr, indices, seed, ufactor, vweights)
    if not hasattr(os, "fork"):
        return call()
    return run_forked(call, "the METIS process", "a partition")


def _pymetis_call(pymetis, parts, indptr, indices, seed, ufactor, vweights) -> np.ndarray:
    opts = pymetis.Options(seed=int(seed) & 0x7FFFFFFF, ufactor=int(ufactor))
    kwargs = dict(vweights=vweights, recursive=False, options=opts)
    if hasattr(pymetis, "CSRAdjacency"):
        result = pymetis.part_graph(parts, pymetis.CSRAdjacency(indptr, indices), **kwargs)
    else:  # pymetis < 2025.2
        result = pymetis.part_graph(parts, xadj=indptr, adjncy=indices, **kwargs)
    return np.asarray(result[1], dtype=np.int32)


def run_forked(call, who: str = "the forked child", what: str = "its result"):
    """``call()`` in a forked child with SIGTERM and SIGINT blocked; its (picklable) result
    or its exception here. A signal this process takes meanwhile runs this process's handler
    at once; the child is killed and reaped on every way out. ``who`` and ``what`` name the
    child and its result in the error raised when it dies first."""
    parent = os.getpid()
    pid = r = w = None
    try:
        r, w = os.pipe()
        with _held_across_fork(CHILD_BLOCKS):
            pid = os.fork()
            if pid == 0:  # the child: never returns into the caller's stack
                _child(call, parent, r, w)
        os.close(w)
        w = None
        payload = bytearray()
        while chunk := os.read(r, READ_CHUNK):
            payload += chunk
        _, status = os.waitpid(pid, 0)
        pid = None
    finally:
        for fd in (r, w):
            if fd is not None:
                os.close(fd)
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0 or not payload:
        how = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exited with code {os.waitstatus_to_exitcode(status)}")
        raise RuntimeError(f"{who} {how} before it returned {what}")
    ok, value = pickle.loads(payload)
    if not ok:
        raise value
    return value


@contextlib.contextmanager
def _held_across_fork(signals):
    """Inside: ``signals`` are blocked in this thread, so a child forked here is born with
    them blocked, and (on the main thread) their Python handlers only note them. On leaving:
    handlers and mask come back, then each noted signal is raised again, so its own handler
    runs here.

    Why: ``os.fork`` runs Python at-fork hooks (``logging`` registers some). A handler that
    runs inside one has its exception printed and dropped, so a SIGTERM landing during the
    fork was lost and METIS ran on. Blocking alone does not hold it: another thread of this
    process (OpenBLAS's, torch's) takes it, and the main thread runs the handler at its next
    bytecode, which may be in a hook."""
    noted = []
    saved = {}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # the current mask, unchanged
    try:
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                if signal.getsignal(sig) is not None:  # None: set outside Python, kept
                    saved[sig] = signal.signal(sig, lambda signum, _: noted.append(signum))
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig in noted:
            signal.raise_signal(sig)


def _child(call, parent: int, r: int, w: int) -> None:
    """Runs ``call`` and writes its pickled outcome to ``w``; never returns. SIGTERM and
    SIGINT are blocked from birth (``run_forked`` blocked them before the fork)."""
    code = 1
    try:
        _die_with(parent)
        os.close(r)
        try:
            payload = pickle.dumps((True, call()), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - handed to the parent, which raises it
            payload = _pickled_error(e)
        with os.fdopen(w, "wb") as pipe:
            pipe.write(payload)
        code = 0
    finally:
        os._exit(code)


def _pickled_error(e: Exception) -> bytes:
    try:
        return pickle.dumps((False, e))
    except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
        return pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux); exit now if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)
