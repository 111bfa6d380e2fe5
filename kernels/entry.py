"""What one algorithm's registry entry says (:class:`Algorithm`), and the rules entries share.

Every distributed SpMM algorithm is one :class:`Algorithm`, written at the end of its kernel
file (``kernels/spmm_*.py``) and listed once in :mod:`gnnpar.kernels.algorithms`. Everything
else — the CLI's ``--algo`` choices and flag checks, the grids, the builders' options, the
mini-batch group layout, the cost model and ``--algo auto`` — reads the entry, never the name.
How to add an algorithm: ``docs/architecture.md``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from gnnpar.datasets import InputError

from .cost_terms import Cost
from .grid import ProcessGrid, group_view

#: the ``gnnpar-train`` flags that describe an algorithm's layout; an entry's ``flags`` says
#: which of them it reads (the others are refused with it).
LAYOUT_FLAGS = ("grid", "replication", "variant", "block_layout")


def _dims(dims) -> Optional[Tuple[int, ...]]:
    return tuple(int(d) for d in dims) if dims else None


# ---------------------------------------------------------------- builder options
def no_options(settings, per_group: bool) -> dict:
    """The builder takes nothing from the run settings."""
    return {}


def variant_option(settings, per_group: bool) -> dict:
    """``variant`` (halo/bcast) when the run gives one; the builder's default otherwise."""
    variant = getattr(settings, "variant", None)
    return {"variant": variant} if variant else {}


def layers_option(settings, per_group: bool) -> dict:
    """Full batch: ``layers`` = the model's layer count (one operator per layer, rotating the
    grid's axes); per group: nothing (one operator for every layer of a sampled block)."""
    return {} if per_group else {"layers": settings.layers}


# ---------------------------------------------------------------- mini-batch groups
def group_of_size(algo: "Algorithm", world, group_size, dims, replication):
    """A group of ``--group-size`` ranks on the algorithm's grid for that many ranks."""
    if group_size is None:
        raise InputError(f"--algo {algo.name} in mini-batch training needs --group-size")
    g = int(group_size)
    if g < 1:
        raise InputError(f"--group-size must be >= 1, got {g}")
    return g, algo.grid(g, dims, replication), None


def group_of_grid(algo: "Algorithm", world, group_size, dims, replication):
    """A group whose grid is ``--grid`` (one size per axis of the algorithm)."""
    want = len(algo.axes)
    if dims is None or len(dims) != want:
        raise InputError(f"{algo.name} needs --grid with {want} sizes whose product is the "
                         f"group size, got {dims}")
    g = int(np.prod(dims))
    if g < 1:
        raise InputError(f"--group-size must be >= 1, got {g}")
    return g, algo.grid(g, dims, replication), None


@dataclass(frozen=True)
class GroupRule:
    """How one data-parallel group of ranks runs the algorithm on a sampled subgraph.

    ``size(algo, world, group_size, dims, replication) -> (g, shape, d)``: the group's rank
    count g, its grid ``shape`` and the number of groups d when the flags fix it (else None:
    d = world / g). ``build_kw``: builder options every per-group operator takes.
    """

    size: Callable
    build_kw: Mapping[str, object] = field(default_factory=dict)


# ---------------------------------------------------------------- the entry
@dataclass(frozen=True)
class Algorithm:
    """One distributed SpMM algorithm.

    name: the ``--algo`` value. axes: its grid's axis names, in rank order.
    shape: ``(world, dims, replication) -> {axis: size}`` — the grid for ``world`` ranks from
      ``--grid`` (a tuple or None) and ``--replication``, raising :class:`InputError` when
      they do not describe one (use :meth:`grid`).
    builder: ``(shard, comm, norm, device, **options) -> operator`` (use :meth:`build`).
    flags: which of :data:`LAYOUT_FLAGS` it reads.
    option_rule: ``(settings, per_group) -> dict``, the builder options taken from the run
      settings (an object with ``layers`` and ``variant``; use :meth:`options`).
    extra_combos: axis combinations its kernel needs beyond each axis and all axes together.
    group: how it runs per group in mini-batch training; None = it cannot.
    cost: its cost-model entry; None = the cost model and ``--algo auto`` skip it.
    """

    name: str
    axes: Tuple[str, ...]
    shape: Callable
    builder: Callable
    flags: Tuple[str, ...] = ()
    option_rule: Callable = no_options
    extra_combos: Tuple[Tuple[str, ...], ...] = ()
    group: Optional[GroupRule] = None
    cost: Optional[Cost] = None

    def grid(self, world: int, dims=None, replication: int = 1) -> Dict[str, int]:
        """The named grid for ``world`` ranks (validated: :class:`InputError` otherwise)."""
        return self.shape(world, _dims(dims), replication)

    def combos(self, axes) -> list:
        """Axis combinations its kernel uses on a grid of ``axes``: all of them together
        (setup exchanges, gradient reduction) and its ``extra_combos``."""
        return ([tuple(axes)] if len(axes) > 1 else []) + [tuple(c) for c in self.extra_combos]

    def build(self, shard, comm, norm: str, device=None, **kw):
        """This rank's operator (collective over ``comm``'s grid)."""
        return self.builder(shard, comm, norm, device, **kw)

    def options(self, settings, per_group: bool = False) -> dict:
        """Builder options for a run whose settings are ``settings`` (full batch, or one
        sampled subgraph per group when ``per_group``)."""
        kw = dict(self.group.build_kw) if per_group and self.group else {}
        kw.update(self.option_rule(settings, per_group))
        return kw

    def make_grid(self, world: int, dims=None, replication: int = 1) -> ProcessGrid:
        """The :class:`ProcessGrid` with every axis combination the kernel and the gradient
        reduction use (all ranks call this together)."""
        shape = self.grid(world, dims, replication)
        return ProcessGrid.create(shape, world_size=world, combos=self.combos(tuple(shape)))

    def group_shape(self, world: Optional[int], group_size=None, dims=None,
                    replication: int = 1):
        """``(d, shape)``: d data-parallel groups of the grid ``shape`` (one group's ranks);
        ``world=None`` checks the flags alone (d is then None unless the flags fix it)."""
        if self.group is None:
            raise InputError(f"--algo {self.name} cannot run a sampled subgraph on a group of "
                             "ranks")
        dims = _dims(dims)
        g, shape, fixed = self.group.size(self, world, group_size, dims, replication)
        d = fixed if fixed is not None else (world // g if world else None)
        if group_size is not None and int(group_size) != g:
            raise InputError(f"--group-size {group_size} disagrees with --grid {dims} ({g} ranks "
                             f"per group)")
        if world is not None and (d < 1 or d * g != world):
            if fixed is not None:
                raise InputError(f"--grid {'x'.join(map(str, dims))} has {d * g} ranks but the "
                                 f"world size is {world}")
            raise InputError(f"the world size {world} must be a multiple of the group size {g}")
        return d, shape

    def make_group_grid(self, world: int, group_size=None, dims=None, replication: int = 1):
        """``(world grid, group grid)`` for mini-batch training of one sampled subgraph per
        group. The world grid is ``data`` (d groups, varying slowest) × the group's kernel
        axes, with the all-axes group for the gradient reduction; the group grid
        (:class:`~gnnpar.kernels.grid.GroupGrid`) is this rank's group alone, ranks numbered
        inside it, so every builder runs on it as on a whole world. All ranks call this."""
        d, shape = self.group_shape(world, group_size, dims, replication)
        kernel = self.combos(tuple(shape))
        outer = {"data": d, **{a: s for a, s in shape.items() if a != "data"}}
        wanted = [tuple(a for a in c if a != "data") for c in kernel] + [tuple(outer)]
        combos = []
        for c in wanted:
            if len(c) > 1 and c not in combos:
                combos.append(c)
        grid = ProcessGrid.create(outer, world_size=world, combos=combos)
        return grid, group_view(grid, shape, kernel)
