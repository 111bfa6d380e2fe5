"""Run a function on N local ranks (``--nprocs N`` and the multi-rank tests).

Each child initialises a ``torch.distributed`` process group (gloo by default) through a
file store in a private temporary folder, so no port can collide. A child's exception comes
back to the parent with its traceback; if one child fails or dies, the others are killed and
the parent raises :class:`SpawnError` naming the failed rank. No child outlives the call.

**The rendezvous folder** ``$TMPDIR/gnnpar-rdzv-<pid>-<random>`` (``<pid>``: the parent's) is
removed on every way out the parent controls: return, a failed or SIGKILLed rank, SIGTERM
(passed on to the ranks, then removed once they are gone) and SIGINT. A parent that is itself
SIGKILLed cannot remove it; the next :func:`spawn` on that host removes such stale folders
(:mod:`gnnpar.scratch`: only folders provably gnnpar's whose owner process is gone).
"""
from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from gnnpar.datasets import InputError
from gnnpar.kernels.comm import import_dynamo_first, init_process_group
from gnnpar.kernels.cpu_spmm import size_pool

from .scratch import make_scratch_dir, remove_stale_scratch_dirs
from .watchdog import die_with_parent


@dataclass(frozen=True)
class RankFailure:
    """How a rank failed, carried to the parent as data (never parsed from text): ``kind``
    ``"input"`` (an :class:`~gnnpar.datasets.InputError`, exit 2), ``"exit"``
    (``SystemExit``; ``exit_code``), ``"died"`` (no report) or ``"error"``; ``message``: the
    exception's own text; ``detail``: its type and traceback."""

    kind: str
    message: str
    exit_code: Optional[int] = None
    detail: str = ""

    @classmethod
    def of(cls, e: BaseException) -> "RankFailure":
        detail = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        if isinstance(e, InputError):
            return cls("input", str(e), 2, detail)
        if isinstance(e, SystemExit):
            return cls("exit", str(e), e.code if isinstance(e.code, int) else 1, detail)
        return cls("error", str(e), None, detail)


class SpawnError(RuntimeError):
    """A child rank failed; ``rank`` is the first one that did, ``failure`` says how."""

    def __init__(self, rank: int, failure: RankFailure):
        super().__init__(f"rank {rank} failed: {failure.detail or failure.message}")
        self.rank, self.failure = rank, failure

    @property
    def headline(self) -> str:
        """``rank R failed: Type: message`` — one line."""
        return str(self).splitlines()[0]


def _child(fn, rank, world, store_path, backend, timeout_s, threads, args, results,
           dynamo_first=False):
    die_with_parent()  # a rank never outlives the process that spawned it
    _name_process(f"gnnpar-rank-{rank}")
    try:
        if threads:
            torch.set_num_threads(threads)
            size_pool(threads)
        if dynamo_first:
            import_dynamo_first()
        init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                           world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        try:
            out = fn(rank, world, *args)
        except BaseException:
            # the peers may be gone already: leaving the group must not replace the failure
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            raise
        dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, RankFailure.of(e)))
        raise SystemExit(1)


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

    ``fn`` must be importable (module level). ``threads`` defaults to cores // nprocs (≥ 1).
    ``dynamo_first``: ``fn`` builds a torch optimizer (trains), so each rank imports
    ``torch._dynamo`` before it joins (:func:`gnnpar.kernels.comm.import_dynamo_first`), and
    its process groups are freed when it leaves.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    threads = threads or max(1, (os.cpu_count() or 1) // nprocs)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    remove_stale_rdzv_dirs()
    procs: list = []
    sigterm = _SigtermForwarder(procs)  # before the folder exists: no SIGTERM can strand it
    tmp = None
    try:
        tmp = make_rdzv_dir()
        store = os.path.join(tmp, "store")
        try:
            for r in range(nprocs):
                procs.append(ctx.Process(target=_child, daemon=True,
                                         args=(fn, r, nprocs, store, backend, timeout_s,
                                               threads, args, results, dynamo_first)))
                procs[-1].start()
            sigterm.started()
            return _collect(procs, results, nprocs, timeout_s)
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


class _SigtermForwarder:
    """While the ranks run, pass SIGTERM (SLURM preemption) on to them, so each can write
    its checkpoint (the parent cleans up once they are gone). A SIGTERM that came while the
    ranks were starting reaches them all once started; one that no rank could take (none left)
    is delivered to this process again by :meth:`restore`, after the cleanup, under the
    previous handler."""

    def __init__(self, procs):
        self.procs = procs
        self.starting = True
        self.pending = False
        self.installed = threading.current_thread() is threading.main_thread()
        if self.installed:
            self.old = signal.signal(signal.SIGTERM, self._handle)

    def _forward(self) -> int:
        live = [p for p in self.procs if p.pid is not None and p.exitcode is None]
        for p in live:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        return len(live)

    def _handle(self, signum, frame) -> None:
        if self._forward() == 0 or self.starting:
            self.pending = True

    def started(self) -> None:
        """All ranks started: pass on a SIGTERM that came while they were starting."""
        self.starting = False
        if self.pending and self._forward():
            self.pending = False

    def restore(self) -> None:
        if not self.installed:
            return
        self.installed = False
        # None: a handler not set from Python; the default is the nearest we can restore
        signal.signal(signal.SIGTERM, signal.SIG_DFL if self.old is None else self.old)
        if self.pending:
            signal.raise_signal(signal.SIGTERM)


# ---------------------------------------------------------------- the rendezvous folder
RDZV_PREFIX = "gnnpar-rdzv-"


def make_rdzv_dir() -> str:
    """A new private ``$TMPDIR/gnnpar-rdzv-<pid>-<random>`` with its owner file."""
    return make_scratch_dir(RDZV_PREFIX)


def remove_stale_rdzv_dirs(root: Optional[str] = None) -> List[str]:
    """Remove rendezvous folders left by gnnpar parents that were killed (see
    :func:`gnnpar.scratch.remove_stale_scratch_dirs`); returns the paths removed."""
    return remove_stale_scratch_dirs(RDZV_PREFIX, root)


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
                raise SpawnError(-1, RankFailure(
                    "error", f"no result within {timeout_s + 60:.0f} s"))
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
        raise SpawnError(silent[0], RankFailure(
            "died", f"process {how} without reporting an error{peers}"))
    # bad input on any rank is the cause (its peers then fail on the broken group); otherwise
    # the earliest report: peers' come after the connection breaks
    first = next((r for r, f in reports.items() if f.kind == "input"), next(iter(reports)))
    raise SpawnError(first, reports[first])
