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
send                  B                                   1
====================  =================================  ==========================

(g is the group size; all_reduce is counted as reduce-scatter + all-gather over g nearly
equal chunks, the first ``numel % g`` one element larger.) Counts are kept per grid axis and
per phase (``forward``, ``backward``, ``grad_sync``, ``eval``, ``setup``). One-rank groups
return at once and count nothing.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .grid import ProcessGrid


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
            dist.broadcast(t, src=self.grid.world_rank(ranks[root_index]), group=group)
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
            dist.all_reduce(t, op=op, group=group)
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
            dist.all_gather(outs, buf, group=group)
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
            dist.reduce_scatter(out, chunks, group=group)
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
            dist.all_to_all_single(out, send.contiguous(), list(map(int, recv_counts)),
                                   list(map(int, send_counts)), group=group)
        return out

    def send(self, t: torch.Tensor, dst: int, axes) -> None:
        self._count(axes, t.numel() * t.element_size(), 1)
        with self._timed():
            dist.send(t.contiguous(), self.grid.world_rank(dst))

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        with self._timed():
            dist.recv(t, self.grid.world_rank(src))
        return t
