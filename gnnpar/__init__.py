"""gnnpar: distributed graph neural network training.

Subpackages ``gnnpar.datasets``, ``gnnpar.partitioners`` and ``gnnpar.kernels`` live in the
top-level folders ``datasets/``, ``partitioners/`` and ``kernels/`` of the source tree and are
installed under this namespace (``package_dir`` in setup.cfg).
"""
import os as _os

__version__ = "0.1.0"

# Flat layout: run from a source checkout (tests, ``python -m gnnpar.train``), ``./gnnpar`` is
# found before any installed copy, and it has no ``kernels/`` inside. Let the package also search
# the checkout root, so ``gnnpar.kernels`` resolves to ``./kernels`` exactly as when installed.
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "kernels")) and all(
        _os.path.isfile(_os.path.join(_root, sub, "__init__.py"))
        for sub in ("datasets", "partitioners", "kernels")):
    __path__.append(_root)  # noqa: F821  (package __path__)
