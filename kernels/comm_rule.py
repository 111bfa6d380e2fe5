"""The device rule: every collective is checked, and only :mod:`gnnpar.kernels.comm` calls
``torch.distributed`` collectives (``tests/test_comm_rule.py`` fails on any other module).

:func:`checked` is the one entry every call of :mod:`~gnnpar.kernels.comm` goes through: it
refuses a tensor whose device type the process group has no backend for
(:func:`gnnpar.kernels.process_group.routes_of`), so the mistake is a clear
:class:`CommDeviceError` on any machine instead of NCCL's "No backend type associated with
device type cpu" on a GPU cluster.

Two switches for tests: ``GNNPAR_COMM_STRICT=1`` makes any ``torch.distributed`` collective
called from another gnnpar module raise :class:`CommRuleError` at once (the test suite sets
it for every process it starts; installed when this module is first imported);
``GNNPAR_COMM_AUDIT=PATH`` appends one JSON line per collective (operation, devices, dtypes,
phase, backend, caller) to ``PATH.<pid>``.
"""
from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

from .process_group import routes_of

AUDIT_ENV, STRICT_ENV = "GNNPAR_COMM_AUDIT", "GNNPAR_COMM_STRICT"
#: the module allowed to call the collectives
COMM_MODULE = "gnnpar.kernels.comm"
# The torch.distributed calls only that module makes (tests/test_comm_rule.py reads it).
DIST_CALLS = ("all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce",
              "all_to_all", "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast",
              "broadcast_object_list", "gather", "gather_object", "init_process_group",
              "irecv", "isend", "monitored_barrier", "recv", "reduce", "reduce_scatter",
              "reduce_scatter_tensor", "scatter", "scatter_object_list", "send")


class CommDeviceError(RuntimeError):
    """A collective was handed a tensor on a device its process group cannot carry."""


class CommRuleError(RuntimeError):
    """A gnnpar module called a ``torch.distributed`` collective itself (strict mode)."""


def _guard(name: str, fn):
    def guarded(*args, **kw):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("gnnpar") and caller != COMM_MODULE:
            raise CommRuleError(f"{caller} called torch.distributed.{name} directly; every "
                                f"collective goes through {COMM_MODULE} (counted, checked)")
        return fn(*args, **kw)
    guarded.gnnpar_guarded = True
    return guarded


def _install_strict_guards() -> None:
    for name in DIST_CALLS:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "gnnpar_guarded", False):
            setattr(dist, name, _guard(name, fn))


def outside_caller() -> str:
    """``module:function`` of the nearest caller outside this module and ``comm``."""
    f = sys._getframe(1)
    while f is not None and f.f_globals.get("__name__") in (__name__, COMM_MODULE):
        f = f.f_back
    return "?" if f is None else f"{f.f_globals.get('__name__')}:{f.f_code.co_name}"


def _audit(op: str, tensors, backend: str, phase: str) -> None:
    path = os.environ.get(AUDIT_ENV)
    if not path:
        return
    rec = {"op": op, "phase": phase, "backend": backend,
           "devices": sorted({t.device.type for t in tensors}),
           "dtypes": sorted({str(t.dtype) for t in tensors}), "caller": outside_caller()}
    with open(f"{path}.{os.getpid()}", "a") as f:
        f.write(json.dumps(rec) + "\n")


def checked(what: str, tensors, group, phase: str, call):
    """Run ``call`` (a collective of :mod:`gnnpar.kernels.comm`) once the group is known to
    have a backend for every tensor's device type, recording it when auditing."""
    backend, routes = routes_of(group)
    for t in tensors:
        if t.device.type not in routes:
            raise CommDeviceError(
                f"{what} was given a {t.device.type} tensor ({t.dtype}, shape "
                f"{tuple(t.shape)}, phase {phase}, from {outside_caller()}) but the process "
                f"group's backend {backend!r} carries only {', '.join(sorted(routes))} "
                "tensors; create the group with gnnpar.kernels.comm.process_group_backend()")
    _audit(what, tensors, backend, phase)
    return call()


if os.environ.get(STRICT_ENV) == "1":
    _install_strict_guards()
