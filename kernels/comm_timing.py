"""The clocks :class:`~gnnpar.kernels.comm.Comm` times its collectives with.

Each collective gives two times: *exposed* (the rank's computation held up by it: its issue,
a blocking call, a wait) and *total* (from issue to completion, overlapped or not). Both must
be read on the clock that sees the collective end, and that depends on where its tensors are
(the name is what :attr:`Comm.timing` reports and the epoch record's ``comm_timing`` says):

- ``host`` (:class:`HostTimer`, tensors on the host): ``time.perf_counter``. gloo's and MPI's
  ``wait()`` returns, and their future completes, when the data has arrived.
- ``cuda_events`` (:class:`CudaEventTimer`, CUDA tensors): CUDA events on the device's clock.
  NCCL's ``wait()`` only makes the current stream wait, and its future completes when the
  collective is *enqueued*, so host clocks read about 0 there. The start event is recorded on
  the current stream (where the rank's kernels run) at the issue, so it fires when the kernels
  that make the collective's input are done; the end event is recorded in the future's
  callback — on the stream NCCL's future hands it, which has waited for the collective, or, on
  a backend whose future completes on the host when the data has arrived (gloo on CUDA
  tensors), on a stream of the timer's own that holds nothing else. Exposed time is the
  current stream's time between events just before and just after the issue and each wait:
  the stream stood still there whether a stream wait (NCCL) or the host being blocked (gloo)
  held it. The events are resolved when the seconds are read (at the end of an epoch), with
  one device synchronize, never one per collective.

  Limitations: where the host runs behind the device, the events around a wait also hold the
  host's own time in the call (the stream was idle anyway); a collective whose future ran no
  callback by the time it is waited for ends at the wait — on NCCL after the kernels queued
  before the wait on the current stream.

Nothing here calls ``torch.distributed``: :mod:`gnnpar.kernels.comm` issues the collectives
and hands each one's marks to a timer (:class:`Flight` for one in flight).
"""
from __future__ import annotations

import threading
import time
from typing import Iterable, List, Optional

import torch

#: backends whose CUDA work completes on a stream, not on the host: ``wait()`` and the future
#: return at the enqueue (module docstring)
STREAM_ORDERED_BACKENDS = ("nccl",)


def cuda_device(tensors) -> Optional[torch.device]:
    """The CUDA device of the first CUDA tensor among ``tensors`` (None: all on the host)."""
    return next((t.device for t in tensors if t.device.type == "cuda"), None)


def timing_name(names: Iterable[str]) -> str:
    """The name of seconds measured by the timers ``names`` (each ``host``, ``cuda_events``,
    ``none``, or such names joined by ``+``): the distinct timers, sorted, joined by ``+``;
    ``none`` when there are none. It also names the sum of several ``Comm`` objects' seconds
    (a grouped mini-batch engine's world and group traffic)."""
    parts = {p for name in names for p in name.split("+") if p and p != "none"}
    return "+".join(sorted(parts)) or "none"


class HostTimer:
    """Collective times on the host clock (``time.perf_counter``), added as they are taken
    (``host`` in :attr:`Comm.timing`; module docstring).

    A mark is a float; :meth:`add` counts the seconds between two marks as exposed, total or
    both. ``intervals``: how many were counted since :meth:`clear`."""

    name = "host"

    def __init__(self):
        self.exposed = self.total = 0.0
        self.intervals = 0

    def now(self, stream_ordered: bool = False):
        """A mark of this moment (``stream_ordered``: see :meth:`CudaEventTimer.now`)."""
        return time.perf_counter()

    def add(self, start, end, exposed: bool, total: bool) -> None:
        self.intervals += 1
        self._count(end - start, exposed, total)

    def _count(self, seconds: float, exposed: bool, total: bool) -> None:
        seconds = max(seconds, 0.0)
        self.exposed += seconds if exposed else 0.0
        self.total += seconds if total else 0.0

    def resolve(self) -> None:
        """Fold in whatever is still pending (nothing: host times are added as taken)."""

    def clear(self) -> None:
        self.exposed = self.total = 0.0
        self.intervals = 0


class CudaEventTimer(HostTimer):
    """Collective times on one CUDA device's clock, from CUDA events (``cuda_events`` in
    :attr:`Comm.timing`; module docstring).

    A mark is an event recorded on a stream of ``device``; :meth:`add` queues the pair and
    :meth:`resolve` synchronizes the device once and counts every queued pair's elapsed time,
    so timing adds no synchronize per collective."""

    name = "cuda_events"

    def __init__(self, device):
        super().__init__()
        self.device = torch.device(device)
        self._queued: List[tuple] = []
        self._idle = torch.cuda.Stream(self.device)  # holds only end marks (``now``)

    def now(self, stream_ordered: bool = True):
        """An event recorded now. ``stream_ordered``: on the current stream — the one the
        rank's kernels run on, or, inside an NCCL future's callback, the stream it hands over,
        which has waited for the collective. Otherwise (a collective whose completion the host
        has just seen, such as gloo's) on an empty stream of the timer's own, so the event
        marks this moment and not the end of the kernels queued on the current stream."""
        stream = torch.cuda.current_stream(self.device) if stream_ordered else self._idle
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def add(self, start, end, exposed: bool, total: bool) -> None:
        self.intervals += 1
        self._queued.append((start, end, exposed, total))

    def resolve(self) -> None:
        if not self._queued:
            return
        torch.cuda.synchronize(self.device)
        queued, self._queued = self._queued, []
        for start, end, exposed, total in queued:
            self._count(start.elapsed_time(end) / 1e3, exposed, total)

    def clear(self) -> None:
        super().clear()
        self._queued.clear()


class Flight:
    """One issued collective's time from ``start`` (marked before the issue) to its end,
    marked by its future's callback (:meth:`land`) or, failing that, when it is waited for;
    the first mark stands (the callback may run on a backend thread)."""

    def __init__(self, timer: HostTimer, start, stream_ordered: bool):
        self.timer, self.start, self.stream_ordered = timer, start, stream_ordered
        self.end = None
        self._lock = threading.Lock()

    def land(self, fut=None) -> None:
        with self._lock:
            if self.end is None:
                self.end = self.timer.now(self.stream_ordered)

    def close(self) -> None:
        self.land()
        self.timer.add(self.start, self.end, exposed=False, total=True)
