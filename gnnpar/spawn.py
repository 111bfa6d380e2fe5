"""Run a function on N local ranks (``--nprocs N`` and the multi-rank tests).

Each child initialises a ``torch.distributed`` process group (gloo by default) through a
file store in a private temporary folder, so no port can collide. A child's exception comes
back to the parent with its traceback; if one child fails or dies, the others are killed and
the parent raises :class:`SpawnError` naming the failed rank. No child outlives the call.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, List, Optional, Sequence


class SpawnError(RuntimeError):
    """A child rank failed; ``rank`` is the first one that did."""

    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank} failed: {message}")
        self.rank = rank


def _child(fn, rank, world, store_path, backend, timeout_s, threads, args, results):
    import torch
    import torch.distributed as dist
    from gnnpar.kernels.comm import init_process_group
    from .watchdog import die_with_parent
    die_with_parent()  # a rank never outlives the process that spawned it
    _name_process(f"gnnpar-rank-{rank}")
    try:
        if threads:
            torch.set_num_threads(threads)
        init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                           world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        try:
            out = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise SystemExit(1)


def _name_process(name: str) -> None:
    """Show the rank in ``ps``/``top`` (Linux thread name, 15 characters at most)."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def spawn(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), backend: str = "gloo",
          timeout_s: float = 120.0, threads: Optional[int] = None) -> List[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``nprocs`` ranks; return each rank's result.

    ``fn`` must be importable (module level). ``threads`` defaults to cores // nprocs (≥ 1).
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    threads = threads or max(1, (os.cpu_count() or 1) // nprocs)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="gnnpar-rdzv-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_child, daemon=True,
                             args=(fn, r, nprocs, store, backend, timeout_s, threads, args, results))
                 for r in range(nprocs)]
        for p in procs:
            p.start()
        forward = _forward_sigterm(procs)
        try:
            return _collect(procs, results, nprocs, timeout_s)
        finally:
            forward()
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join(5)


def _forward_sigterm(procs):
    """While the ranks run, pass SIGTERM (SLURM preemption) on to them, so each can write
    its checkpoint; returns the function that restores the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    old = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, old)


def _collect(procs, results, nprocs, timeout_s):
    out: List[Any] = [None] * nprocs
    done = 0
    deadline = time.monotonic() + timeout_s + 60
    while done < nprocs:
        try:
            rank, ok, value = results.get(timeout=0.2)
        except queue_mod.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                _raise_root_cause(procs, results, {})
            if time.monotonic() > deadline:
                raise SpawnError(-1, f"no result within {timeout_s + 60:.0f} s")
            continue
        if not ok:
            _raise_root_cause(procs, results, {rank: value})
        out[rank] = value
        done += 1
    return out


def _raise_root_cause(procs, results, reports):
    """Name the rank that caused a failure: a rank that died without reporting (killed by a
    signal, crashed) comes first, since its peers only see the broken connection."""
    time.sleep(1.0)  # let the other reports and exit codes arrive
    while True:
        try:
            rank, ok, value = results.get_nowait()
        except queue_mod.Empty:
            break
        if not ok:
            reports.setdefault(rank, value)
    silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in reports]
    if silent:
        code = procs[silent[0]].exitcode
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        peers = f"; {len(reports)} peer(s) then failed" if reports else ""
        raise SpawnError(silent[0], f"process {how} without reporting an error{peers}")
    first = next(iter(reports))  # the earliest report: peers' come after the connection breaks
    raise SpawnError(first, reports[first])
