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
and reaps it. Ctrl-C and preemption therefore stop a long METIS call at once, where before
they waited for it to end. The child also dies with its parent (``PR_SET_PDEATHSIG``), so a
SIGKILLed parent leaves no orphan partitioning on.

The graph reaches the child copy-on-write (fork): nothing is copied up front. The part
vector comes back through a pipe, 4 bytes a vertex. Where the platform has no ``fork``, the
call runs in this process as before.

Shapes: ``indptr`` (n + 1,) and ``indices`` (nnz,) int64, the symmetric structure without
self loops; ``vweights`` (n,) integer or None; the result ``owner`` (n,) int32, values in
``range(parts)``.
"""
from __future__ import annotations

import ctypes
import os
import pickle
import signal

import numpy as np

PR_SET_PDEATHSIG = 1  # linux/prctl.h
READ_CHUNK = 1 << 20


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
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's stack
        _child(call, parent, r, w)
    os.close(w)
    reaped = False
    try:
        payload = bytearray()
        with os.fdopen(r, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(READ_CHUNK)
                if not chunk:
                    break
                payload += chunk
        _, status = os.waitpid(pid, 0)
        reaped = True
    finally:
        if not reaped:
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


def _child(call, parent: int, r: int, w: int) -> None:
    code = 1
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
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
