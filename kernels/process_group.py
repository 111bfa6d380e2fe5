"""Process groups as gnnpar makes them: a backend for every device type a rank sends.

NCCL carries only CUDA tensors, yet a run on GPUs still reduces host-side values (metrics,
agreement flags, index plans). So a process group that uses NCCL is created with a backend
per device type (:func:`process_group_backend`: ``cpu:gloo,cuda:nccl``): torch routes each
tensor by its device, host tensors over gloo and CUDA tensors over NCCL, and groups made by
``new_group`` inherit it. :func:`routes_of` tells, per group, which backend carries which
device type; :mod:`gnnpar.kernels.comm_rule` refuses a tensor no route carries.

This module calls no collective (:mod:`gnnpar.kernels.comm` is the only one that does,
``init_process_group`` included).
"""
from __future__ import annotations

import importlib
import weakref
from typing import Dict, Tuple

import torch.distributed as dist

from .comm_timing import STREAM_ORDERED_BACKENDS, cuda_device

# Device types each single backend carries (gloo and MPI copy CUDA tensors through the host).
BACKEND_DEVICES = {"gloo": ("cpu", "cuda"), "mpi": ("cpu", "cuda"), "nccl": ("cuda",)}


def process_group_backend(name: str) -> str:
    """The backend string to create a process group with for the backend ``name``.

    A backend without a CPU route gets gloo for CPU tensors: ``nccl`` becomes
    ``cpu:gloo,cuda:nccl`` — one process group, a backend per device type. gloo and MPI
    carry both device types themselves and stay as they are. (``cuda:gloo``, a CUDA-only
    group like NCCL's that a CPU-only machine can build, becomes ``cpu:gloo,cuda:gloo``: the
    tests use it.)
    """
    routes = device_routes(name)
    if "cpu" in routes:
        return name
    return ",".join(f"{d}:{b}" for d, b in {"cpu": "gloo", **routes}.items())


def device_routes(backend: str) -> Dict[str, str]:
    """``{device type: backend}`` of a backend string as :func:`torch.distributed.get_backend`
    gives it (``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"``)."""
    backend = str(backend).lower()
    if ":" in backend:
        return dict(part.split(":", 1) for part in backend.split(","))
    return {d: backend for d in BACKEND_DEVICES.get(backend, ("cpu", "cuda"))}


#: by process group, weakly: a group that ``destroy_process_group`` let go must really go (a
#: cached one kept its gloo threads and rank 0's rendezvous store alive until interpreter exit,
#: where their teardown could abort the process: "terminate called without an active exception")
_ROUTES: "weakref.WeakKeyDictionary[object, Tuple[str, Dict[str, str]]]" = \
    weakref.WeakKeyDictionary()


def routes_of(group) -> Tuple[str, Dict[str, str]]:
    """(backend string, routes) of ``group`` (None: the world), looked up once per group."""
    key = group if group is not None else dist.group.WORLD
    routes = _ROUTES.get(key)
    if routes is None:
        backend = str(dist.get_backend(group))
        routes = _ROUTES[key] = backend, device_routes(backend)
    return routes


def stream_ordered(group, tensors) -> bool:
    """Whether the collective on ``tensors`` runs on a backend whose future completes at the
    enqueue (NCCL for CUDA tensors) rather than when the data has arrived."""
    device = cuda_device(tensors)
    return device is not None and routes_of(group)[1].get("cuda") in STREAM_ORDERED_BACKENDS


def import_dynamo_first() -> None:
    """Import ``torch._dynamo`` now, before the default process group exists, in a rank that
    will build a torch optimizer. Imported after the group exists (torch.optim's constructors
    import it), it keeps ten references to that group (measured, torch 2.13), so
    ``destroy_process_group`` cannot free it: its gloo threads and rank 0's rendezvous store
    then live on into interpreter exit, whose teardown of them can abort the process
    ("terminate called without an active exception", seen under ``mpirun``). The import
    takes about a second, so ranks that train no model (tests of the kernels) skip it."""
    try:
        importlib.import_module("torch._dynamo")
    except Exception:  # noqa: BLE001 - a torch without dynamo holds no such references
        pass
