"""Moving a ready minibatch onto the training device without stopping the device.

Each sampler worker owns a :class:`Stager`. On a CUDA device it owns a side stream: the
worker's device work for a macrobatch (the device sampler's kernels, feature gathers, and
host → device copies of host-made blocks and rows, from pinned memory with
``non_blocking=True``) is queued there, so it runs while the trainer's step runs on the
compute stream; an event recorded at the end marks the macrobatch ready. The trainer calls
:func:`take` on each minibatch before using it: the compute stream waits for that event (a
device-side wait, the host does not block) and every tensor of the batch is recorded on the
compute stream so the caching allocator does not hand its memory back to the side stream
while the step still reads it.

Elsewhere (CPU training, or the plain ``inline`` service) a Stager is the identity: tensors
are used where they are, and nothing waits.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch


def concrete_device(device) -> torch.device:
    """``cuda`` as ``cuda:N`` (the current GPU), so that device comparisons are exact."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class Stager:
    """One worker's side stream and copies (module docstring). The side stream starts after
    everything already queued on the default stream (the topology and the worker's scratch
    arrays made there)."""

    def __init__(self, device, side_stream: bool = True):
        self.device = concrete_device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda and side_stream else None
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.default_stream(self.device))

    def context(self):
        """Queue the device work of the enclosed code on this worker's side stream."""
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the training device; a host tensor goes through pinned memory, queued
        on the side stream (call inside :meth:`context`)."""
        if not self.cuda or t.device.type == "cuda":
            return t.to(self.device)
        if self.stream is None:
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def operator_to_device(self, op):
        """A host :class:`~gnnpar.kernels.local.SparseOperator` moved by :meth:`to_device`."""
        if not self.cuda or op.A.device.type == "cuda":
            return op
        op.A, op.AT = (_csr_to(m, self.to_device) for m in (op.A, op.AT))
        return op

    def seal(self) -> Optional["torch.cuda.Event"]:
        """An event after everything queued so far on the side stream (None elsewhere)."""
        if self.stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev


def _csr_to(m: torch.Tensor, move) -> torch.Tensor:
    return torch.sparse_csr_tensor(move(m.crow_indices()), move(m.col_indices()),
                                   move(m.values()), size=tuple(m.shape), check_invariants=False)


def _tensors_of(batch):
    yield batch.x
    yield batch.y
    for op in batch.ops or ():
        for m in (op.A, op.AT):
            yield m.crow_indices()
            yield m.col_indices()
            yield m.values()


def take(batch):
    """Make ``batch`` safe to use on the current (compute) stream; returns it."""
    ev = getattr(batch, "ready", None)
    if ev is None:
        return batch
    stream = torch.cuda.current_stream(batch.x.device)
    stream.wait_event(ev)
    for t in _tensors_of(batch):
        if t is not None and t.is_cuda:
            t.record_stream(stream)
    return batch
