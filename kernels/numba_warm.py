"""Imported by the fork server (:data:`gnnpar.launcher.rank_start.PRELOAD`): numba's CPU
compiler set up once, so that no forked rank sets it up again.

A process's first compiled kernel — compiled or loaded from numba's disk cache alike — first
builds numba's typing and target contexts: LLVM's target machine, and the registrations of
every type and lowering numba ships (its ``refresh``, which imports the modules of its numpy
and scipy support). That takes about half a second of CPU, and every rank paid it on its
first SpMM, dropout or sampler kernel; after it, a kernel's load from the cache takes a few
hundredths (``docs/performance.md``, "The test suite"). Importing this module builds both
contexts and compiles, loads and runs nothing: no kernel exists yet, no threading layer is
loaded and numba's thread pool does not start, so forking the server stays as safe as it was.
The one thread it adds is scipy's OpenBLAS pool, of the kind numpy's OpenBLAS already runs in
the server (OpenBLAS stops its pools around a ``fork``).
"""
from __future__ import annotations

from numba.core.registry import cpu_target

cpu_target.typing_context.refresh()
cpu_target.target_context.refresh()
