"""A user's own model through ``gnnpar-train --model package.module:factory``.

``factory(f_in, hidden, f_out, layers, dropout)`` returns a ``torch.nn.Module`` whose
``forward(ops, x)`` gives the logits (``f_out`` wide) of the last layer's destination rows:
``ops`` is a :class:`~gnnpar.interfaces.LayerOps` (``ops[i]``: layer i's operator, whatever
the algorithm or mode; ``ops[i](h)`` is Â·h and ``ops[i].num_dst`` its destination rows,
the first rows of ``h``) and ``x`` the input features. Its ``norm`` attribute (``"gcn"``,
``"mean"`` or ``"sum"``; ``"gcn"`` when it has none) picks the Â the runtime builds. The
module is imported by name in every rank, so it must be importable there as in the launching
shell: on ``PYTHONPATH`` or in the working directory (``--nprocs`` ranks inherit both;
``torchrun``/``srun``/``mpirun`` ranks get the shell's).

:func:`check_custom` runs when the command line is read, before any data: it imports the
module, finds the factory and calls it once with the run's ``--hidden``/``--layers``/
``--dropout`` and small stand-in widths, so a missing module, a missing or non-callable
factory, a factory that raises or one that returns something that is not a model (or has an
unknown ``norm``) exits 2 with one line. ``scripts/custom_gnn.py`` is a worked example.
"""
from __future__ import annotations

import importlib

from torch import nn

from gnnpar.datasets import InputError
from gnnpar.datasets.normalize import KINDS

#: widths of the trial build that :func:`check_custom` makes before any data
TRIAL_F_IN, TRIAL_F_OUT = 8, 3


def is_custom(name: str) -> bool:
    """``--model`` names a user's factory (``package.module:factory``)."""
    return ":" in name


def load_factory(name: str):
    """The callable ``name`` (``package.module:factory``) names, or an InputError."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise InputError(f"--model {name}: a custom model is named package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"--model {name}: cannot import {module_name!r} ({exc}); put its "
                         "folder on PYTHONPATH or run from it") from None
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise InputError(f"--model {name}: module {module_name!r} has no {attr!r}")
    if not callable(factory):
        raise InputError(f"--model {name}: {attr!r} in {module_name!r} is not callable (a "
                         "factory(f_in, hidden, f_out, layers, dropout) returning a model)")
    return factory


def build_custom(name: str, f_in: int, hidden: int, f_out: int, layers: int,
                 dropout: float) -> nn.Module:
    """The factory's model, checked: a ``torch.nn.Module`` with a known ``norm``."""
    factory = load_factory(name)
    try:
        model = factory(f_in, hidden, f_out, layers, dropout)
    except Exception as exc:  # noqa: BLE001 - the user's code: one line, not a traceback
        raise InputError(f"--model {name}: the factory raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise InputError(f"--model {name}: the factory returned a {type(model).__name__}, "
                         "not a torch.nn.Module")
    norm = getattr(model, "norm", "gcn")
    if norm not in KINDS:
        raise InputError(f"--model {name}: the model's norm {norm!r} is not one of "
                         f"{', '.join(KINDS)}")
    model.norm = norm
    return model


def check_custom(name: str, hidden: int, layers: int, dropout: float) -> None:
    """Refuse (InputError) a ``--model`` factory that cannot give a model, before any data."""
    build_custom(name, TRIAL_F_IN, hidden, TRIAL_F_OUT, layers, dropout)
