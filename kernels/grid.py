"""The process grid: named axes over the world, validated once, groups built once.

Ranks are laid out row-major over the axes in the order given (the last axis varies
fastest). For ``ProcessGrid.create({"row": 2, "col": 3})`` rank 4 has coordinates
``row=1, col=1``. Every kernel receives the grid explicitly; nothing reads module globals.

A one-rank world needs no initialised process group: every group is ``None`` and the
communication layer returns early.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Sequence, Tuple

import torch.distributed as dist

from gnnpar.datasets import InputError

AXES = ("data", "replica", "row", "col", "depth")


def parse_grid(text: str) -> Tuple[int, ...]:
    """``"2x3"`` → (2, 3); positive integers only."""
    try:
        dims = tuple(int(t) for t in text.lower().split("x"))
    except ValueError:
        raise InputError(f"grid must look like AxB or AxBxC with positive integers, got {text!r}")
    if not dims or any(d < 1 for d in dims):
        raise InputError(f"grid must look like AxB or AxBxC with positive integers, got {text!r}")
    return dims


@dataclass
class ProcessGrid:
    """Named axes whose sizes multiply to the world size.

    shape: ordered ``{axis: size}``; rank: this process; coords: its index on each axis;
    groups: ``{axes_tuple: ProcessGroup or None}`` for each axis and each requested
    combination; members: the global ranks of each of this rank's groups, in axis order.
    """

    shape: Dict[str, int]
    rank: int = 0
    coords: Dict[str, int] = field(default_factory=dict)
    groups: Dict[Tuple[str, ...], Optional[object]] = field(default_factory=dict)
    members: Dict[Tuple[str, ...], Tuple[int, ...]] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        size = 1
        for s in self.shape.values():
            size *= s
        return size

    def size(self, axes) -> int:
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        out = 1
        for a in axes:
            out *= self.shape[a]
        return out

    def coord(self, axis: str) -> int:
        return self.coords[axis]

    def group(self, axes):
        return self.groups[(axes,) if isinstance(axes, str) else tuple(axes)]

    def ranks_of(self, axes) -> Tuple[int, ...]:
        return self.members[(axes,) if isinstance(axes, str) else tuple(axes)]

    def world_rank(self, member: int) -> int:
        """The ``torch.distributed`` rank of grid rank ``member`` (the same here; a
        data-parallel group's view numbers its ranks from 0 and overrides this)."""
        return member

    def rank_at(self, **coords) -> int:
        """Global rank of the process at these coordinates (missing axes: this rank's)."""
        r = 0
        for a, s in self.shape.items():
            r = r * s + coords.get(a, self.coords[a])
        return r

    @classmethod
    def create(cls, shape: Dict[str, int], world_size: Optional[int] = None,
               rank: Optional[int] = None, combos: Iterable[Sequence[str]] = ()) -> "ProcessGrid":
        """Validate ``shape`` against the world and build each axis's groups (all ranks call
        this together, in the same order). ``combos`` asks for groups spanning several axes."""
        for a, s in shape.items():
            if a not in AXES:
                raise InputError(f"unknown grid axis {a!r}; axes are {', '.join(AXES)}")
            if not isinstance(s, int) or s < 1:
                raise InputError(f"grid axis {a} must be a positive integer, got {s!r}")
        initialised = dist.is_available() and dist.is_initialized()
        if world_size is None:
            world_size = dist.get_world_size() if initialised else 1
        if rank is None:
            rank = dist.get_rank() if initialised else 0
        grid = cls(dict(shape), rank)
        if grid.world_size != world_size:
            dims = "x".join(f"{s}" for s in shape.values())
            names = "x".join(shape)
            raise InputError(f"grid {dims} ({names}) has {grid.world_size} ranks but the world "
                             f"size is {world_size}")
        rem = rank
        for a, s in reversed(list(shape.items())):
            grid.coords[a] = rem % s
            rem //= s
        wanted = [(a,) for a in shape] + [tuple(c) for c in combos]
        for axes in wanted:
            grid._build(axes, initialised and world_size > 1)
        return grid

    def _build(self, axes: Tuple[str, ...], distributed: bool) -> None:
        others = [a for a in self.shape if a not in axes]
        mine = None
        for fixed in itertools.product(*(range(self.shape[a]) for a in others)):
            pinned = dict(zip(others, fixed))
            ranks = tuple(self.rank_at(**pinned, **dict(zip(axes, free)))
                          for free in itertools.product(*(range(self.shape[a]) for a in axes)))
            group = dist.new_group(list(ranks)) if distributed and len(ranks) > 1 else None
            if self.rank in ranks:
                mine = (ranks, group)
        self.members[axes], self.groups[axes] = mine

    def describe(self) -> str:
        return "x".join(str(s) for s in self.shape.values()) + " (" + "x".join(self.shape) + ")"


@dataclass
class GroupGrid(ProcessGrid):
    """One data-parallel group's view of a world grid: ranks numbered ``0 … g−1`` inside the
    group (``rank`` = world rank − ``offset``), the group's process groups underneath."""

    offset: int = 0

    def world_rank(self, member: int) -> int:
        return member + self.offset


def group_view(world: ProcessGrid, shape: Dict[str, int], combos: Sequence[Sequence[str]]
               ) -> GroupGrid:
    """The sub-grid ``shape`` of this rank's slice of ``world`` along its leading ``data`` axis.

    ``shape`` may name ``data`` with size 1 (4d's kernel axes); every other axis must be an
    axis of ``world``, and each combination in ``combos`` (minus ``data``) must have been
    built on ``world``. The group's ranks are contiguous (``data`` varies slowest), so local
    ranks keep the world grid's row-major order.
    """
    size = 1
    for s in shape.values():
        size *= s
    offset = world.coord("data") * size
    grid = GroupGrid(dict(shape), world.rank - offset, offset=offset)
    grid.coords = {a: (0 if a == "data" else world.coord(a)) for a in shape}
    for axes in [(a,) for a in shape] + [tuple(c) for c in combos]:
        inner = tuple(a for a in axes if a != "data")
        if not inner:
            grid.members[axes], grid.groups[axes] = (grid.rank,), None
            continue
        grid.members[axes] = tuple(m - offset for m in world.ranks_of(inner))
        grid.groups[axes] = world.group(inner)
    return grid
