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

**The device rule.** This module is the only caller of ``torch.distributed`` collectives
(``tests/test_comm_rule.py`` fails on any other). Every call goes through one checked
entry that refuses a tensor whose device type the process group has no backend for, so the
mistake is a clear :class:`CommDeviceError` on any machine instead of NCCL's "No backend type
associated with device type cpu" on a GPU cluster. Process groups that use NCCL are created
with a backend per device type (:func:`process_group_backend`: ``cpu:gloo,cuda:nccl``), so
host-side tensors (index plans, counts, metrics) travel on gloo and CUDA tensors on NCCL;
groups made by ``new_group`` inherit it.

Two switches for tests: ``GNNPAR_COMM_STRICT=1`` makes any ``torch.distributed`` collective
called from another gnnpar module raise :class:`CommRuleError` at once (the test suite sets
it for every process it starts); ``GNNPAR_COMM_AUDIT=PATH`` appends one JSON line per
collective (operation, devices, dtypes, phase, backend, caller) to ``PATH.<pid>``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .grid import ProcessGrid


AUDIT_ENV, STRICT_ENV = "GNNPAR_COMM_AUDIT", "GNNPAR_COMM_STRICT"
# The torch.distributed calls only this module makes (tests/test_comm_rule.py reads it).
DIST_CALLS = ("all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce",
              "all_to_all", "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast",
              "broadcast_object_list", "gather", "gather_object", "init_process_group",
              "irecv", "isend", "monitored_barrier", "recv", "reduce", "reduce_scatter",
              "reduce_scatter_tensor", "scatter", "scatter_object_list", "send")
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
# Device types each single backend carries (gloo and MPI copy CUDA tensors through the host).
_BACKEND_DEVICES = {"gloo": ("cpu", "cuda"), "mpi": ("cpu", "cuda"), "nccl": ("cuda",)}


class CommDeviceError(RuntimeError):
    """A collective was handed a tensor on a device its process group cannot carry."""


class CommRuleError(RuntimeError):
    """A gnnpar module called a ``torch.distributed`` collective itself (strict mode)."""


def _guard(name: str, fn):
    def guarded(*args, **kw):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("gnnpar") and caller != __name__:
            raise CommRuleError(f"{caller} called torch.distributed.{name} directly; every "
                                "collective goes through gnnpar.kernels.comm (counted, checked)")
        return fn(*args, **kw)
    guarded.gnnpar_guarded = True
    return guarded


def _install_strict_guards() -> None:
    for name in DIST_CALLS:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "gnnpar_guarded", False):
            setattr(dist, name, _guard(name, fn))


def process_group_backend(name: str) -> str:
    """The backend string to create a process group with for the backend ``name``.

    NCCL carries only CUDA tensors, and a run on GPUs still reduces host-side values
    (metrics, agreement flags, index plans), so a backend without a CPU route gets gloo for
    CPU tensors: ``nccl`` becomes ``cpu:gloo,cuda:nccl`` — one process group, a backend per
    device type (torch routes each tensor by its device). gloo and MPI carry both device types
    themselves and stay as they are. (``cuda:gloo``, a CUDA-only group like NCCL's that a
    CPU-only machine can build, becomes ``cpu:gloo,cuda:gloo``: the tests use it.)
    """
    routes = device_routes(name)
    if "cpu" in routes:
        return name
    return ",".join(f"{d}:{b}" for d, b in {"cpu": "gloo", **routes}.items())


def init_process_group(backend: str, **kw) -> None:
    """``torch.distributed.init_process_group`` with :func:`process_group_backend`'s string
    (the launchers' one way in, so no process group is ever created NCCL-only)."""
    dist.init_process_group(process_group_backend(backend), **kw)


def device_routes(backend: str) -> Dict[str, str]:
    """``{device type: backend}`` of a backend string as :func:`torch.distributed.get_backend`
    gives it (``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"``)."""
    backend = str(backend).lower()
    if ":" in backend:
        return dict(part.split(":", 1) for part in backend.split(","))
    return {d: backend for d in _BACKEND_DEVICES.get(backend, ("cpu", "cuda"))}


_ROUTES: Dict[object, Tuple[str, Dict[str, str]]] = {}


def _routes_of(group) -> Tuple[str, Dict[str, str]]:
    """(backend string, routes) of ``group`` (None: the world), looked up once per group."""
    key = group if group is not None else dist.group.WORLD
    if key not in _ROUTES:
        backend = str(dist.get_backend(group))
        _ROUTES[key] = backend, device_routes(backend)
    return _ROUTES[key]


def _outside_caller() -> str:
    f = sys._getframe(1)
    while f is not None and f.f_globals.get("__name__") == __name__:
        f = f.f_back
    return "?" if f is None else f"{f.f_globals.get('__name__')}:{f.f_code.co_name}"


def _audit(op: str, tensors, backend: str, phase: str) -> None:
    path = os.environ.get(AUDIT_ENV)
    if not path:
        return
    rec = {"op": op, "phase": phase, "backend": backend,
           "devices": sorted({t.device.type for t in tensors}),
           "dtypes": sorted({str(t.dtype) for t in tensors}), "caller": _outside_caller()}
    with open(f"{path}.{os.getpid()}", "a") as f:
        f.write(json.dumps(rec) + "\n")


def _collective(what: str, tensors, group, phase: str, call):
    """The one place a ``torch.distributed`` collective runs: check that the group has a
    backend for every tensor's device type, record it when auditing, then call it."""
    backend, routes = _routes_of(group)
    for t in tensors:
        if t.device.type not in routes:
            raise CommDeviceError(
                f"{what} was given a {t.device.type} tensor ({t.dtype}, shape "
                f"{tuple(t.shape)}, phase {phase}, from {_outside_caller()}) but the process "
                f"group's backend {backend!r} carries only {', '.join(sorted(routes))} "
                "tensors; create the group with gnnpar.kernels.comm.process_group_backend()")
    _audit(what, tensors, backend, phase)
    return call()


def control_all_reduce(t: torch.Tensor, op: str = "sum", group=None,
                       phase: str = "control") -> torch.Tensor:
    """All-reduce a few control values (metrics, agreement flags) over ``group`` (None: the
    world) and return the result; ``t`` is left as it was. Not counted: these are not the
    algorithm's traffic. Without an initialised process group the values come back as given."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return t
    out = t.clone()
    _collective("all_reduce", [out], group, phase,
                lambda: dist.all_reduce(out, op=_REDUCE_OPS[op], group=group))
    return out


if os.environ.get(STRICT_ENV) == "1":
    _install_strict_guards()


def _row_numel(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape[1:]:
        n *= s
    return n


def _chunk(numel: int, g: int, i: int) -> int:
    return numel // g + (1 if i < numel % g else 0)


class Comm:
    """Counted collectives over the axes of one :class:`ProcessGrid`."""

    def __init__(self, grid: ProcessGrid):
        self.grid = grid
        self.phase = "forward"
        self.on_phase = None  # optional callable told each phase change (a watchdog)
        self.bytes: Dict[Tuple[str, str], int] = defaultdict(int)
        self.messages: Dict[Tuple[str, str], int] = defaultdict(int)
        self.seconds = 0.0

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

    def _count(self, axes, nbytes: int, msgs: int) -> None:
        key = ("+".join(axes) if not isinstance(axes, str) else axes, self.phase)
        self.bytes[key] += int(nbytes)
        self.messages[key] += int(msgs)

    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def reset(self) -> Tuple[int, Dict, float]:
        """Return (total bytes, per-(axis, phase) bytes, seconds) and zero the counters."""
        out = (self.total_bytes(), dict(self.bytes), self.seconds)
        self.bytes.clear()
        self.messages.clear()
        self.seconds = 0.0
        return out

    @contextmanager
    def _timed(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t

    def _run(self, what: str, tensors, group, call):
        return _collective(what, tensors, group, self.phase, call)

    def _g(self, axes):
        return self.grid.group(axes), self.grid.ranks_of(axes)

    # ------------------------------------------------------------ collectives
    def broadcast(self, t: torch.Tensor, root_index: int, axes) -> torch.Tensor:
        """Broadcast ``t`` (in place) from the ``root_index``-th member of the group."""
        group, ranks = self._g(axes)
        if len(ranks) == 1:
            return t
        if ranks[root_index] == self.grid.rank:
            self._count(axes, t.numel() * t.element_size() * (len(ranks) - 1), len(ranks) - 1)
        with self._timed():
            src = self.grid.world_rank(ranks[root_index])
            self._run("broadcast", [t], group, lambda: dist.broadcast(t, src=src, group=group))
        return t

    def all_reduce(self, t: torch.Tensor, axes, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """In-place all-reduce of ``t`` over the group."""
        group, ranks = self._g(axes)
        g = len(ranks)
        if g == 1:
            return t
        me = ranks.index(self.grid.rank)
        self._count(axes, 2 * (t.numel() - _chunk(t.numel(), g, me)) * t.element_size(), 2 * (g - 1))
        with self._timed():
            self._run("all_reduce", [t], group, lambda: dist.all_reduce(t, op=op, group=group))
        return t

    def all_gather(self, t: torch.Tensor, axes, sizes: Optional[Sequence[int]] = None
                   ) -> List[torch.Tensor]:
        """Every member's ``t`` (dim 0 may differ: pass all members' ``sizes``), in group order."""
        group, ranks = self._g(axes)
        g = len(ranks)
        if g == 1:
            return [t]
        t = t.contiguous()
        self._count(axes, t.numel() * t.element_size() * (g - 1), g - 1)
        sizes = list(sizes) if sizes is not None else [t.shape[0]] * g
        pad = max(sizes)
        buf = t.new_zeros((pad,) + tuple(t.shape[1:]))
        buf[:t.shape[0]] = t
        outs = [t.new_empty((pad,) + tuple(t.shape[1:])) for _ in range(g)]
        with self._timed():
            self._run("all_gather", [buf], group, lambda: dist.all_gather(outs, buf, group=group))
        return [o[:s] for o, s in zip(outs, sizes)]

    def reduce_scatter(self, t: torch.Tensor, axes, sizes: Sequence[int]) -> torch.Tensor:
        """Sum ``t`` over the group and return this member's dim-0 chunk (``sizes`` per member)."""
        group, ranks = self._g(axes)
        g = len(ranks)
        if g == 1:
            return t
        me = ranks.index(self.grid.rank)
        self._count(axes, (t.numel() - sizes[me] * _row_numel(t)) * t.element_size(), g - 1)
        t = t.contiguous()
        pad = max(sizes)
        chunks = list(torch.split(t, list(sizes), dim=0))
        if any(s != pad for s in sizes):
            padded = [t.new_zeros((pad,) + tuple(t.shape[1:])) for _ in range(g)]
            for p, c in zip(padded, chunks):
                p[:c.shape[0]] = c
            chunks = padded
        out = t.new_empty((pad,) + tuple(t.shape[1:]))
        with self._timed():
            self._run("reduce_scatter", chunks, group,
                      lambda: dist.reduce_scatter(out, chunks, group=group))
        return out[:sizes[me]]

    def all_to_all(self, send: torch.Tensor, send_counts: Sequence[int],
                   recv_counts: Sequence[int], axes) -> torch.Tensor:
        """Uneven all-to-all along dim 0: ``send_counts[j]`` rows go to member j, and
        ``recv_counts[j]`` rows come from member j (grouped in member order)."""
        group, ranks = self._g(axes)
        g = len(ranks)
        if g == 1:
            return send
        me = ranks.index(self.grid.rank)
        row_bytes = _row_numel(send) * send.element_size()
        others = [c for j, c in enumerate(send_counts) if j != me]
        self._count(axes, sum(others) * row_bytes, sum(1 for c in others if c))
        out = send.new_empty((int(sum(recv_counts)),) + tuple(send.shape[1:]))
        with self._timed():
            self._run("all_to_all", [send], group, lambda: dist.all_to_all_single(
                out, send.contiguous(), list(map(int, recv_counts)),
                list(map(int, send_counts)), group=group))
        return out

    def reduce_control(self, t: torch.Tensor, axes, op: str = "sum") -> torch.Tensor:
        """:func:`control_all_reduce` over the group of ``axes`` (epoch metrics; not counted)."""
        if self.grid.size(axes) == 1:
            return t
        return control_all_reduce(t, op, self.grid.group(axes))
