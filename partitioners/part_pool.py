"""Per-part work over several processes: :func:`map_parts` forks workers that read the same
(memory-mapped) graph and the same precomputed vectors, copy-on-write, so nothing global is
pickled or copied; each task gets one part number and returns that part's (small) result."""
from __future__ import annotations

import multiprocessing
import os

_STATE = {}  # what a forked worker reads: set before the pool forks, cleared after


def map_parts(owner, task, ranks, jobs: int = 1, before_fork=None):
    """``[task(owner, r) for r in ranks]``, over ``jobs`` forked processes when more than one
    (in order). ``before_fork()`` runs once in this process first (e.g. to compile kernels).
    Runs in this process where it may not fork: a daemonic process (a pool's worker) may have
    no children, and only POSIX forks."""
    ranks = list(ranks)
    jobs = min(max(1, int(jobs)), len(ranks))
    if (jobs <= 1 or multiprocessing.current_process().daemon
            or "fork" not in multiprocessing.get_all_start_methods()):
        return [task(owner, r) for r in ranks]
    if before_fork is not None:
        before_fork()
    _STATE.update(owner=owner, task=task)
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            return pool.map(_run, ranks, chunksize=1)
    finally:
        _STATE.clear()


def _run(rank: int):
    return _STATE["task"](_STATE["owner"], rank)


def default_jobs() -> int:
    """Processes for per-part work when not told: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
