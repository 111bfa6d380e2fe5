"""Turn a dead or hung peer into one clear error on every rank, and SIGTERM into a checkpoint.

**Heartbeats.** Each rank's :class:`Watchdog` thread writes ``<beat>:<progress>:<state>:<phase>``
to key ``gnnpar/watchdog/<rank>`` of the process group's store every ``interval`` seconds and
reads its peers' keys. Staleness is measured on the reader's own clock (when did the value
last change?), so hosts need not agree on the time. A peer silent for more than ``timeout``
seconds is declared lost: the first rank to notice writes a verdict key, prints::

    gnnpar: rank 2 lost during epoch 3/backward (no heartbeat for 31 s); rank 0 stops

and leaves with ``os._exit(3)``; the other ranks read the verdict and print the same line
(with their own rank) at their next beat, so everyone names the same culprit. When the
store's host dies (rank 0 under ``tcp://`` rendezvous), the store itself fails, which names
that rank. A rank that finishes cleanly (:meth:`Watchdog.stop`) stores ``done`` as its last
beat and then a write-once key ``gnnpar/watchdog/done/<rank>``; a done peer is never reported
lost, and the store's owner waits for every peer's ``done`` key before it leaves. Optional
stall detection (``stall_timeout``) names a rank that is alive but makes no progress while
others wait for it ("hung").

A collective usually fails *before* the heartbeat goes stale (gloo sees the closed socket
at once, with a message that names no rank). Wrap the training loop in :meth:`Watchdog.guard`:
a communication error there waits for the watchdog's verdict instead of surfacing first.

**Preemption.** :func:`on_sigterm` installs a SIGTERM handler. Deferred (default): the
handler only records the signal; the loop calls :meth:`SigtermHook.check` at a safe point
(end of an epoch), where the ranks agree through one all-reduce, all run the callback (write
a checkpoint) and exit with code 143. SLURM sends SIGTERM to every task, then SIGKILL after
``KillWait`` seconds.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Dict, Optional

import torch
import torch.distributed as dist

from gnnpar.kernels.comm import control_all_reduce

EXIT_PEER_LOST = 3
EXIT_PREEMPTED = 128 + signal.SIGTERM
PREFIX = "gnnpar/watchdog"
_COMM_ERROR_WORDS = ("connection", "closed", "timed out", "timeout", "socket", "peer", "gloo",
                     "nccl", "broken pipe", "reset", "store")


def _default_store():
    return dist.distributed_c10d._get_default_store()


def _auto_owner(store) -> Optional[int]:
    """Rank 0 serves a TCPStore made by ``tcp://``/``env://`` init, unless torchrun's agent does."""
    base = store
    while hasattr(base, "underlying_store"):
        base = base.underlying_store
    if isinstance(base, dist.TCPStore) and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return 0
    return None


class Watchdog:
    """Heartbeat monitor of one rank (see the module docstring).

    rank, world_size: this rank and the world. store: a ``torch.distributed`` Store shared by
    all ranks (default: the default process group's). timeout: seconds of heartbeat silence
    that make a peer lost (default 60). interval: seconds between beats (default timeout/10,
    within 0.1–5). store_owner: rank whose death takes the store with it ("auto": rank 0 for
    a TCPStore served by a rank, else None). stall_timeout: seconds without progress of any
    rank before the laggard is named hung (None = off; progress = :meth:`set_phase` calls and
    :meth:`collective` entries/exits).
    watch_parent: also exit when the launching parent process disappears.
    exit_code: status of a rank that stops for a lost peer (default 3).
    """

    def __init__(self, rank: int, world_size: int, store=None, timeout: float = 60.0,
                 interval: Optional[float] = None, store_owner="auto",
                 stall_timeout: Optional[float] = None, watch_parent: bool = False,
                 exit_code: int = EXIT_PEER_LOST, out=None, prefix: str = PREFIX):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.rank, self.world_size = rank, world_size
        self.store = store if store is not None else _default_store()
        self.timeout = float(timeout)
        self.interval = interval or min(5.0, max(0.1, self.timeout / 10))
        self.store_owner = _auto_owner(self.store) if store_owner == "auto" else store_owner
        self.stall_timeout = stall_timeout
        self.exit_code = exit_code
        self.out = out or sys.stderr
        self.prefix = prefix
        self._phase = "startup"
        self._progress = 0
        self._beat = 0
        self._state = "run"
        self._stop = threading.Event()
        self._dying = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        # Held across building *and* storing a beat, so beats land in the order they were
        # built: a beat the thread built before stop() can never overwrite the "done" beat.
        self._publish_lock = threading.Lock()
        self._finished = threading.Event()  # stop() began: this rank finished, raise no alarm
        self._seen: Dict[int, tuple] = {}
        self._changed: Dict[int, float] = {}
        self._progress_changed = 0.0
        self._max_progress = -1
        self._done: set = set()
        self._parent = os.getppid() if watch_parent else None

    # ---------------------------------------------------------------- main-thread API
    def start(self) -> "Watchdog":
        now = time.monotonic()
        self._changed = {r: now for r in range(self.world_size) if r != self.rank}
        self._progress_changed = now
        self._publish()
        self._thread = threading.Thread(target=self._run, name=f"gnnpar-watchdog-{self.rank}",
                                        daemon=True)
        self._thread.start()
        return self

    def set_phase(self, phase: str) -> None:
        """Record what this rank does now (shown when a peer reports it lost or hung)."""
        with self._lock:
            self._phase = phase
            self._progress += 1

    @property
    def current_phase(self) -> str:
        return self._phase

    @contextmanager
    def phase(self, name: str):
        """``with wd.phase("epoch 3/forward"):`` — restores the previous phase after."""
        old = self._phase
        self.set_phase(name)
        try:
            yield
        finally:
            self.set_phase(old)

    @contextmanager
    def collective(self):
        """Mark a wait for peers (wrap each collective): a stall then names the rank that
        never reached it, not the ones waiting in it."""
        with self._lock:
            self._state = "wait"
            self._progress += 1
        try:
            yield
        finally:
            with self._lock:
                self._state = "run"
                self._progress += 1

    @contextmanager
    def guard(self):
        """A communication error inside waits (up to timeout + 2 beats) for the watchdog to
        name the lost rank — it then exits the process — and is re-raised if none is found."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - re-raised unless a verdict ends the process
            if _looks_like_comm_error(e) and self._thread is not None:
                self._thread.join(self.timeout + 3 * self.interval + 2)
                if self._dying.is_set():
                    self._thread.join()  # the verdict is being shared; the exit follows
            raise

    def stop(self) -> None:
        """Mark this rank done and stop beating.

        Order matters: the ``done`` beat is the last one this rank stores (beats are stored
        in the order they are built), then the write-once ``done/<rank>`` key tells every
        checker that this rank's silence from now on is a clean finish, not a loss. From
        here on, this rank's own thread raises no alarm (a store that vanishes is the owner
        that finished too). The store's owner then waits (up to ``timeout``) until every
        peer's ``done`` key is there, so the store outlives its peers' last use of it.
        """
        if self._thread is None:
            return
        self._finished.set()
        with self._lock:
            self._state = "done"
        try:
            if self._publish_lock.acquire(timeout=self.interval * 4 + 5):
                try:
                    self._publish_locked()
                finally:
                    self._publish_lock.release()
            self.store.set(self._done_key(self.rank), str(self._beat))
        except Exception:  # noqa: BLE001 - the store may already be gone at shutdown
            pass
        if self.rank == self.store_owner:
            self._await_peers_done()
        self._stop.set()
        self._thread.join(self.interval * 4 + 5)
        self._thread = None

    def _await_peers_done(self) -> None:
        """(store owner) Keep the store up until every peer wrote its ``done`` key, up to
        ``timeout``; a peer lost meanwhile is named by the still-running thread."""
        pending = [r for r in range(self.world_size) if r != self.rank]
        deadline = time.monotonic() + self.timeout
        while pending and time.monotonic() < deadline and self._thread.is_alive():
            try:
                pending = [r for r in pending
                           if r not in self._done and not self.store.check([self._done_key(r)])]
            except Exception:  # noqa: BLE001 - our own store failing: nothing left to keep up
                return
            if pending:
                time.sleep(min(self.interval / 2, 0.1))

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- watchdog thread
    def _key(self, rank: int) -> str:
        return f"{self.prefix}/{rank}"

    def _done_key(self, rank: int) -> str:
        return f"{self.prefix}/done/{rank}"

    def _publish(self) -> None:
        with self._publish_lock:
            self._publish_locked()

    def _publish_locked(self) -> None:
        with self._lock:
            self._beat += 1
            value = f"{self._beat}:{self._progress}:{self._state}:{self._phase}"
        self.store.set(self._key(self.rank), value)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._publish()
                self._tick(time.monotonic())
            except SystemExit:
                raise
            except Exception as e:  # noqa: BLE001 - a failing store is itself a diagnosis
                if self._stop.is_set() or self._finished.is_set():
                    return  # finished: the store's owner may have finished and left too
                self._store_failed(e)
            if self._parent is not None and os.getppid() != self._parent:
                self._die(f"gnnpar: rank {self.rank}: its launcher (pid {self._parent}) is "
                          "gone", write=False)

    def _is_done(self, r: int) -> bool:
        """Peer ``r`` finished cleanly (its write-once ``done`` key exists)."""
        if r in self._done:
            return True
        if self.store.check([self._done_key(r)]):
            self._done.add(r)
            return True
        return False

    def _tick(self, now: float) -> None:
        if self._finished.is_set() and self.rank != self.store_owner:
            return  # this rank finished cleanly: it judges no one any more (stop() follows)
        verdict = f"{self.prefix}/verdict"
        if self.store.check([verdict]):
            message = self.store.get(verdict).decode()
            self.store.set(f"{self.prefix}/ack/{self.rank}", "1")
            lost = int(self.store.get(f"{self.prefix}/verdict_rank").decode()) \
                if self.store.check([f"{self.prefix}/verdict_rank"]) else -1
            self._die(message, write=False, lost=lost)
        for r in self._changed:
            if r in self._done:
                continue
            key = self._key(r)
            if self.store.check([key]):
                value = self.store.get(key).decode().split(":", 3)
                if value != list(self._seen.get(r, ())):
                    self._seen[r] = tuple(value)
                    self._changed[r] = now
                if value[2] == "done":
                    self._done.add(r)
                    continue
            silent = now - self._changed[r]
            if silent > self.timeout and not self._is_done(r):
                phase = self._seen[r][3] if r in self._seen else "startup (never started)"
                self._die(f"gnnpar: rank {r} lost during {phase} "
                          f"(no heartbeat for {silent:.0f} s)", lost=r)
        if self.stall_timeout:
            self._check_stall(now)

    def _check_stall(self, now: float) -> None:
        progress = {r: int(v[1]) for r, v in self._seen.items() if r not in self._done}
        progress[self.rank] = self._progress
        top = max(progress.values())
        if top != self._max_progress or len(self._seen) < len(self._changed):
            self._max_progress, self._progress_changed = top, now
            return
        stalled = now - self._progress_changed
        if stalled <= self.stall_timeout:
            return
        if any(self._is_done(r) for r in progress if r != self.rank):
            return  # a peer finished meanwhile (its last beat may be in flight): look again
        laggards = sorted(r for r, p in progress.items() if p < top)
        phases = {r: (self._seen[r][3] if r != self.rank else self._phase) for r in progress}
        if laggards:
            r = laggards[0]
            self._die(f"gnnpar: rank {r} hung during {phases[r]} "
                      f"(no progress for {stalled:.0f} s while others wait)")
        self._die(f"gnnpar: all ranks stalled during {phases[self.rank]} "
                  f"(no progress for {stalled:.0f} s)")

    def _store_failed(self, err: Exception) -> None:
        why = " ".join(str(err).split())[:160]
        if self.store_owner is not None and self.store_owner != self.rank:
            if self.store_owner in self._done:
                self._stop.set()  # it finished normally and took the store with it
                return
            seen = self._seen.get(self.store_owner)
            phase = seen[3] if seen else "startup"
            self._die(f"gnnpar: rank {self.store_owner} lost during {phase} "
                      f"(the rendezvous store it served is unreachable: {why})", write=False)
        self._die(f"gnnpar: rank {self.rank} lost the rendezvous store during {self._phase} "
                  f"({why})", write=False)

    def _die(self, verdict: str, write: bool = True, lost: int = -1) -> None:
        """Print ``verdict; rank R stops`` and leave; ``write`` shares it with the peers.

        The store's owner leaves last: its exit takes the store down, so it first waits
        (a few beats at most) until every live peer acknowledged the verdict — otherwise a
        slow peer would find the store gone and blame the owner instead.
        """
        self._dying.set()
        try:
            if write:
                self.store.set(f"{self.prefix}/verdict_rank", str(lost))
                self.store.set(f"{self.prefix}/verdict", verdict)
            if self.rank == self.store_owner:
                self._await_acks(lost)
        except Exception:  # noqa: BLE001 - best effort: others will notice on their own
            pass
        try:
            self.out.write(f"{verdict}; rank {self.rank} stops\n")
            self.out.flush()
        finally:
            os._exit(self.exit_code)

    def _await_acks(self, lost: int) -> None:
        waiting = {r for r in self._changed if r not in self._done and r != lost}
        deadline = time.monotonic() + 2 * self.interval + 5.0
        while waiting and time.monotonic() < deadline:
            waiting = {r for r in waiting if not self.store.check([f"{self.prefix}/ack/{r}"])}
            time.sleep(min(self.interval, 0.1))


def _looks_like_comm_error(e: BaseException) -> bool:
    return looks_like_comm_error(f"{type(e).__name__} {e}") or "dist" in type(e).__name__.lower()


def looks_like_comm_error(text: str) -> bool:
    """An error message that reads like a broken or timed-out collective (it may be a
    symptom of a peer that died or stopped, not the cause)."""
    text = text.lower()
    return any(w in text for w in _COMM_ERROR_WORDS)


# ---------------------------------------------------------------- children of a spawner
def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies (a spawned rank must not
    outlive ``--nprocs``'s parent). Returns False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return True


# ---------------------------------------------------------------- SIGTERM (preemption)
class SigtermHook:
    """Made by :func:`on_sigterm`. ``requested`` is True once this process got the signal."""

    def __init__(self, callback: Callable[[], None], deferred: bool, exit_code: int, signals):
        self.callback = callback
        self.deferred = deferred
        self.exit_code = exit_code
        self.requested = False
        self._old = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum, frame) -> None:
        self.requested = True
        if not self.deferred:
            self.callback()
            raise SystemExit(self.exit_code)

    def any_requested(self, group=None) -> bool:
        """True on every rank when any rank got the signal (one all-reduce when a process
        group exists; all ranks must call it at the same point)."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32)
        return bool(control_all_reduce(flag, "max", group)[0])

    def check(self, group=None) -> None:
        """At a safe point: if any rank was signalled, run the callback here on every rank,
        then raise SystemExit(exit_code).

        Let that exit pass through a ``finally`` that stops the :class:`Watchdog` and calls
        ``torch.distributed.destroy_process_group()`` (as gnnpar's ranks do): a process that
        exits with its heartbeat thread and gloo group still live can abort in C++ teardown
        ("terminate called without an active exception", status -6) instead of exiting 143.
        """
        if self.any_requested(group):
            self.callback()
            raise SystemExit(self.exit_code)

    def uninstall(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}


def on_sigterm(callback: Callable[[], None], deferred: bool = True,
               exit_code: int = EXIT_PREEMPTED, signals=(signal.SIGTERM,)) -> SigtermHook:
    """Install a handler for SIGTERM (SLURM preemption, ``scancel``, a timed-out job).

    deferred=True (default): the handler only records; call ``hook.check()`` at a safe point
    of the loop — all ranks agree, run ``callback()`` (write a checkpoint) and exit with
    ``exit_code`` (143). deferred=False: ``callback()`` runs in the handler at once, then the
    process exits — only for state that is consistent at any instant. Call from the main
    thread.
    """
    return SigtermHook(callback, deferred, exit_code, signals)
