"""A user's own model through ``gnnpar-train --model package.module:factory``.

``factory(f_in, hidden, f_out, layers, dropout, **model_args)`` (``model_args``: the
``--model-arg KEY=VALUE`` values, :func:`parse_model_arg`) returns a ``torch.nn.Module`` whose
``forward(ops, x)`` gives the logits (``f_out`` wide) of the last layer's destination rows:
``ops`` is a :class:`~gnnpar.interfaces.LayerOps` (``ops[i]``: layer i's operator, whatever
the algorithm or mode; ``ops[i](h)`` is Â·h and ``ops[i].num_dst`` its destination rows,
the first rows of ``h``) and ``x`` the input features. Its ``norm`` attribute (``"gcn"``,
``"mean"`` or ``"sum"``), or else its layers' one, picks the Â the runtime builds
(:func:`declared_norm`; ``"gcn"`` when none says). A user's *layer* class that its module
registers (:func:`gnnpar.nn.models.register_layer`) is stacked by :class:`gnnpar.nn.models.GNN`
instead (:func:`gnnpar.nn.models.build_model` decides). The
module is imported by name in every rank, as ``python -m`` would: the working directory first,
then ``sys.path`` (``PYTHONPATH`` included). An installed console script such as
``gnnpar-train`` has its own ``bin/`` on ``sys.path``, not the working directory, so
:func:`load_factory` puts the working directory first for the import and keeps it on the path
afterwards, last, so the module's later imports of its neighbours find them while gnnpar's and
torch's own later imports are not shadowed by a file there. Each rank calls it itself:
``--nprocs`` ranks start in the parent's working directory with its ``sys.path``;
``torchrun``/``srun``/``mpirun`` ranks each run ``gnnpar-train`` in the launcher's working
directory.

:func:`gnnpar.nn.models.check_model` runs when the command line is read, before any data: it
imports the module, finds the factory and calls it once with the run's ``--hidden``/
``--layers``/``--dropout``/``--model-arg`` and small stand-in widths, so a missing module, a
module that fails at import (a ``SyntaxError``, with its file and line, or any exception, with
its type), a missing or non-callable factory, a factory that raises or one that returns
something that is not a model (or has an unknown ``norm``) exits 2 with one line.
``scripts/custom_gnn.py`` is a worked example.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import sys
import traceback
from typing import Optional, Tuple, Union

from torch import nn

from gnnpar.datasets import InputError
from gnnpar.datasets.normalize import KINDS

#: widths of the trial build that :func:`gnnpar.nn.models.check_model` makes before any data
TRIAL_F_IN, TRIAL_F_OUT = 8, 3


def is_custom(name: str) -> bool:
    """``--model`` names a user's factory (``package.module:factory``)."""
    return ":" in name


def load_factory(name: str, flag: str = "--model"):
    """The callable ``name`` (``package.module:factory``) names, or an InputError naming
    ``flag`` (``--model``, or ``--decoder`` for a link run's decoder)."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        what = "model" if flag == "--model" else "decoder"
        raise InputError(f"{flag} {name}: a custom {what} is named package.module:factory")
    try:
        with _cwd_first():
            module = importlib.import_module(module_name)
    except ImportError as exc:
        if not _is_missing(exc, module_name):  # found, but it imports something missing
            raise InputError(f"{flag} {name}: importing {module_name!r} raised "
                             f"{_described(exc)}") from None
        raise InputError(f"{flag} {name}: cannot import {module_name!r} ({exc}); put its "
                         "folder on PYTHONPATH or run from it") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code: one line
        raise InputError(f"{flag} {name}: importing {module_name!r} raised "
                         f"{_described(exc)}") from None
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise InputError(f"{flag} {name}: module {module_name!r} has no {attr!r}")
    if not callable(factory):
        want = ("factory(f_in, hidden, f_out, layers, dropout) returning a model"
                if flag == "--model" else "factory(width) returning a decoder")
        raise InputError(f"{flag} {name}: {attr!r} in {module_name!r} is not callable (a "
                         f"{want})")
    return factory


@contextlib.contextmanager
def _cwd_first():
    """The working directory first on ``sys.path`` for the block (as ``python -m`` has it);
    after it, still on the path but last (unless it was there already), so what the module
    imports later is found without the directory shadowing anyone else's imports."""
    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was removed: nothing to add
        yield
        return
    reachable = any(os.path.realpath(p or os.curdir) == os.path.realpath(cwd)
                    for p in sys.path if isinstance(p, str))
    sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a module written since the last import is seen
    try:
        yield
    finally:
        if cwd in sys.path:
            sys.path.remove(cwd)
        if not reachable:
            sys.path.append(cwd)


def _is_missing(exc: ImportError, module_name: str) -> bool:
    """``exc`` says ``module_name`` itself (or a package above it) is not to be found, not
    something the module imports (nor an ImportError its own code raised)."""
    if not isinstance(exc, ModuleNotFoundError):
        return False
    parts = module_name.split(".")
    return exc.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _described(exc: BaseException) -> str:
    """``Type: message (file:line)``: a SyntaxError's own file and line, else the line of
    the innermost frame that raised it (outside Python's import machinery)."""
    if isinstance(exc, SyntaxError):
        where = f" ({exc.filename}:{exc.lineno})" if exc.filename else ""
        return f"{type(exc).__name__}: {exc.msg}{where}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<frozen importlib")
              and os.path.abspath(f.filename) != os.path.abspath(__file__)]
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def build_custom(name: str, f_in: int, hidden: int, f_out: int, layers: int,
                 dropout: float, model_args: Optional[dict] = None) -> nn.Module:
    """The factory's model (``model_args``: ``--model-arg`` values, as keywords), checked: a
    ``torch.nn.Module`` with a known ``norm`` (:func:`declared_norm`)."""
    factory = load_factory(name)
    try:
        model = factory(f_in, hidden, f_out, layers, dropout, **(model_args or {}))
    except Exception as exc:  # noqa: BLE001 - the user's code: one line, not a traceback
        raise InputError(f"--model {name}: the factory raised {type(exc).__name__}: "
                         f"{exc}") from None
    if not isinstance(model, nn.Module):
        raise InputError(f"--model {name}: the factory returned a {type(model).__name__}, "
                         "not a torch.nn.Module")
    model.norm = declared_norm(model, name)
    return model


def declared_norm(model: nn.Module, name: str) -> str:
    """The Â ``model`` asks for: its own ``norm``, else the one ``norm`` its layers declare
    (where users often put it), else ``"gcn"``; an InputError for an unknown norm or layers
    that declare different ones."""
    if hasattr(model, "norm"):
        norms = {model.norm}
    else:
        norms = {m.norm for m in model.modules() if isinstance(getattr(m, "norm", None), str)}
        if len(norms) > 1:
            raise InputError(f"--model {name}: its layers ask for different norms "
                             f"({', '.join(sorted(norms))}); give the model one norm")
    norm = norms.pop() if norms else "gcn"
    if norm not in KINDS:
        raise InputError(f"--model {name}: the model's norm {norm!r} is not one of "
                         f"{', '.join(KINDS)}")
    return norm


def parse_model_arg(text: str) -> Tuple[str, Union[bool, int, float, str]]:
    """``--model-arg KEY=VALUE`` as ``(key, value)``: ``true``/``false`` a bool, an integer
    an int, a finite decimal a float, anything else the string; the key a Python name."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE, KEY a Python name")
    if raw.lower() in ("true", "false"):
        return key, raw.lower() == "true"
    for kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            continue
        if kind is int or math.isfinite(value):
            return key, value
    return key, raw


def model_args_dict(pairs) -> dict:
    """``--model-arg`` pairs as a dict; an InputError for a key given twice."""
    out = {}
    for key, value in pairs or ():
        if key in out:
            raise InputError(f"--model-arg {key} is given twice")
        out[key] = value
    return out
