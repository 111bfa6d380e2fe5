"""Every collective of gnnpar goes through :class:`Comm`, which counts what it moves.

Counts are *logical*, per rank, exact integers the cost model can predict (backends may move
data differently underneath; the count is what the algorithm asks for):

====================  =================================  ==========================
collective            bytes this rank sends               messages this rank sends
====================  =================================  ==========================
broadcast             root: (g−1)·B; others 0             root: g−1
all_gather            (g−1)·B_mine                        g−1
reduce_scatter        B_total − B_mine_chunk              g−1
all_reduce            2·(B − B/g chunk of mine)           2(g−1)
all_to_all            Σ bytes to other ranks              number of non-empty sends
====================  =================================  ==========================

(g is the group size; all_reduce is counted as reduce-scatter + all-gather over g nearly
equal chunks, the first ``numel % g`` one element larger.) Counts are kept per grid axis and
per phase (``forward``, ``backward``, ``grad_sync``, ``eval``, ``setup``). One-rank groups
return at once and count nothing. Control reductions (:func:`control_all_reduce`: epoch
metrics, checkpoint and SIGTERM agreement — a few scalars) are not the algorithm's traffic and
are not counted.

**Padded bytes.** ``all_gather`` and ``reduce_scatter`` move every member's chunk padded to the
largest one (torch's collectives take equal chunks); :attr:`Comm.padded` counts what really
moves, (g−1)·max chunk, beside the logical counts (equal for the other collectives).

**Wire format.** ``Comm(grid, wire_dtype=torch.bfloat16)`` (``--comm-dtype``) sends floating
tensors of the SpMM phases (``forward``, ``backward``, ``eval``) in that dtype and hands them
back in the caller's dtype, so the counted bytes halve exactly. Reductions are summed in fp32:
a low-precision reduce-scatter is an all-to-all of the chunks (the same bytes) summed locally.
``all_reduce`` (the weights' gradient sum), setup traffic, integer tensors and tensors sent with
``exact=True`` (matrix values) keep their dtype.

**Overlap.** ``start_all_to_all`` / ``start_all_gather`` / ``start_reduce_scatter`` issue the
collective asynchronously and return a :class:`Pending` whose ``wait()`` gives the result, so a
kernel computes what it holds while rows are in flight. :attr:`Comm.seconds` is the *exposed*
time (the rank's computation held up by a collective: its issue, a blocking call, a wait);
:attr:`Comm.total_seconds` is each collective's own time from issue to completion, overlapped
or not.

**Timing.** Each collective is timed on the clock that sees it end: the host's for tensors on
the host, CUDA events for CUDA tensors, where NCCL never blocks the host
(:mod:`gnnpar.kernels.comm_timing`: how each is read, and its limitations).
:attr:`Comm.timing` names what the counts since the last reset used.

**The device rule.** This module is the only caller of ``torch.distributed`` collectives,
and each call is checked first (:mod:`gnnpar.kernels.comm_rule`: the rule, its strict
and audit switches); process groups are made with a backend for every device type
(:mod:`gnnpar.kernels.process_group`).
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .comm_rule import AUDIT_ENV, DIST_CALLS, CommDeviceError, CommRuleError, checked
from .comm_timing import CudaEventTimer, Flight, HostTimer, cuda_device, timing_name
from .grid import ProcessGrid
from .process_group import (device_routes, import_dynamo_first, process_group_backend,
                            stream_ordered)

# the rule's and the process groups' names, importable from here too (one import for callers)
__all__ = ["AUDIT_ENV", "DIST_CALLS", "WIRE_DTYPES", "WIRE_PHASES", "Comm", "CommCounts",
           "CommDeviceError", "CommRuleError", "Pending", "control_all_reduce", "device_routes",
           "import_dynamo_first", "init_process_group", "process_group_backend"]

#: ``--comm-dtype`` names → the wire dtype (None: tensors travel as they are)
WIRE_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
#: phases whose floating tensors travel in the wire dtype (``--comm-dtype``)
WIRE_PHASES = ("forward", "backward", "eval")
#: dtypes whose sums are taken in fp32 after the exchange, never on the wire
_LOW_PRECISION = (torch.bfloat16, torch.float16)
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class CommCounts(NamedTuple):
    """What :meth:`Comm.reset` returns: the counters since the last reset."""

    total_bytes: int  #: logical bytes sent, every axis and phase
    by_key: Dict  #: bytes per (axis, phase)
    seconds: float  #: exposed communication seconds


def init_process_group(backend: str, **kw) -> None:
    """``torch.distributed.init_process_group`` with :func:`process_group_backend`'s string
    (the launchers' one way in, so no process group is ever created NCCL-only)."""
    dist.init_process_group(process_group_backend(backend), **kw)


def control_all_reduce(t: torch.Tensor, op: str = "sum", group=None,
                       phase: str = "control") -> torch.Tensor:
    """All-reduce a few control values (metrics, agreement flags) over ``group`` (None: the
    world) and return the result; ``t`` is left as it was. Not counted: these are not the
    algorithm's traffic. Without an initialised process group the values come back as given."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return t
    out = t.clone()
    checked("all_reduce", [out], group, phase,
            lambda: dist.all_reduce(out, op=_REDUCE_OPS[op], group=group))
    return out


def _row_numel(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape[1:]:
        n *= s
    return n


def _chunk(numel: int, g: int, i: int) -> int:
    return numel // g + (1 if i < numel % g else 0)


class Comm:
    """Counted collectives over the axes of one :class:`ProcessGrid`."""

    def __init__(self, grid: ProcessGrid, wire_dtype: Optional[torch.dtype] = None):
        self.grid = grid
        self.wire_dtype = None if wire_dtype == torch.float32 else wire_dtype
        self.phase = "forward"
        self.on_phase = None  # optional callable told each phase change (a watchdog)
        self.bytes: Dict[Tuple[str, str], int] = defaultdict(int)
        self.padded: Dict[Tuple[str, str], int] = defaultdict(int)
        self.messages: Dict[Tuple[str, str], int] = defaultdict(int)
        self._host = HostTimer()
        self._cuda: Dict[torch.device, CudaEventTimer] = {}

    # ------------------------------------------------------------ bookkeeping
    @contextmanager
    def in_phase(self, phase: str):
        old, self.phase = self.phase, phase
        if self.on_phase is not None:
            self.on_phase(phase)
        try:
            yield
        finally:
            self.phase = old
            if self.on_phase is not None:
                self.on_phase(old)

    def _count(self, axes, nbytes: int, msgs: int, padded: Optional[int] = None) -> None:
        key = ("+".join(axes) if not isinstance(axes, str) else axes, self.phase)
        self.bytes[key] += int(nbytes)
        self.padded[key] += int(nbytes if padded is None else padded)
        self.messages[key] += int(msgs)

    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def reset(self) -> CommCounts:
        """Return the counters (:class:`CommCounts`) and zero them."""
        out = CommCounts(self.total_bytes(), dict(self.bytes), self.seconds)
        self.bytes.clear()
        self.padded.clear()
        self.messages.clear()
        for timer in self._timers():
            timer.clear()
        return out

    # ------------------------------------------------------------ timing
    def _timers(self) -> List[HostTimer]:
        return [self._host, *self._cuda.values()]

    def _resolved(self) -> List[HostTimer]:
        for timer in self._timers():
            timer.resolve()
        return self._timers()

    @property
    def seconds(self) -> float:
        """Exposed seconds since the last reset (module docstring); reading them resolves the
        CUDA events recorded since (one synchronize per device that has any)."""
        return sum(t.exposed for t in self._resolved())

    @property
    def total_seconds(self) -> float:
        """Every collective's seconds from issue to completion since the last reset (read as
        :attr:`seconds` is)."""
        return sum(t.total for t in self._resolved())

    @property
    def timing(self) -> str:
        """What the seconds since the last reset were measured with: ``host``,
        ``cuda_events``, both joined by ``+``, or ``none`` when no collective was timed."""
        return timing_name(t.name for t in self._timers() if t.intervals)

    def _timer(self, tensors) -> HostTimer:
        """The timer for a collective on ``tensors``: CUDA events for CUDA tensors, else the
        host clock."""
        device = cuda_device(tensors)
        if device is None:
            return self._host
        if device not in self._cuda:
            self._cuda[device] = CudaEventTimer(device)
        return self._cuda[device]

    @contextmanager
    def _exposed(self, timer: HostTimer):
        start = timer.now()
        try:
            yield
        finally:
            timer.add(start, timer.now(), exposed=True, total=False)

    def _run(self, what: str, tensors, group, call):
        """Run a blocking collective: all of its time is exposed."""
        timer = self._timer(tensors)
        start = timer.now()
        out = checked(what, tensors, group, self.phase, call)
        timer.add(start, timer.now(), exposed=True, total=True)
        return out

    def _start(self, what: str, tensors, group, call, finish) -> "Pending":
        """Issue ``call`` (an ``async_op=True`` collective) and return its :class:`Pending`.
        The collective's end is marked by its future's callback: on the stream that callback
        is handed where the backend's future completes at the enqueue (NCCL), on the host's
        moment where it completes when the data has arrived (gloo, MPI)."""
        timer = self._timer(tensors)
        ordered = stream_ordered(group, tensors)
        flight = Flight(timer, timer.now(), ordered)
        with self._exposed(timer):
            work = checked(what, tensors, group, self.phase, call)
        try:
            work.get_future().then(flight.land)
        except (AttributeError, RuntimeError):  # a backend without futures: wait() marks it
            pass
        return Pending(self, work, finish, flight)

    def _wire(self, t: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """``t`` as it travels: in the wire dtype when one is set and ``t`` is a floating
        tensor of an SpMM phase (module docstring)."""
        if (self.wire_dtype is None or exact or not t.is_floating_point()
                or self.phase not in WIRE_PHASES or t.dtype == self.wire_dtype):
            return t
        return t.to(self.wire_dtype)

    def _g(self, axes):
        return self.grid.group(axes), self.grid.ranks_of(axes)

    # ------------------------------------------------------------ collectives
    def broadcast(self, t: torch.Tensor, root_index: int, axes, exact: bool = False
                  ) -> torch.Tensor:
        """Broadcast ``t`` (in place) from the ``root_index``-th member of the group (in the
        wire dtype unless ``exact``; the root keeps the rounded values too, so every member
        computes with the same numbers)."""
        group, ranks = self._g(axes)
        if len(ranks) == 1:
            return t
        w = self._wire(t, exact)
        if ranks[root_index] == self.grid.rank:
            self._count(axes, w.numel() * w.element_size() * (len(ranks) - 1), len(ranks) - 1)
        src = self.grid.world_rank(ranks[root_index])
        self._run("broadcast", [w], group, lambda: dist.broadcast(w, src=src, group=group))
        if w is not t:
            t.copy_(w)
        return t

    def all_reduce(self, t: torch.Tensor, axes, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """In-place all-reduce of ``t`` over the group (always in ``t``'s own dtype)."""
        group, ranks = self._g(axes)
        g = len(ranks)
        if g == 1:
            return t
        me = ranks.index(self.grid.rank)
        self._count(axes, 2 * (t.numel() - _chunk(t.numel(), g, me)) * t.element_size(),
                    2 * (g - 1))
        self._run("all_reduce", [t], group, lambda: dist.all_reduce(t, op=op, group=group))
        return t

    def all_gather(self, t: torch.Tensor, axes, sizes: Optional[Sequence[int]] = None,
                   exact: bool = False) -> List[torch.Tensor]:
        """Every member's ``t`` (dim 0 may differ: pass all members' ``sizes``), in group order."""
        return self.start_all_gather(t, axes, sizes, exact).wait()

    def start_all_gather(self, t: torch.Tensor, axes, sizes: Optional[Sequence[int]] = None,
                         exact: bool = False) -> "Pending":
        """:meth:`all_gather`, issued; ``wait()`` gives the list."""
        group, ranks = self._g(axes)
        g = len(ranks)
        if g == 1:
            return Pending.ready([t])
        w = self._wire(t.contiguous(), exact)
        sizes = list(sizes) if sizes is not None else [t.shape[0]] * g
        pad = max(sizes)
        row = _row_numel(w) * w.element_size()
        self._count(axes, w.numel() * w.element_size() * (g - 1), g - 1, pad * row * (g - 1))
        buf = w
        if w.shape[0] != pad:
            buf = w.new_zeros((pad,) + tuple(w.shape[1:]))
            buf[:w.shape[0]] = w
        outs = [w.new_empty((pad,) + tuple(w.shape[1:])) for _ in range(g)]

        def finish():
            return [o[:s].to(t.dtype) for o, s in zip(outs, sizes)]
        return self._start("all_gather", [buf], group,
                           lambda: dist.all_gather(outs, buf, group=group, async_op=True), finish)

    def reduce_scatter(self, t: torch.Tensor, axes, sizes: Sequence[int]) -> torch.Tensor:
        """Sum ``t`` over the group and return this member's dim-0 chunk (``sizes`` per member)."""
        return self.start_reduce_scatter(t, axes, sizes).wait()

    def start_reduce_scatter(self, t: torch.Tensor, axes, sizes: Sequence[int]) -> "Pending":
        """:meth:`reduce_scatter`, issued; ``wait()`` gives this member's chunk. In a
        low-precision dtype (the wire's or ``t``'s own) the chunks go by all-to-all and are
        summed here in fp32 (module docstring)."""
        group, ranks = self._g(axes)
        g = len(ranks)
        if g == 1:
            return Pending.ready(t)
        me = ranks.index(self.grid.rank)
        w = self._wire(t.contiguous())
        if w.dtype in _LOW_PRECISION:
            return self._reduce_by_all_to_all(t, w, axes, sizes, me)
        pad = max(sizes)
        row = _row_numel(w) * w.element_size()
        self._count(axes, (w.numel() - sizes[me] * _row_numel(w)) * w.element_size(), g - 1,
                    pad * row * (g - 1))
        chunks = list(torch.split(w, list(sizes), dim=0))
        if any(s != pad for s in sizes):
            padded = [w.new_zeros((pad,) + tuple(w.shape[1:])) for _ in range(g)]
            for p, c in zip(padded, chunks):
                p[:c.shape[0]] = c
            chunks = padded
        out = w.new_empty((pad,) + tuple(w.shape[1:]))
        return self._start("reduce_scatter", chunks, group,
                           lambda: dist.reduce_scatter(out, chunks, group=group, async_op=True),
                           lambda: out[:sizes[me]])

    def _reduce_by_all_to_all(self, t, w, axes, sizes, me) -> "Pending":
        """Reduce-scatter of a low-precision ``w``: member j gets every member's chunk j
        (one all-to-all, the bytes of a reduce-scatter) and sums them in fp32."""
        g = len(sizes)
        pending = self.start_all_to_all(w, list(sizes), [sizes[me]] * g, axes)

        def finish():
            parts = pending.wait().reshape((g, sizes[me]) + tuple(w.shape[1:]))
            return parts.sum(dim=0, dtype=torch.float32).to(t.dtype)
        return Pending.deferred(finish)

    def all_to_all(self, send: torch.Tensor, send_counts: Sequence[int],
                   recv_counts: Sequence[int], axes, exact: bool = False) -> torch.Tensor:
        """Uneven all-to-all along dim 0: ``send_counts[j]`` rows go to member j, and
        ``recv_counts[j]`` rows come from member j (grouped in member order)."""
        return self.start_all_to_all(send, send_counts, recv_counts, axes, exact).wait()

    def start_all_to_all(self, send: torch.Tensor, send_counts: Sequence[int],
                         recv_counts: Sequence[int], axes, exact: bool = False) -> "Pending":
        """:meth:`all_to_all`, issued; ``wait()`` gives the received rows."""
        group, ranks = self._g(axes)
        g = len(ranks)
        if g == 1:
            return Pending.ready(send)
        me = ranks.index(self.grid.rank)
        w = self._wire(send.contiguous(), exact)
        row_bytes = _row_numel(w) * w.element_size()
        others = [c for j, c in enumerate(send_counts) if j != me]
        self._count(axes, sum(others) * row_bytes, sum(1 for c in others if c))
        out = w.new_empty((int(sum(recv_counts)),) + tuple(w.shape[1:]))
        return self._start("all_to_all", [w], group, lambda: dist.all_to_all_single(
            out, w, list(map(int, recv_counts)), list(map(int, send_counts)), group=group,
            async_op=True), lambda: out.to(send.dtype))

    def reduce_control(self, t: torch.Tensor, axes, op: str = "sum") -> torch.Tensor:
        """:func:`control_all_reduce` over the group of ``axes`` (epoch metrics; not counted)."""
        if self.grid.size(axes) == 1:
            return t
        return control_all_reduce(t, op, self.grid.group(axes))


class Pending:
    """A collective in flight: ``wait()`` blocks until it is done (that wait counted as
    exposed time) and returns its result, once."""

    def __init__(self, comm: Optional[Comm], work, finish, flight: Optional[Flight] = None):
        self.comm, self.work, self.finish, self.flight = comm, work, finish, flight
        self._result, self._waited = None, False

    @classmethod
    def ready(cls, value) -> "Pending":
        """A result that needed no communication (a one-member group)."""
        return cls(None, None, lambda: value)

    @classmethod
    def deferred(cls, finish) -> "Pending":
        """A result ``finish`` makes when asked (it waits for what it needs itself)."""
        return cls(None, None, finish)

    def wait(self):
        if not self._waited:
            if self.work is not None:
                with self.comm._exposed(self.flight.timer):
                    self.work.wait()
                self.flight.close()
            self._result, self._waited = self.finish(), True
        return self._result
