"""Build a rank's distributed SpMM operator from its shard.

``build_operator(algo, shard, comm, norm, device)`` is the one entry the runtimes use; each
algorithm registers a builder here. A builder may also give the operator ``row_ids`` (the
global ids of the rows it owns, when they differ from the shard's) and ``take_rows(shard, a)``.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np
import torch

from gnnpar.datasets import InputError

from .comm import Comm
from .halo import HaloPlan
from .local import as_tensor
from .spmm_1d import Op1D
from .spmm_1d_halo import Op1DHalo
from .spmm_15d import build_15d
from .spmm_2d import build_2d
from .spmm_3d import build_3d_ops
from .spmm_4d import build_4d_ops

BUILDERS: Dict[str, Callable] = {}


def register(name: str):
    def deco(fn):
        BUILDERS[name] = fn
        return fn
    return deco


def shard_values(shard, norm: str) -> np.ndarray:
    if norm not in shard.values:
        raise InputError(f"the shards hold normalisations {sorted(shard.values)}, not {norm!r}; "
                         f"repartition with it")
    return np.asarray(shard.values[norm])


@register("1d-halo")
def _build_1d_halo(shard, comm: Comm, norm: str, device):
    plan = HaloPlan.from_arrays(shard.send_local, shard.send_counts, shard.recv_counts, device)
    return Op1DHalo(comm, shard.indptr, shard.indices, shard_values(shard, norm), shard.n_local,
                    plan, device)


@register("1d")
def _build_1d(shard, comm: Comm, norm: str, device):
    """Columns local+halo → positions in partition order, from every part's id list."""
    with comm.in_phase("setup"):
        sizes = [int(t) for t in torch.cat(comm.all_gather(
            torch.tensor([shard.n_local]), "row"))]
        ids = comm.all_gather(as_tensor(shard.global_ids, np.int64), "row", sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    halo = np.asarray(shard.halo_ids)
    recv = np.concatenate([[0], np.cumsum(shard.recv_counts)])
    halo_pos = np.empty(halo.shape[0], np.int64)
    for q in range(len(sizes)):  # one vectorised lookup per owner rank
        part = halo[recv[q]:recv[q + 1]]
        halo_pos[recv[q]:recv[q + 1]] = offsets[q] + np.searchsorted(ids[q].numpy(), part)
    me = comm.grid.coord("row")
    col_pos = np.concatenate([offsets[me] + np.arange(shard.n_local), halo_pos])
    indices = col_pos[np.asarray(shard.indices)]
    # renumbering breaks the within-row column order only across local/halo; sort each row
    indptr = np.asarray(shard.indptr)
    rows = np.repeat(np.arange(shard.n_local), np.diff(indptr))
    order = np.lexsort((indices, rows))
    return Op1D(comm, indptr, indices[order], shard_values(shard, norm)[order], sizes, device)


@register("1.5d")
def _build_15d(shard, comm: Comm, norm: str, device, variant: str = "halo",
               permute: bool = False, seed: int = 0):
    """``variant="halo"`` by default: it never moves more bytes than ``"bcast"`` (each stage
    block's needed rows are a subset of the block)."""
    return build_15d(shard, comm, shard_values(shard, norm), device, variant, permute, seed)


@register("2d")
def _build_2d(shard, comm: Comm, norm: str, device, variant: str = "halo", permute: bool = False,
              seed: int = 0):
    return build_2d(shard, comm, shard_values(shard, norm), device, variant, permute, seed)


@register("3d")
def _build_3d(shard, comm: Comm, norm: str, device, layers: int = 0, rotate: bool = True,
              permute: bool = False, seed: int = 0):
    """``layers=L`` returns a list of L per-layer operators (axis rotation); 0 → one operator."""
    return build_3d_ops(shard, comm, shard_values(shard, norm), device, layers, rotate, permute,
                        seed)


@register("4d")
def _build_4d(shard, comm: Comm, norm: str, device, **kw):
    return build_4d_ops(shard, comm, shard_values(shard, norm), device, **kw)


def build_operator(algo: str, shard, comm: Comm, norm: str, device=None, **kw):
    if algo not in BUILDERS:
        raise InputError(f"unknown algorithm {algo!r}; choose one of {', '.join(sorted(BUILDERS))}")
    return BUILDERS[algo](shard, comm, norm, device, **kw)


def grid_shape(algo: str, world: int, dims=None, replication: int = 1) -> Dict[str, int]:
    """The named grid an algorithm runs on. ``dims``: (pr, pc) for 2d, (px, py, pz) for 3d,
    (d, px, py, pz) or (px, py, pz) (d = 1) for 4d; ``replication``: c for 1.5d."""
    dims = tuple(int(d) for d in dims) if dims else None
    if algo in ("1d", "1d-halo"):
        return {"row": world}
    if algo == "1.5d":
        c = int(replication)
        if c < 1 or world % c:
            raise InputError(f"--replication {c} must divide the world size {world}")
        return {"row": world // c, "replica": c}
    if algo == "2d":
        if dims is None or len(dims) != 2:
            raise InputError(f"2d needs --grid PRxPC with PR*PC = {world}, got {dims}")
        return {"row": dims[0], "col": dims[1]}
    if algo in ("3d", "4d"):
        if algo == "4d" and dims is not None and len(dims) == 4:
            return {"data": dims[0], "row": dims[1], "col": dims[2], "depth": dims[3]}
        if dims is None or len(dims) != 3:
            raise InputError(f"{algo} needs --grid PXxPYxPZ with product {world}, got {dims}")
        shape = {"row": dims[0], "col": dims[1], "depth": dims[2]}
        return {"data": 1, **shape} if algo == "4d" else shape
    raise InputError(f"unknown algorithm {algo!r}; choose one of {', '.join(sorted(BUILDERS))}")


def _combos(algo: str, axes) -> list:
    """Axis combinations ``algo``'s kernel uses on a grid of ``axes``: all of them together
    (setup exchanges, gradient reduction) and, for 3d/4d, each pair of the cube's axes."""
    combos = [tuple(axes)] if len(axes) > 1 else []
    if algo in ("3d", "4d"):
        inner = ("row", "col", "depth")
        combos += [tuple(a for a in inner if a != b) for b in inner]
    return combos


def make_grid(algo: str, world: int, dims=None, replication: int = 1):
    """A :class:`ProcessGrid` for ``algo`` with every axis combination its kernel and the
    gradient reduction use (all ranks must call this together)."""
    from .grid import ProcessGrid
    shape = grid_shape(algo, world, dims, replication)
    return ProcessGrid.create(shape, world_size=world, combos=_combos(algo, tuple(shape)))


#: algorithms that can run one sampled subgraph on a group of ranks (mini-batch training)
GROUP_ALGOS = ("1d", "1d-halo", "1.5d", "2d", "3d", "4d")


def group_grid_shape(algo: str, world: Optional[int], group_size=None, dims=None,
                     replication: int = 1):
    """``(d, shape)``: d data-parallel groups of ``algo``'s grid ``shape`` (one group's ranks);
    ``world=None`` checks the flags alone (d is then None unless 4d's ``dims`` give it).

    4d: ``dims`` = (d, px, py, pz), or (px, py, pz) with d = world / (px·py·pz); the group's
    shape keeps 4d's axes with ``data`` = 1. 2d/3d: the group is ``dims`` (``group_size``, if
    given, must equal their product). 1d, 1d-halo, 1.5d: ``group_size`` ranks (1.5d splits
    them into (g/c) × c with ``replication`` c).
    """
    if algo not in GROUP_ALGOS:
        raise InputError(f"--algo {algo} cannot run a sampled subgraph on a group of ranks; "
                         f"choose one of {', '.join(GROUP_ALGOS)}")
    dims = tuple(int(x) for x in dims) if dims else None
    if algo == "4d":
        if dims is None or len(dims) not in (3, 4):
            raise InputError(f"4d needs --grid DxPXxPYxPZ (or PXxPYxPZ), got {dims}")
        cube = dims[-3:]
        g = cube[0] * cube[1] * cube[2]
        shape = {"data": 1, "row": cube[0], "col": cube[1], "depth": cube[2]}
        d = dims[0] if len(dims) == 4 else (world // g if world else None)
    else:
        if algo in ("2d", "3d"):
            want = 2 if algo == "2d" else 3
            if dims is None or len(dims) != want:
                raise InputError(f"{algo} needs --grid with {want} sizes whose product is the "
                                 f"group size, got {dims}")
            g = int(np.prod(dims))
        else:
            if group_size is None:
                raise InputError(f"--algo {algo} in mini-batch training needs --group-size")
            g = int(group_size)
        if g < 1:
            raise InputError(f"--group-size must be >= 1, got {g}")
        shape = grid_shape(algo, g, dims, replication)
        d = world // g if world else None
    if group_size is not None and int(group_size) != g:
        raise InputError(f"--group-size {group_size} disagrees with --grid {dims} ({g} ranks per "
                         f"group)")
    if world is not None and (d < 1 or d * g != world):
        if algo == "4d" and len(dims) == 4:
            raise InputError(f"--grid {'x'.join(map(str, dims))} has {d * g} ranks but the world "
                             f"size is {world}")
        raise InputError(f"the world size {world} must be a multiple of the group size {g}")
    return d, shape


def make_group_grid(algo: str, world: int, group_size=None, dims=None, replication: int = 1):
    """``(world grid, group grid)`` for mini-batch training of one sampled subgraph per group.

    The world grid is ``data`` (d groups, varying slowest) × the group's kernel axes, with the
    all-axes group for the gradient reduction; the group grid
    (:class:`~gnnpar.kernels.bipartite.GroupGrid`) is this rank's group alone, ranks numbered
    inside it, so every builder runs on it as on a whole world. All ranks call this together.
    """
    from .bipartite import group_view
    from .grid import ProcessGrid
    d, shape = group_grid_shape(algo, world, group_size, dims, replication)
    kernel = _combos(algo, tuple(shape))
    outer = {"data": d, **{a: s for a, s in shape.items() if a != "data"}}
    wanted = [tuple(a for a in c if a != "data") for c in kernel] + [tuple(outer)]
    combos = []
    for c in wanted:
        if len(c) > 1 and c not in combos:
            combos.append(c)
    grid = ProcessGrid.create(outer, world_size=world, combos=combos)
    return grid, group_view(grid, shape, kernel)
