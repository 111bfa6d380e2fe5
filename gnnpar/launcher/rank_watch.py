"""What the parent of local ranks learns of them (:func:`gnnpar.launcher.spawn.spawn`): how a rank
failed, as data (:class:`RankFailure`, raised as :class:`SpawnError`), and the watch over the
running ranks (:class:`Collector`: their results, their exit codes and their heartbeats)
that names the rank to blame on the first sign of failure.
"""
from __future__ import annotations

import queue as queue_mod
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any, List, Optional

from gnnpar.datasets import InputError
from gnnpar.datasets.limits import disk_full_message, is_disk_full

from gnnpar.launcher.watchdog import EXIT_PREEMPTED, looks_like_comm_error


class JoinFailure(RuntimeError):
    """A rank, or a peer, could not join the process group; no rank ran its work."""


@dataclass(frozen=True)
class RankFailure:
    """How a rank failed, carried to the parent as data (never parsed from text): ``kind``
    ``"input"`` (an :class:`~gnnpar.datasets.InputError`, exit 2), ``"join"`` (it or a peer
    could not join the process group, so no rank ran its work: :mod:`gnnpar.launcher.rank_join`),
    ``"exit"`` (``SystemExit``; ``exit_code``) or ``"error"`` as the rank reported it; or, as
    the parent saw it, ``"died"`` (no report), ``"hung"`` (its heartbeat stopped) or
    ``"preempted"`` (SIGTERM; exit code 143); ``message``: the exception's own text or the
    parent's finding; ``detail``: the exception's type and traceback."""

    kind: str
    message: str
    exit_code: Optional[int] = None
    detail: str = ""

    @classmethod
    def of(cls, e: BaseException) -> "RankFailure":
        detail = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        if isinstance(e, InputError):
            return cls("input", str(e), 2, detail)
        if isinstance(e, JoinFailure):
            return cls("join", str(e), None, detail)
        if is_disk_full(e):  # the user's disk, not a bug (as cli_common.run_cli says it)
            return cls("input", disk_full_message(e), 2, detail)
        if isinstance(e, SystemExit):
            return cls("exit", str(e), e.code if isinstance(e.code, int) else 1, detail)
        return cls("error", str(e), None, detail)


class SpawnError(RuntimeError):
    """A child rank failed; ``rank`` is the first one that did, ``failure`` says how."""

    def __init__(self, rank: int, failure: RankFailure):
        how = "lost" if failure.kind in ("died", "hung") else "failed"
        super().__init__(f"rank {rank} {how}: {failure.detail or failure.message}")
        self.rank, self.failure = rank, failure

    @property
    def headline(self) -> str:
        """``rank R failed: Type: message`` — one line."""
        return str(self).splitlines()[0]


POLL_S = 0.2          # how often the parent looks at the queue, the exit codes, the heartbeats
SETTLE_S = 1.0        # after a failure, how long the other ranks' reports may take to arrive
STARTUP_S = 120.0     # a rank's first beat may take this long (interpreter, torch import)
RESULT_GRACE_S = 5.0  # a rank that exited 0 has sent its result by then


def beat_interval(timeout_s: float) -> float:
    """Seconds between a rank's beats: a tenth of ``timeout_s``, within 0.05–1 s."""
    return min(1.0, max(0.05, timeout_s / 10))


def _is_stopped(pid: Optional[int]) -> bool:
    """The process is stopped (SIGSTOP, SIGTSTP), per ``/proc`` (False where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


class Collector:
    """Wait for every rank's result; on the first sign of failure, name the rank to blame.

    **Liveness** comes from heartbeats, not from a deadline on the run (a healthy run may
    take days): each rank's thread bumps its counter every ``beat_s`` (:func:`_beat`), and
    this process notes, on its own clock, when each counter last changed. A rank silent for
    more than ``timeout_s`` is lost (``"hung"``), so a stopped or frozen rank is named within
    ``timeout_s`` plus a poll; before its first beat a rank gets ``STARTUP_S`` (or
    ``timeout_s`` once ``/proc`` shows it stopped). If this process itself saw nothing for a
    while (it was stopped with its ranks, Ctrl-Z then ``fg``, or starved of CPU), it judges
    no silence that spans the gap. A rank that dies is seen at the next poll.

    **Blame.** A rank that died without a report comes first (its peers only see the broken
    connection); then a rank whose heartbeat stopped. A rank whose collective failed (gloo's
    timeout is ``timeout_s`` too) may be waiting for a stopped peer: before that error is
    reported, the parent waits up to ``timeout_s`` for a peer to fall silent, and names that
    peer if one does — the rank that stopped, not the ranks it left waiting. Once a SIGTERM
    was passed on (or a rank died of one), the outcome is a preemption (exit code 143).
    """

    def __init__(self, procs, results, timeout_s, beats, beat_s, sigterm):
        self.procs, self.results, self.timeout_s = procs, results, timeout_s
        self.beats, self.beat_s, self.sigterm = beats, beat_s, sigterm
        self.n = len(procs)
        self.out: List[Any] = [None] * self.n
        self.done: set = set()
        self.reports: dict = {}
        now = time.monotonic()
        self.seen = [0] * self.n  # each rank's last counter value, and when it changed
        self.changed = [now] * self.n
        self.last_look = now
        self.exited_at: dict = {}  # rank -> when it was first seen exited 0 without a result

    def run(self) -> List[Any]:
        while len(self.done) < self.n:
            if not self._drain(POLL_S) or self._silent_deaths() or self._lost() is not None:
                self._fail()
        return self.out

    # ------------------------------------------------------------ what the ranks tell
    def _drain(self, wait_s: float) -> bool:
        """Read the results and reports that arrive within ``wait_s``, and the heartbeats;
        False once a rank has reported a failure."""
        try:
            item = self.results.get(timeout=wait_s) if wait_s else self.results.get_nowait()
            while True:
                rank, ok, value = item
                if ok:
                    self.out[rank] = value
                    self.done.add(rank)
                else:
                    self.reports.setdefault(rank, value)
                item = self.results.get_nowait()
        except queue_mod.Empty:
            pass
        self._read_beats()
        return not self.reports

    def _read_beats(self) -> None:
        now = time.monotonic()
        if now - self.last_look > max(1.5, self.timeout_s / 2):
            self.changed = [now] * self.n  # this process was not running: it saw nothing
        self.last_look = now
        for r in range(self.n):
            beat = self.beats[r]
            if beat != self.seen[r]:
                self.seen[r], self.changed[r] = beat, now

    def _silent_deaths(self) -> List[int]:
        """Ranks that ended without a report: non-zero exit, or exit 0 and no result."""
        now = time.monotonic()
        dead = []
        for r, p in enumerate(self.procs):
            code = p.exitcode
            if code is None or r in self.reports or r in self.done:
                continue
            if code != 0 or now - self.exited_at.setdefault(r, now) > RESULT_GRACE_S:
                dead.append(r)
        return dead

    def _lost(self) -> Optional[tuple]:
        """(rank, seconds silent, stopped?) of a running rank whose heartbeat stopped."""
        now = time.monotonic()
        for r in self._running():
            silent = now - self.changed[r]
            if silent <= self.timeout_s:
                continue
            stopped = _is_stopped(self.procs[r].pid)
            if self.seen[r] or stopped or silent > STARTUP_S:
                return r, silent, stopped
        return None

    def _running(self) -> List[int]:
        return [r for r, p in enumerate(self.procs)
                if p.exitcode is None and r not in self.reports and r not in self.done]

    # ------------------------------------------------------------ the verdict
    def _fail(self) -> None:
        """Raise the :class:`SpawnError` that names the cause (returns only when the sign of
        failure went away: a stopped rank was continued in time)."""
        deadline = time.monotonic() + SETTLE_S  # let the other reports and exit codes arrive
        while self._running() and time.monotonic() < deadline:
            self._drain(POLL_S)
        self._drain(0)
        if self._preempted():
            # the ranks that took the signal write their checkpoints: let them finish
            deadline = time.monotonic() + max(self.timeout_s, STARTUP_S)
            while self._running() and self._lost() is None and time.monotonic() < deadline:
                self._drain(POLL_S)
            raise self._preemption()
        self._raise_dead_or_lost()
        if self.reports and all(f.kind == "error" and looks_like_comm_error(
                (f.detail or f.message).split("\n", 1)[0]) for f in self.reports.values()):
            # a broken collective: its peer may be the one that stopped; its silence shows
            deadline = time.monotonic() + self.timeout_s + 2 * self.beat_s + 1
            while self._running() and time.monotonic() < deadline:
                self._drain(POLL_S)
                self._raise_dead_or_lost()
        if self.reports:
            # bad input on any rank is the cause (its peers then fail on the broken group);
            # otherwise the earliest report: peers' come after the connection breaks
            first = next((r for r, f in self.reports.items() if f.kind == "input"),
                         next(iter(self.reports)))
            raise SpawnError(first, self.reports[first])

    def _raise_dead_or_lost(self) -> None:
        silent = self._silent_deaths()
        if silent:
            code = self.procs[silent[0]].exitcode
            how = (f"killed by signal {-code}" if code < 0 else
                   f"exited with code {code}" if code else "exited without a result")
            peers = f"; {len(self.reports)} peer(s) then failed" if self.reports else ""
            raise SpawnError(silent[0], RankFailure(
                "died", f"process {how} without reporting an error{peers}"))
        lost = self._lost()
        if lost is not None:
            r, silent_s, stopped = lost
            why = "the process is stopped" if stopped else "the process is frozen or deadlocked"
            raise SpawnError(r, RankFailure(
                "hung", f"no heartbeat for {silent_s:.0f} s ({why}; --timeout "
                f"{self.timeout_s:g} s)"))

    def _preempted(self) -> bool:
        return (self.sigterm.received
                or any(p.exitcode == -signal.SIGTERM for p in self.procs)
                or any(f.exit_code == EXIT_PREEMPTED for f in self.reports.values()))

    def _preemption(self) -> "SpawnError":
        """Every failed rank left through its own SIGTERM handler (exit 143, its checkpoint
        written): that rank's report; otherwise a ``"preempted"`` failure (exit 143 too)."""
        took = [r for r, f in self.reports.items() if f.exit_code == EXIT_PREEMPTED]
        others = [r for r, p in enumerate(self.procs)
                  if r not in took and r not in self.done and p.exitcode not in (None, 0)]
        if took and not others:
            return SpawnError(took[0], self.reports[took[0]])
        first = (others or took or [0])[0]
        return SpawnError(first, RankFailure(
            "preempted", f"rank {first} stopped on SIGTERM before it could leave through a "
            "handler of its own", EXIT_PREEMPTED))
