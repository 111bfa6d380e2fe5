"""Where a rank's full-batch rows live: its device and the runtime that holds its rows and
their operator, the same for training (:mod:`gnnpar.training.rank`) and inference
(:mod:`gnnpar.infer.prediction`)."""
from __future__ import annotations

from typing import Union

import torch

from gnnpar.datasets import Graph
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.comm import WIRE_DTYPES

from gnnpar.training.distributed import DistRuntime
from gnnpar.interfaces import Shard
from gnnpar.training.serial import SerialRuntime
from gnnpar.cli.spec import RunSpec


def rank_device(spec: RunSpec, rank: int) -> torch.device:
    """The spec's device; a bare ``cuda`` becomes one GPU per local rank."""
    device = torch.device(spec.train.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    return device


def fullbatch_runtime(spec: RunSpec, world: int, data: Union[Graph, Shard], norm: str,
                      device, watchdog=None):
    """The full-batch runtime of ``spec`` over ``data``: the serial one for the whole graph,
    else ``spec.parallel.algo``'s over this rank's shard (training and inference alike)."""
    if isinstance(data, Graph):
        return SerialRuntime(data, norm, device)
    entry = algorithm(spec.parallel.algo)
    process_grid = entry.make_grid(world, spec.parallel.grid_dims, spec.parallel.replication or 1)
    runtime = DistRuntime(process_grid, data, entry, norm, device,
                          WIRE_DTYPES[spec.parallel.comm_dtype], **entry.options(spec.settings()))
    if watchdog is not None:
        runtime.comm.on_phase = watchdog.set_phase
    return runtime
