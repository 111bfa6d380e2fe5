"""Per-part work over several processes: :func:`map_parts` forks workers that read the same
(memory-mapped) graph and the same precomputed vectors, copy-on-write, so nothing global is
pickled or copied; each task gets one part number and returns that part's (small) result."""
from __future__ import annotations

import multiprocessing
import os

_STATE = {}  # what a forked worker reads: set before the pool forks, cleared after


def map_parts(owner, task, ranks, jobs: int = 1, before_fork=None, finish=None):
    """``[task(owner, r) for r in ranks]``, over ``jobs`` forked processes when more than one
    (in order). ``before_fork()`` runs once in this process first (e.g. to compile kernels);
    ``finish()`` runs once in every process that ran tasks, after its last task and before
    this returns (e.g. to wait for work a task left to a thread), its errors raised here.
    Runs in this process where it may not fork: a daemonic process (a pool's worker) may have
    no children, and only POSIX forks."""
    ranks = list(ranks)
    jobs = min(max(1, int(jobs)), len(ranks))
    if (jobs <= 1 or multiprocessing.current_process().daemon
            or "fork" not in multiprocessing.get_all_start_methods()):
        results = [task(owner, r) for r in ranks]
        if finish is not None:
            finish()
        return results
    if before_fork is not None:
        before_fork()
    ctx = multiprocessing.get_context("fork")
    _STATE.update(owner=owner, task=task, finish=finish, barrier=ctx.Barrier(jobs))
    try:
        with ctx.Pool(jobs) as pool:
            results = pool.map(_run, ranks, chunksize=1)
            if finish is not None:  # one each: no worker leaves the barrier until all are in
                pool.map(_finish, range(jobs), chunksize=1)
            return results
    finally:
        _STATE.clear()


def _run(rank: int):
    return _STATE["task"](_STATE["owner"], rank)


def _finish(_):
    _STATE["barrier"].wait(timeout=600)
    _STATE["finish"]()


def default_jobs() -> int:
    """Processes for per-part work when not told: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
