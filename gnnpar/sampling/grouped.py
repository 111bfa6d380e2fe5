"""Grouped mini-batch training: a group of g ranks runs one sampled subgraph with a
distributed SpMM, d = world / g groups train data parallel.

``--algo {1d,1d-halo,1.5d,2d,3d} --group-size g`` (2d/3d: ``--grid`` of g ranks) and
``--algo 4d --grid DxPXxPYxPZ`` (D groups of a PX×PY×PZ cube, AxoNN's 4D). Ranks
``[k·g, (k+1)·g)`` form group k (:func:`gnnpar.kernels.algorithms.make_group_grid`).

Per step, in group k:

1. **Same minibatch on every member.** The group's seeds are the training seeds of its
   members' shards together, and :class:`~gnnpar.sampling.seeds.EpochPlan` runs with
   ``stream = k``: every member draws the same seeds with the same generator, hence the same
   blocks (structure replicated or partitioned, as in plain data parallelism).
2. **Dst-first ownership** (:mod:`gnnpar.kernels.bipartite`): the block-local ids are split
   evenly over the g members, layer by layer, an id preferring the member that holds its
   feature row. Each member cuts its :class:`~gnnpar.kernels.bipartite.BlockShard` of every
   block (sampler thread, no communication) and fetches features only for the input rows it
   owns (the usual :class:`~gnnpar.sampling.features.FeatureStore` all-to-all, so
   ``feat_bytes`` stays exact).
3. **Distributed SpMM.** The trainer thread builds ``algo``'s full-batch operator on each
   block's square embedding over the group's sub-grid (:class:`GroupEngine`); a layer sees
   ``num_dst`` = its owned destination rows. The loss is each member's owned seeds.
4. **Gradients.** Weights are replicated on every rank and each seed's loss lives on exactly
   one rank of one group, so "reduced over the data axis d" is one all-reduce over the
   whole world (every rank's partial gradient summed once) — the data-parallel all-reduce
   over d of gradients already summed inside each group, done as one collective.

Counters: ``comm_bytes`` adds, per step, the group's kernel traffic (forward, backward) and
the builders' setup traffic (each block is a new graph). ``sampled_edges`` and
``input_nodes`` count each group's minibatches once (its first member reports them);
``unique_input_nodes``, ``feat_bytes`` and the cache figures are every member's own fetches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from gnnpar.interfaces import CommStats
from gnnpar.kernels.algorithms import get_grouped
from gnnpar.kernels.bipartite import block_shard, build_bipartite, dst_first_owner
from gnnpar.kernels.comm import WIRE_DTYPES, Comm
from gnnpar.kernels.comm_timing import timing_name

from gnnpar.sampling.blocks import Block
from gnnpar.training.minibatch_loop import DataParallel
from gnnpar.sampling.service import MacrobatchService, ReadyBatch


@dataclass
class _Share:
    """This member's part of one minibatch: a shard per block, its owned input ids."""

    shards: list
    input_ids: np.ndarray
    seed_owner: np.ndarray  #: the member of each of the step's seeds (block order)


class GroupedService(MacrobatchService):
    """The macrobatch service of member ``me`` of a g-rank group whose first world rank is
    ``offset``; ``labels`` = (the group's seed ids sorted, their labels), or None where the
    steps read no label (link prediction: a batch's ``y`` is zeros)."""

    def __init__(self, topo, store, plan, sampler, cfg, labels, comms, me: int, g: int,
                 offset: int):
        seed_ids, seed_labels = labels if labels is not None else (None, None)
        super().__init__(topo, store, plan, sampler, cfg, seed_labels, comms)
        self.seed_ids = None if seed_ids is None else np.asarray(seed_ids, np.int64)
        self.me, self.g, self.offset, self.norm = int(me), int(g), int(offset), sampler.kind
        self.counts_sampling = self.me == 0

    def share(self, blocks: List[Block]) -> _Share:
        first = blocks[0]
        member = self.store.owner[first.src_ids].astype(np.int64) - self.offset
        prefer = np.where((member >= 0) & (member < self.g), member, -1)
        bounds = [b.num_dst for b in reversed(blocks)] + [first.num_src]
        owner = dst_first_owner(bounds, self.g, prefer)
        shards = [block_shard(b.indptr, b.indices, b.values, owner[:b.num_src], self.me, self.g,
                              self.norm) for b in blocks]
        return _Share(shards, first.src_ids[shards[0].global_ids], owner[:blocks[-1].num_dst])

    def assemble(self, epoch, step, seeds, blocks, share: _Share, x, stager) -> ReadyBatch:
        last = share.shards[-1]
        mine = seeds[last.global_ids[:last.num_dst]]
        y = (torch.zeros(mine.shape[0], dtype=torch.int64) if self.seed_ids is None else
             self.labels[torch.from_numpy(np.searchsorted(self.seed_ids, mine))])
        return ReadyBatch(epoch, step, mine, blocks, None,
                          stager.to_device(x), stager.to_device(y),
                          share.shards, seed_owner=share.seed_owner)


class GroupEngine(DataParallel):
    """Operators on the group's sub-grid, gradients summed over the world.

    ``comm``: over the world grid (``data`` × the kernel axes); ``group_comm``: a
    :class:`~gnnpar.kernels.comm.Comm` over this rank's group view; ``algo_kw``: the
    builder's options (e.g. ``variant``)."""

    def __init__(self, comm, group_comm, algo: str, norm: str, device, **algo_kw):
        super().__init__(comm, tuple(comm.grid.shape))
        self.group_comm, self.algo, self.norm = group_comm, algo, norm
        self.device, self.algo_kw = torch.device(device), algo_kw

    def operators(self, batch):
        with self.group_comm.in_phase("setup"):
            return [build_bipartite(self.algo, sh, self.group_comm, self.norm, self.device,
                                    **self.algo_kw) for sh in batch.shards]

    def comm_stats(self) -> CommStats:
        world = super().comm_stats()
        timing = timing_name([world.timing, self.group_comm.timing])
        counts = self.group_comm.reset()
        group_bytes, group_s = counts.total_bytes, counts.seconds
        total = world.bytes + group_bytes
        return CommStats(total, total, world.seconds + group_s, timing=timing)


@dataclass
class Group:
    """This rank's data-parallel group: ``index`` k of ``d``, member ``me`` of ``g``."""

    algo: str
    d: int
    g: int
    index: int
    me: int
    comm: object
    group_comm: object
    shape: dict
    algo_kw: dict

    @classmethod
    def create(cls, spec, world: int) -> "Group":
        """Grids and communicators of the run spec (collective: every rank calls it)."""
        par = spec.parallel
        entry = get_grouped(par.algo)
        outer, inner = entry.make_group_grid(world, spec.batch.group_size, par.grid_dims,
                                             par.replication or 1)
        return cls(par.algo, outer.shape["data"], inner.world_size, outer.coord("data"),
                   inner.rank, Comm(outer), Comm(inner, WIRE_DTYPES[par.comm_dtype]),
                   dict(inner.shape),
                   entry.options(spec.settings(), per_group=True))

    @property
    def offset(self) -> int:
        return self.index * self.g

    @property
    def kernel_axes(self) -> tuple:
        return tuple(a for a in self.comm.grid.shape if a != "data")

    def gather_seeds(self, seeds: np.ndarray, labels: np.ndarray):
        """(the group's training seeds sorted, their labels): one all-gather over the group
        (setup traffic)."""
        comm, axes = self.comm, self.kernel_axes
        with comm.in_phase("setup"):
            sizes = [int(t) for t in torch.cat(comm.all_gather(
                torch.tensor([seeds.shape[0]]), axes))]
            ids = torch.cat(comm.all_gather(torch.as_tensor(seeds, dtype=torch.int64), axes,
                                            sizes)).numpy()
            lab = torch.cat(comm.all_gather(torch.as_tensor(labels, dtype=torch.int64), axes,
                                            sizes))
        order = np.argsort(ids, kind="stable")
        return ids[order], lab[torch.from_numpy(order)]

    def engine(self, norm: str, device) -> GroupEngine:
        return GroupEngine(self.comm, self.group_comm, self.algo, norm, device, **self.algo_kw)

    def fields(self) -> dict:
        """What the JSON log says about the layout."""
        cube = [s for a, s in self.shape.items() if a != "data"]
        return {"algo": self.algo, "grid": [self.d, *cube], "group_size": self.g,
                "groups": self.d}
