"""gnnpar: distributed graph neural network training.

Subpackages ``gnnpar.datasets``, ``gnnpar.partitioners`` and ``gnnpar.kernels`` live in the
top-level folders ``datasets/``, ``partitioners/`` and ``kernels/`` of the source tree and are
installed under this namespace (``package_dir`` in setup.cfg).

Thread settings made on import, before torch is imported (``gnnpar-train``, ``python -m
gnnpar.…`` and the scripts import gnnpar first; spawned ranks inherit the environment):

- ``GOMP_SPINCOUNT`` = :data:`GOMP_SPINCOUNT` (10000) unless ``GOMP_SPINCOUNT`` or
  ``OMP_WAIT_POLICY`` is already set. After each parallel region, GNU OpenMP (torch's and
  MKL's threads) spins 300000 times before a thread sleeps when neither is set (a few ms);
  with sampler threads running beside the trainer (:mod:`gnnpar.sampling.service`) that
  spinning takes the cores the samplers would run on. 10000 (~0.1 ms) still keeps the
  threads awake across back-to-back ops. Set either variable to choose otherwise, e.g.
  ``OMP_WAIT_POLICY=active`` (spin) or ``GOMP_SPINCOUNT=300000`` (libgomp's own default).
  A process that imported torch before gnnpar keeps what its OpenMP runtime read then.
"""
import importlib as _importlib
import os as _os

__version__ = "0.1.0"

#: GNU OpenMP's spin count after a parallel region unless the environment says otherwise
GOMP_SPINCOUNT = "10000"
if "GOMP_SPINCOUNT" not in _os.environ and "OMP_WAIT_POLICY" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = GOMP_SPINCOUNT

# Flat layout: run from a source checkout (tests, ``python -m gnnpar.train``), ``./gnnpar`` is
# found before any installed copy, and it has no ``kernels/`` inside. Let the package also search
# the checkout root, so ``gnnpar.kernels`` resolves to ``./kernels`` exactly as when installed.
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "kernels")) and all(
        _os.path.isfile(_os.path.join(_root, sub, "__init__.py"))
        for sub in ("datasets", "partitioners", "kernels")):
    __path__.append(_root)  # noqa: F821  (package __path__)


from gnnpar import _moved  # noqa: E402  (old module paths keep working, with a warning)

_moved.install()

#: the library's functions, each imported from its module on first use (PEP 562), so that
#: ``import gnnpar`` stays light (no torch) for the tools that do not need them
_API = {"load_model": "gnnpar.infer.saved_model", "predict": "gnnpar.predict",
        "register_layer": "gnnpar.nn.models"}


def __getattr__(name):
    if name in _API:
        return getattr(_importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'gnnpar' has no attribute {name!r}")
