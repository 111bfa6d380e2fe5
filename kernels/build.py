"""Name-based lookups on the algorithm registry (:mod:`gnnpar.kernels.algorithms`), kept for
callers that hold an ``--algo`` string: ``build_operator(algo, shard, comm, norm, device)`` is
``get(algo).build(shard, comm, norm, device)``, and so on. New code reads the entry itself.
"""
from __future__ import annotations

from typing import Dict

from .algorithms import (ALGORITHMS, get, group_grid_shape, group_names, make_grid,
                         make_group_grid)
from .comm import Comm
from .dist_op import shard_values

__all__ = ["build_operator", "grid_shape", "make_grid", "group_grid_shape", "make_group_grid",
           "shard_values"]


def build_operator(algo: str, shard, comm: Comm, norm: str, device=None, **kw):
    """This rank's operator of ``algo`` (collective over ``comm``'s grid)."""
    return get(algo).build(shard, comm, norm, device, **kw)


def grid_shape(algo: str, world: int, dims=None, replication: int = 1) -> Dict[str, int]:
    """The named grid ``algo`` runs on for ``world`` ranks (see :meth:`Algorithm.grid`)."""
    return get(algo).grid(world, dims, replication)


def __getattr__(name: str):
    """``BUILDERS`` (name -> builder) and ``GROUP_ALGOS`` (the algorithms that run per group in
    mini batch), read from the registry when asked for."""
    if name == "BUILDERS":
        return {n: a.builder for n, a in ALGORITHMS.items()}
    if name == "GROUP_ALGOS":
        return group_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
