"""Parts that ``.ci/run`` installs (SLURM, munge, iproute2, mpi4py + mpich): where one is
missing, a test skips with the reason on a developer's machine, but fails under CI
(``CI=true``), where a skip would hide a broken install step behind a green run."""
import os
import shutil
import sys

import pytest


def missing(reason: str):
    """Skip (or, under ``CI=true``, fail) the calling test because ``reason``."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} — CI installs this (.ci/run), so it must not be missing there",
                    pytrace=False)
    pytest.skip(reason)


def mpirun() -> str:
    """The ``mpirun`` of this venv's mpich wheel (or the PATH's), or :func:`missing`."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        missing("mpi4py is not installed (pip install mpi4py mpich)")
    exe = shutil.which("mpirun", path=os.path.dirname(sys.executable) + os.pathsep
                       + os.environ.get("PATH", ""))
    if exe is None:
        missing("no mpirun (pip install mpich)")
    return exe
