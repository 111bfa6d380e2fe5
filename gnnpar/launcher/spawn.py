"""Run a function on N local ranks (``--nprocs N`` and the multi-rank tests).

Ranks are forked from a fork server that has imported torch and gnnpar once
(:mod:`gnnpar.launcher.rank_start`: why, and how each rank still gets the caller's environment and
folder). Each child initialises a ``torch.distributed`` process group (gloo by default) through a
file store in a private temporary folder (no store port to collide). A child's exception comes
back to the parent with its traceback. A world in which a rank could not join the process
group (so none ran its work, :mod:`gnnpar.launcher.rank_join`) is started once more, with a line on
stderr. If one child fails, dies or stops (its heartbeat thread falls silent for
``timeout_s``), the others are killed and the parent raises
:class:`SpawnError` naming that rank. A healthy run is never cut short: there is no deadline
on the run, only on silence (:class:`~gnnpar.launcher.rank_watch.Collector`). No child outlives the
call.

**The rendezvous folder** ``$TMPDIR/gnnpar-rdzv-<pid>-<random>`` (``<pid>``: the parent's) is
removed on every way out the parent controls: return, a failed or SIGKILLed rank, SIGTERM
(passed on to the ranks, then removed once they are gone) and SIGINT. A parent that is itself
SIGKILLed cannot remove it; the next :func:`spawn` on that host removes such stale folders
(:mod:`gnnpar.launcher.scratch`: only folders provably gnnpar's whose owner process is gone).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from gnnpar.kernels.comm import import_dynamo_first
from gnnpar.kernels.cpu_spmm import size_pool

from gnnpar.launcher.rank_join import join
from gnnpar.launcher.rank_start import adopt, caller_state
from gnnpar.launcher.rank_start import context as rank_context
from gnnpar.launcher.rank_watch import Collector, RankFailure, SpawnError, beat_interval
from gnnpar.launcher.scratch import make_scratch_dir, remove_stale_scratch_dirs
from gnnpar.launcher.watchdog import EXIT_PREEMPTED, die_with_parent


def _child(fn, rank, world, store_path, backend, timeout_s, threads, args, results,
           dynamo_first=False, beats=None, beat_s=1.0, caller=None):
    if caller is not None:
        adopt(caller)
    die_with_parent()  # a rank never outlives the process that spawned it
    _name_process(f"gnnpar-rank-{rank}")
    try:
        if beats is not None:
            threading.Thread(target=_beat, args=(beats, rank, beat_s), name="gnnpar-heartbeat",
                             daemon=True).start()
        if threads:
            torch.set_num_threads(threads)
            size_pool(threads)
        if dynamo_first:
            import_dynamo_first()
        join(backend, store_path, rank, world, timeout_s)
        try:
            out = fn(rank, world, *args)
        except BaseException:
            # the peers may be gone already: leaving the group must not replace the failure
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            raise
        if dist.is_initialized():  # fn may have left the group itself
            dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, RankFailure.of(e)))
        raise SystemExit(1)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or ``taskset``'s
    share), else every core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _beat(beats, rank: int, every_s: float) -> None:
    """The heartbeat thread of a rank: bump its counter in memory shared with the parent.

    It runs beside the rank body and needs nothing from it, so a rank waiting in a collective
    keeps beating; it stops with the process (SIGSTOP) or with its interpreter (a C call that
    holds the GIL and never returns)."""
    while True:
        beats[rank] += 1
        time.sleep(every_s)


def _name_process(name: str) -> None:
    """Show the rank in ``ps``/``top`` (Linux thread name, 15 characters at most)."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def spawn(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), backend: str = "gloo",
          timeout_s: float = 120.0, threads: Optional[int] = None,
          dynamo_first: bool = False) -> List[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``nprocs`` ranks; return each rank's result.

    ``fn`` must be importable (module level). ``threads``: each rank's torch threads and
    compiled SpMM pool; default the cores this process may run on // nprocs (≥ 1).
    ``timeout_s``: how long a collective may wait (the process group's timeout) and how long
    a rank's heartbeat may be silent before the rank is reported lost; the run itself has no
    deadline (see :class:`Collector`). ``dynamo_first``: ``fn`` builds a ``torch.optim``
    optimizer (trains on a GPU, :mod:`gnnpar.training.adam`), so each rank imports
    ``torch._dynamo`` before it joins
    (:func:`gnnpar.kernels.comm.import_dynamo_first`), and its process groups are freed when
    it leaves.

    Raises :class:`SpawnError` naming the rank: ``failure.kind`` is ``"died"`` (the process
    ended without a report), ``"hung"`` (its heartbeat stopped), ``"preempted"`` (SIGTERM
    reached the ranks before every one could leave through its own handler; exit code 143),
    or the rank's own report (``"input"``, ``"exit"``, ``"error"``, or ``"join"``: a rank could
    not join the process group in either of the :data:`JOIN_TRIES` worlds started).
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    threads = threads or max(1, usable_cores() // nprocs)
    return retry_unjoined(
        lambda: _spawn_world(fn, nprocs, args, backend, timeout_s, threads, dynamo_first),
        JOIN_TRIES, lambda line: print(line, file=sys.stderr, flush=True))


#: how many times a world whose ranks could not all join is started (see :mod:`rank_join`)
JOIN_TRIES = 2


def retry_unjoined(start_world: Callable[[], List[Any]], tries: int,
                   say: Callable[[str], None]) -> List[Any]:
    """``start_world()``, started again (up to ``tries`` times in all) while it fails because
    a rank could not join the process group: then no rank ran any of its work
    (:func:`gnnpar.launcher.rank_join.join`), so starting again repeats nothing. Every other
    failure, and the last try's, is raised as it came; each retry is said in one line."""
    attempt = 1
    while True:
        try:
            return start_world()
        except SpawnError as e:
            if e.failure.kind != "join" or attempt >= tries:
                raise
            attempt += 1
            say(f"gnnpar: {e.failure.message}; starting the ranks again "
                f"(try {attempt} of {tries})")


def _spawn_world(fn, nprocs, args, backend, timeout_s, threads, dynamo_first) -> List[Any]:
    """One world of ``nprocs`` ranks, from its own rendezvous folder to its last rank."""
    ctx = rank_context(dynamo_first)
    results = ctx.Queue()
    beats = ctx.RawArray("Q", nprocs)  # one heartbeat counter per rank
    beat_s = beat_interval(timeout_s)
    remove_stale_rdzv_dirs()
    procs: list = []
    sigterm = _SigtermForwarder(procs)  # before the folder exists: no SIGTERM can strand it
    tmp = None
    try:
        tmp = make_rdzv_dir()
        store = os.path.join(tmp, "store")
        try:
            for r in range(nprocs):
                p = ctx.Process(target=_child, daemon=True,
                                args=(fn, r, nprocs, store, backend, timeout_s, threads, args,
                                      results, dynamo_first, beats, beat_s, caller_state()))
                try:
                    p.start()
                except OSError:
                    if not sigterm.received:
                        raise
                    # a SIGTERM to the whole process group took it before it read its task
                    raise SpawnError(r, RankFailure(
                        "preempted", f"rank {r} stopped on SIGTERM while it started",
                        EXIT_PREEMPTED)) from None
                procs.append(p)
            sigterm.started()
            out = Collector(procs, results, timeout_s, beats, beat_s, sigterm).run()
            _let_leave(procs, LEAVE_S)
            return out
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join(5)
    finally:  # runs even when a second Ctrl-C interrupts the cleanup above
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        sigterm.restore()


#: seconds ranks that have all reported their results get to leave on their own before the
#: rest are killed
LEAVE_S = 5.0


def _let_leave(procs, within_s: float) -> None:
    """Wait up to ``within_s`` in all for ranks that have reported to exit by themselves. A
    rank's exit runs its interpreter's clean-up, which a kill would skip: numba's thread pool
    made a named semaphore in the rank (multiprocessing's resource tracker holds its name),
    and a rank killed before its finaliser unlinked it left the tracker to warn of a "leaked
    semaphore" at the launcher's exit, or, killed half-way, of one already gone."""
    deadline = time.monotonic() + within_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))


class _SigtermForwarder:
    """While the ranks run, pass SIGTERM (SLURM preemption) on to them, so each can write
    its checkpoint (the parent cleans up once they are gone).

    Each rank gets the signal once: the ranks started when it came at once, the others as
    soon as they are started (:meth:`started`). A rank may get it before it has a handler of
    its own (while its interpreter starts, before ``fn`` installs one) and die of it: that is
    still a preemption, never a lost rank (``received`` tells :class:`Collector`). A SIGTERM
    that no rank could take (none left) is delivered to this process again by
    :meth:`restore`, after the cleanup, under the previous handler."""

    def __init__(self, procs):
        self.procs = procs
        self.received = False
        self.sent: set = set()  # pids the signal was passed on to
        self.installed = threading.current_thread() is threading.main_thread()
        if self.installed:
            self.old = signal.signal(signal.SIGTERM, self._handle)

    def _forward(self) -> None:
        for p in list(self.procs):
            if p.pid is None or p.pid in self.sent or p.exitcode is not None:
                continue
            self.sent.add(p.pid)
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _handle(self, signum, frame) -> None:
        self.received = True
        self._forward()

    def started(self) -> None:
        """All ranks started: pass on a SIGTERM that came while they were starting."""
        if self.received:
            self._forward()

    def restore(self) -> None:
        if not self.installed:
            return
        self.installed = False
        # None: a handler not set from Python; the default is the nearest we can restore
        signal.signal(signal.SIGTERM, signal.SIG_DFL if self.old is None else self.old)
        if self.received and not self.sent:
            signal.raise_signal(signal.SIGTERM)


# ---------------------------------------------------------------- the rendezvous folder
RDZV_PREFIX = "gnnpar-rdzv-"


def make_rdzv_dir() -> str:
    """A new private ``$TMPDIR/gnnpar-rdzv-<pid>-<random>`` with its owner file."""
    return make_scratch_dir(RDZV_PREFIX)


def remove_stale_rdzv_dirs(root: Optional[str] = None) -> List[str]:
    """Remove rendezvous folders left by gnnpar parents that were killed (see
    :func:`gnnpar.launcher.scratch.remove_stale_scratch_dirs`); returns the paths removed."""
    return remove_stale_scratch_dirs(RDZV_PREFIX, root)
