"""The algorithm registry: every distributed SpMM algorithm, one :class:`Algorithm` each.

An entry (:mod:`gnnpar.kernels.entry`) holds all an algorithm's facts: its grid axes and
shape rules, builder, the flags and options it reads, how it runs per group in mini-batch
training, and its cost-model entry. The CLI's ``--algo`` choices, the flag checks, the grids,
the cost model and ``--algo auto`` read them from here.

Adding an algorithm is one new kernel file that ends with its ``Algorithm(...)`` and one name
in :data:`BUILTIN` (or, at run time, one :func:`register` call). Insertion order is the order
of the CLI's choices, of messages and of the cost model's ranking ties.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from gnnpar.datasets import InputError

from .entry import Algorithm
from .spmm_15d import SPMM_15D
from .spmm_1d import SPMM_1D
from .spmm_1d_halo import SPMM_1D_HALO
from .spmm_2d import SPMM_2D
from .spmm_3d import SPMM_3D
from .spmm_4d import SPMM_4D

__all__ = ["Algorithm", "ALGORITHMS", "register", "get", "get_grouped", "names", "group_names",
           "cost_names", "make_grid", "group_grid_shape", "make_group_grid"]

BUILTIN = (SPMM_1D, SPMM_1D_HALO, SPMM_15D, SPMM_2D, SPMM_3D, SPMM_4D)

#: name -> entry, in registration order
ALGORITHMS: Dict[str, Algorithm] = {}


def register(entry: Algorithm) -> Algorithm:
    """Add ``entry`` (a name may be registered once)."""
    if entry.name in ALGORITHMS:
        raise ValueError(f"algorithm {entry.name!r} is already registered")
    if entry.name in ("serial", "auto"):
        raise ValueError(f"{entry.name!r} is a reserved --algo value")
    ALGORITHMS[entry.name] = entry
    return entry


for _entry in BUILTIN:
    register(_entry)


def names() -> Tuple[str, ...]:
    """Every registered algorithm's name."""
    return tuple(ALGORITHMS)


def group_names() -> Tuple[str, ...]:
    """The algorithms that can run one sampled subgraph on a group of ranks (mini batch)."""
    return tuple(a.name for a in ALGORITHMS.values() if a.group is not None)


def cost_names() -> Tuple[str, ...]:
    """The algorithms the cost model knows."""
    return tuple(a.name for a in ALGORITHMS.values() if a.cost is not None)


def get(name: str) -> Algorithm:
    """The entry of ``name``; :class:`InputError` listing the choices when there is none."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise InputError(f"unknown algorithm {name!r}; choose one of "
                         f"{', '.join(ALGORITHMS)}") from None


def make_grid(name: str, world: int, dims=None, replication: int = 1):
    """``get(name).make_grid(...)``: the algorithm's :class:`ProcessGrid` (collective)."""
    return get(name).make_grid(world, dims, replication)


def get_grouped(name: str) -> Algorithm:
    """The entry of ``name`` when it can run per group in mini-batch training; otherwise an
    :class:`InputError` listing those that can."""
    entry = ALGORITHMS.get(name)
    if entry is None or entry.group is None:
        raise InputError(f"--algo {name} cannot run a sampled subgraph on a group of ranks; "
                         f"choose one of {', '.join(group_names())}")
    return entry


def group_grid_shape(name: str, world: Optional[int], group_size=None, dims=None,
                     replication: int = 1):
    """``(d, shape)`` of mini-batch training with one sampled subgraph per group of ``name``'s
    ranks (see :meth:`Algorithm.group_shape`)."""
    return get_grouped(name).group_shape(world, group_size, dims, replication)


def make_group_grid(name: str, world: int, group_size=None, dims=None, replication: int = 1):
    """``(world grid, group grid)`` of grouped mini-batch training (collective)."""
    return get_grouped(name).make_group_grid(world, group_size, dims, replication)
