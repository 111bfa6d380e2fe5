"""4D SpMM: a data-parallel axis ``data`` (size d) over 3D groups, world = d·px·py·pz
(AxoNN's 3D tensor parallelism × data parallelism).

Z = Â · H inside each 3D group exactly as :mod:`spmm_3d` (axes ``row`` × ``col`` × ``depth``,
features split over the third role, Â sharded ≈ m/(px·py·pz) per rank, per-layer rotation);
the ``data`` axis carries only the weight-gradient reduction.

Full-batch training has one graph, hence one 3D group: d must be 1 (an InputError says so
otherwise); the mini-batch trainer gives each data-parallel group its own batches and uses
d > 1. Weights are replicated on every rank and every rank owns distinct rows (within a group)
or a distinct batch (across groups), so the ranks sharing a weight block are all p ranks: the
runtime's one flat all-reduce over every axis reduces each gradient exactly once.

Full batch runs 3d's balanced block layout (``permute=True``, :func:`spmm_3d.options_3d`);
per group, the group's rows as given. Words moved per rank per SpMM: those of 3d; per step add
the gradient all-reduce over all p ranks, 2·(P − chunk_r)·4 bytes for P parameters,
chunk_r = ⌊P/p⌋ + [r < P mod p] (Comm's all_reduce rule), as for every other algorithm.
Shapes: as :mod:`spmm_3d`.
"""
from __future__ import annotations

from gnnpar.datasets import InputError

from .comm import Comm
from .cost_terms import Cost
from .entry import Algorithm, GroupRule
from .spmm_3d import (AXES3, CUBE_PAIRS, build_3d_ops, cube, cube_work, estimate_3d,
                      estimate_moves_3d, exact_3d, matrix_bytes_3d, moves_3d, options_3d)


def build_4d_ops(shard, comm: Comm, norm: str, device=None, full_batch: bool = True, **kw):
    d = comm.grid.shape.get("data")
    if d is None:
        raise InputError(f"4d needs a data x row x col x depth grid, got {comm.grid.describe()}")
    if full_batch and d != 1:
        raise InputError(f"4d in full-batch training needs the data-parallel axis d = 1 (one "
                         f"graph, one 3D group), got d = {d} in grid {comm.grid.describe()}; "
                         f"use d > 1 with mini-batch training")
    return build_3d_ops(shard, comm, norm, device, **kw)


# ---------------------------------------------------------------- registry entry
def data_cube(world: int, dims=None, replication: int = 1) -> dict:
    """``--grid`` DxPXxPYxPZ, or PXxPYxPZ with d = 1."""
    if dims is not None and len(dims) == 4:
        return {"data": dims[0], **cube(world, dims[1:])}
    if dims is None or len(dims) != 3:
        raise InputError(f"4d needs --grid PXxPYxPZ with product {world}, got {dims}")
    return {"data": 1, **cube(world, dims)}


def group_of_cubes(algo, world, group_size, dims, replication):
    """A group is one PXxPYxPZ cube (``data`` = 1 inside it); DxPXxPYxPZ also fixes d."""
    if dims is None or len(dims) not in (3, 4):
        raise InputError(f"4d needs --grid DxPXxPYxPZ (or PXxPYxPZ), got {dims}")
    px, py, pz = dims[-3:]
    return (px * py * pz, {"data": 1, "row": px, "col": py, "depth": pz},
            dims[0] if len(dims) == 4 else None)


#: full batch: 3d's counts (d = 1, the 3d group is the world); ``--algo auto`` ranks 3d
#: instead, so 4d is not listed twice.
SPMM_4D = Algorithm(
    name="4d", axes=("data",) + AXES3, shape=data_cube, builder=build_4d_ops,
    flags=("grid", "block_layout"),
    option_rule=options_3d, extra_combos=CUBE_PAIRS,
    group=GroupRule(group_of_cubes, {"full_batch": False}),
    cost=Cost(exact_3d, estimate_3d, matrix_bytes_3d, work=cube_work, moves=moves_3d,
              moves_estimate=estimate_moves_3d))
