"""numba kernels written as plain module-level functions, compiled on first use.

numba's disk cache (``cache=True``) finds a compiled function again only when it is defined
at module level. A function jitted inside another function is a closure: numba keys its cache
entry on the captured values (other compiled functions among them), which pickle differently
in every process, so each process added an entry, and processes starting together wrote
their entries under the same file names, so one could load another's code.

So a module writes each kernel as a plain function ``_name`` and calls
:func:`compile_module` when a kernel is first needed: it sets the module global ``name`` to
the compiled ``_name``. Kernels call each other through those globals, which numba resolves
when it compiles the caller (on its first call), so every name is set before anything is
compiled. numba is imported then, not with the module: importing it costs most of a second,
which a process that never runs a kernel should not pay.

:func:`numba_installed` is the one "is numba there?" check, and :func:`sampler_kernels_on`
the samplers' switch between their compiled kernels and the numpy references
(:mod:`gnnpar.sampling.fast`, :mod:`gnnpar.kernels.csr_transpose`).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from typing import Callable, Optional, Sequence

#: ``GNNPAR_SAMPLER_KERNELS=numpy`` runs the samplers' numpy references instead (A/B
#: measurements)
SAMPLER_ENV = "GNNPAR_SAMPLER_KERNELS"

_LOCK = threading.Lock()


def compile_module(module_name: str, names: Sequence[str], wrap: Optional[Callable] = None,
                   **options):
    """The module ``module_name`` with, for each of ``names`` in order, ``module.name`` set
    to ``module._name`` compiled: ``numba.njit(**options)``, or ``wrap`` when given (e.g.
    numba's ``intrinsic``). Returns the module.

    A module global ``prange`` (``range`` until then, so the plain functions also run as
    Python) is set to ``numba.prange`` first: numba makes parallel loops of ``numba.prange``
    only, and its cache does not record the globals a kernel was compiled with.

    Idempotent: once the last name is set a call is one attribute lookup. Threads that call
    together compile once (the names are set under a lock, the last one last)."""
    module = sys.modules[module_name]
    if callable(getattr(module, names[-1], None)):
        return module
    with _LOCK:
        if not callable(getattr(module, names[-1], None)):
            import numba
            if hasattr(module, "prange"):
                module.prange = numba.prange
            wrap = wrap if wrap is not None else numba.njit(**options)
            for name in names:
                setattr(module, name, wrap(getattr(module, "_" + name)))
    return module


@functools.lru_cache(maxsize=None)
def numba_installed() -> bool:
    """Whether numba can be imported, looked up once (callers ask on every product or layer);
    numba itself is not imported."""
    return importlib.util.find_spec("numba") is not None


def sampler_kernels_on() -> bool:
    """The samplers' compiled kernels run: numba importable and not switched off through
    :data:`SAMPLER_ENV`."""
    return os.environ.get(SAMPLER_ENV, "numba") != "numpy" and numba_installed()
