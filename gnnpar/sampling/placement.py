"""Where mini-batch input is made and kept: ``--sample-on`` and ``--features-on``.

- ``--sample-on host``: numpy samplers on host threads (:mod:`.bulk`); ``device``: the torch
  sampler on the training device (:mod:`.device_sampler`), the replicated topology copied
  there once. ``auto``: ``device`` on a GPU when the run can use it (replicated structure,
  plain data parallel), else ``host``.
- ``--features-on host``: feature rows in host memory, a minibatch's rows gathered there and
  copied from pinned memory on a side stream (:mod:`.staging`); ``device``: the rows on the
  device, gathered there. ``auto``: ``device`` on a GPU when this rank's rows (own + cache),
  plus the topology if sampled there, take at most :data:`DEVICE_SHARE` of the free device
  memory, else ``host``.

On a CPU every choice runs (the device sampler on host tensors; features are host memory
either way), with a note saying so: CI exercises the same code paths a GPU run takes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from gnnpar.datasets import InputError

SITES = ("auto", "host", "device")
#: the share of free device memory ``--features-on auto`` lets the input data take
DEVICE_SHARE = 0.5


@dataclass(frozen=True)
class Placement:
    """The resolved sites (``host``/``device``) and the notes explaining any fallback."""

    sample_on: str
    features_on: str
    notes: Tuple[str, ...] = ()


def free_device_bytes(device: torch.device) -> int:
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def resolve_placement(sample_on: str, features_on: str, device, *, replicated: bool,
                      grouped: bool, feature_bytes: int, topo_bytes: int) -> Placement:
    """Decide both sites for a run on ``device`` (see module docstring)."""
    for flag, value in (("--sample-on", sample_on), ("--features-on", features_on)):
        if value not in SITES:
            raise InputError(f"{flag} must be one of {', '.join(SITES)}, got {value!r}")
    device = torch.device(device)
    notes = []
    why_not = ("--no-replicate-graph keeps the structure partitioned" if not replicated else
               "grouped mini batch (--algo/--group-size) splits blocks on the host"
               if grouped else None)
    if sample_on == "device" and why_not:
        raise InputError(f"--sample-on device needs the replicated structure and plain data "
                         f"parallelism; here {why_not}: use --sample-on host")
    if device.type == "cpu":
        if sample_on == "device":
            notes.append("--sample-on device: the training device is the CPU, so the device "
                         "sampler runs on host tensors")
        if features_on == "device":
            notes.append("--features-on device: the training device is the CPU, features "
                         "are host memory either way")
        return Placement("device" if sample_on == "device" else "host", "host", tuple(notes))
    if sample_on == "auto":
        sample_on = "host" if why_not else "device"
        if why_not:
            notes.append(f"--sample-on auto: sampling on the host ({why_not})")
    need = feature_bytes + (topo_bytes if sample_on == "device" else 0)
    if features_on != "host":
        free = free_device_bytes(device)
        if features_on == "device" and need > free:
            raise InputError(f"--features-on device: the rows need {need / 2**30:.2f} GiB, "
                             f"{free / 2**30:.2f} GiB is free on {device}; use --features-on "
                             f"host")
        if features_on == "auto":
            features_on = "device" if need <= DEVICE_SHARE * free else "host"
            if features_on == "host":
                notes.append(f"--features-on auto: {need / 2**30:.2f} GiB of input data is more "
                              f"than {DEVICE_SHARE:.0%} of the {free / 2**30:.2f} GiB free on "
                              f"{device}; rows stay in host memory (pinned copies)")
    return Placement(sample_on, features_on, tuple(notes))
