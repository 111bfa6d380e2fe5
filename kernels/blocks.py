"""Setup machinery shared by the grid algorithms (1.5D, 2D, 3D): who owns which vertex,
moving Â's non-zeros to the rank that holds their block, and sparsity-aware plans.

Every grid algorithm keeps the operator contract of :mod:`dist_op`: a rank takes and returns
the rows it *owns*, all features. Ownership is the 1D partition of the shards (rank q owns
part q), or, with ``permute=True``, a seeded random balanced assignment (Plexus-style load
balancing: hubs spread evenly over every block). A *block* of rows or columns is the
concatenation, in a given rank order, of the rows those ranks own; positions inside a block are
``offset of the owner in that order + local index``.

Which ownership the 2D/3D/4D kernels use is the *block layout*: ``"balanced"`` (the random
balanced assignment; what ``gnnpar-train`` runs, :func:`layout_options`) or ``"parts"`` (the
shards' partition). ``"parts"`` inherits the partitioner's balance, so a partition that
balances nodes can leave one rank's block with several times the mean non-zeros; the random
balanced assignment spreads the hubs and keeps every rank near the mean under any partitioner
(block, random, node-balanced METIS, a folder written by an older gnnpar), so it is the default.
``"parts"`` stays reachable where a partition balanced by edges sends less from the busiest
rank. ``tests/test_balance.py`` holds the balanced layout's max/mean non-zeros to its bound.

Everything here runs once, in phase ``setup``; epochs only move H rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np
import torch

from gnnpar.datasets import InputError
from gnnpar.partitioners.grid import balanced_owner

from .comm import Comm
from .halo import HaloPlan
from .local import as_tensor


#: ``block_layout`` values: balanced (random balanced ownership) or the shards' parts
BLOCK_LAYOUTS = ("balanced", "parts")


def layout_options(settings, per_group: bool) -> dict:
    """Builder options of the block layout for a run (an option rule of :mod:`entry`).

    Full batch: ``permute=True`` with the run's seed unless ``settings.block_layout`` (a
    ``gnnpar-train`` flag, when there is one) asks for ``"parts"``. Per group (mini batch): the
    shards' rows, since the sampled subgraph's rows belong to the group's ranks as given."""
    if per_group:
        return {}
    layout = getattr(settings, "block_layout", None) or "balanced"
    if layout not in BLOCK_LAYOUTS:
        raise InputError(f"unknown block layout {layout!r}; "
                         f"choose one of {', '.join(BLOCK_LAYOUTS)}")
    return {"permute": layout == "balanced", "seed": int(getattr(settings, "seed", 0) or 0)}


def layout_owner(options: dict, owner: np.ndarray, p: int) -> np.ndarray:
    """Each vertex's owner rank in the blocks a grid builder makes with ``options`` (its
    :func:`layout_options` among them): the seeded balanced ownership when ``permute``
    (:meth:`Ownership.permuted_over`, the very call the builders make), else ``owner``, the
    shards' partition. The cost model lays Â out with it, so it predicts the blocks the run
    builds."""
    owner = np.asarray(owner, np.int64)
    if not options.get("permute"):
        return owner
    return Ownership.permuted_over(int(owner.shape[0]), p, int(options.get("seed", 0))).owner


def nnz_balance(comm: Comm, ops) -> tuple:
    """(max, mean) over the ranks of the non-zeros of Â each holds (``op.local_nnz``).

    ``ops``: an operator, or the per-layer list of 3d/4d (one per orientation): then the
    orientation whose max/mean is largest. Collective over every axis (all ranks call it); not
    counted as traffic. max/mean is what the busiest rank's local products cost against the
    average rank's."""
    ops = list({id(o): o for o in (ops if isinstance(ops, (list, tuple)) else [ops])}.values())
    axes = world_axes(comm.grid)
    mine = torch.tensor([float(o.local_nnz) for o in ops], dtype=torch.float64)
    top = comm.reduce_control(mine, axes, "max")
    mean = comm.reduce_control(mine, axes, "sum") / comm.grid.world_size
    worst = int(torch.argmax(top / mean.clamp_min(1e-12)))
    return float(top[worst]), float(mean[worst])


def world_axes(grid) -> tuple:
    return tuple(grid.shape)


def coords_of(grid, ranks) -> dict:
    """{axis: coordinate array} of global ranks (row-major layout of :class:`ProcessGrid`)."""
    dims = tuple(grid.shape.values())
    return dict(zip(grid.shape, np.unravel_index(np.asarray(ranks, np.int64), dims)))


def rank_of(grid, coords: dict) -> np.ndarray:
    dims = tuple(grid.shape.values())
    return np.ravel_multi_index(tuple(np.asarray(coords[a], np.int64) for a in grid.shape), dims)


@dataclass
class Ownership:
    """owner (n,) rank of each vertex; local (n,) its index among that rank's rows (ascending
    global id); ids[r] the global ids rank r owns."""

    owner: np.ndarray
    local: np.ndarray
    ids: List[np.ndarray]
    permuted: bool = False

    @classmethod
    def _from_ids(cls, n: int, ids, permuted: bool) -> "Ownership":
        owner = np.empty(n, np.int64)
        local = np.empty(n, np.int64)
        for r, part in enumerate(ids):
            owner[part] = r
            local[part] = np.arange(part.shape[0], dtype=np.int64)
        return cls(owner, local, list(ids), permuted)

    @classmethod
    def from_shard(cls, shard, comm: Comm) -> "Ownership":
        """The shards' 1D partition, learnt by one all-gather of every part's id list."""
        axes = world_axes(comm.grid)
        sizes = [int(t) for t in torch.cat(comm.all_gather(torch.tensor([shard.n_local]), axes))]
        ids = comm.all_gather(as_tensor(shard.global_ids, np.int64), axes, sizes)
        return cls._from_ids(int(shard.n_global), [i.numpy() for i in ids], False)

    @classmethod
    def permuted_over(cls, n: int, p: int, seed: int) -> "Ownership":
        """Seeded random balanced ownership (:func:`partitioners.grid.balanced_owner`, which
        the partition report uses too): every rank computes the same one, no traffic."""
        owner = balanced_owner(n, p, seed)
        order = np.argsort(owner, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=p))])
        return cls._from_ids(n, [order[bounds[r]:bounds[r + 1]] for r in range(p)], True)

    def sizes(self, ranks: Sequence[int]) -> List[int]:
        return [int(self.ids[r].shape[0]) for r in ranks]

    def block_positions(self, ranks: Sequence[int], vertices: np.ndarray):
        """(member index in ``ranks``, local index, position in the block) of each vertex;
        every vertex must be owned by one of ``ranks``."""
        index = np.full(len(self.ids), -1, np.int64)
        index[np.asarray(ranks, np.int64)] = np.arange(len(ranks))
        offsets = np.concatenate([[0], np.cumsum(self.sizes(ranks))]).astype(np.int64)
        member = index[self.owner[vertices]]
        if member.size and member.min() < 0:
            raise AssertionError("a vertex outside the block reached this rank")
        local = self.local[vertices]
        return member, local, offsets[member] + local


def shard_entries(shard, values: np.ndarray):
    """This shard's non-zeros as (row global id, column global id, value)."""
    indptr = np.asarray(shard.indptr)
    rows = np.repeat(np.asarray(shard.global_ids, np.int64), np.diff(indptr))
    return rows, shard.column_ids()[np.asarray(shard.indices)], np.asarray(values, np.float32)


def exchange(comm: Comm, axes, dest: np.ndarray, arrays) -> list:
    """Send entry e of every array to group member ``dest[e]``; returns what arrived (grouped by
    source member, each source's entries in its original order)."""
    g = len(comm.grid.ranks_of(axes))
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=g).astype(np.int64)
    recv = comm.all_to_all(torch.as_tensor(counts).reshape(g, 1), [1] * g, [1] * g, axes)
    recv = [int(c) for c in recv.reshape(-1)]
    return [comm.all_to_all(torch.as_tensor(np.ascontiguousarray(a[order])), counts, recv,
                            axes).numpy() for a in arrays]


def coo_to_csr(rows, cols, vals, shape):
    """CSR arrays (sorted by row, then column) of COO entries without duplicates."""
    order = np.lexsort((cols, rows))
    indptr = np.zeros(shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=shape[0]), out=indptr[1:])
    return indptr, np.asarray(cols, np.int64)[order], np.asarray(vals, np.float32)[order]


def compact_plan(comm: Comm, axis, member: np.ndarray, local: np.ndarray, n_own: int,
                 device=None):
    """Sparsity-aware renumbering of the rows an operator reads (or writes) along ``axis``.

    Entry e refers to row ``local[e]`` of group member ``member[e]``. Own rows keep indices
    ``[0, n_own)``; every *distinct* remote row gets one index after them, grouped by member,
    ascending inside — the order :class:`HaloPlan` moves them in. The owners learn what to send
    with one all-to-all of the requested local indices.

    Returns (extended index of each entry, HaloPlan).
    """
    g = len(comm.grid.ranks_of(axis))
    me = comm.grid.ranks_of(axis).index(comm.grid.rank)
    span = int(max(local.max(initial=0), n_own)) + 1
    key = member.astype(np.int64) * span + local
    remote = member != me
    wanted = np.unique(key[remote])
    ext = np.where(remote, n_own + np.searchsorted(wanted, key), local)
    recv_counts = np.bincount(wanted // span, minlength=g).astype(np.int64)
    send_counts = comm.all_to_all(torch.as_tensor(recv_counts).reshape(g, 1), [1] * g, [1] * g,
                                  axis).reshape(-1).numpy()
    send_local = comm.all_to_all(torch.as_tensor(wanted % span), recv_counts, send_counts, axis)
    return ext, HaloPlan.from_arrays(send_local.numpy(), send_counts, recv_counts, device)


def take_owned_rows(comm: Comm, shard, own: Ownership, array) -> np.ndarray:
    """Rows of a shard array (rows = the shard's vertices) delivered to their owners under
    ``own``, in the owner's local order (used when ``own`` is a permuted ownership)."""
    array = np.asarray(array)
    is_bool = array.dtype == bool  # gloo moves no bool tensors
    if is_bool:
        array = array.astype(np.uint8)
    gids = np.asarray(shard.global_ids, np.int64)
    axes = world_axes(comm.grid)
    got_ids, got = exchange(comm, axes, own.owner[gids], [gids, array])
    out = np.empty_like(got)
    out[own.local[got_ids]] = got
    return out.astype(bool) if is_bool else out
