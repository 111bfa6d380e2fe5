"""Partitioned node features: own rows in place, remote rows from a cache or from their owners.

Every rank keeps the feature rows of the vertices it owns (its shard's ``x``) and a map
global id → (owner rank, row at the owner), 12 bytes per vertex (built once by an
all-gather of every rank's ``global_ids``). For a macrobatch the service asks for the union
U of its minibatches' input nodes once (:meth:`FeatureStore.fetch`):

1. rows this rank owns are read in place (never copied into U's table);
2. remote rows held in the cache (:mod:`gnnpar.sampling.cache`) are read from it;
3. the other remote rows are requested from their owners: a P-entry all-to-all of counts,
   one uneven all-to-all of row ids, and **one uneven all-to-all of the feature rows** (the
   only feature traffic: ``feat_bytes`` = rows × f × itemsize, counted by
   :class:`~gnnpar.kernels.comm.Comm` in phase ``features``; ids and counts go in phase
   ``feature_requests``).

Every rank calls :meth:`fetch` the same number of times in the same order (once per
macrobatch, even with nothing to ask for): the all-to-alls are collectives. A sampler worker
thread uses its own :class:`Comm` over its own process groups, so its fetches never
interleave with the trainer's gradient all-reduces.

Placement (``--features-on``): the rows (own and cached) live on the host, or on the
training device (:meth:`FeatureStore.to`); on the device the owner map goes there too, so a
minibatch's rows are gathered by device kernels from ids the device sampler made there, and
only remote rows cross the host: ids (the all-to-alls' counts are host values) and the rows
exchanged between ranks, which travel on the group's host route even when NCCL carries the
trainer's collectives (sampler threads overlap them, which NCCL does not allow).

Shapes: ``x_local`` (n_local, f); ids (U,) sorted distinct global ids; a minibatch's
features (n_input, f) float32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from gnnpar.kernels.local import as_tensor

from gnnpar.sampling.row_gather import compiled_for, gather_groups, gather_rows, new_rows
from gnnpar.sampling.topology import index_dtype


@dataclass
class FetchStats:
    """One fetch: distinct ids asked for, how many were remote, served by the cache, moved."""

    unique: int = 0
    remote: int = 0
    cache_hits: int = 0
    moved_rows: int = 0


class FeatureStore:
    """This rank's feature rows, the owner map and the cache (shared read-only by workers)."""

    def __init__(self, x_local, global_ids: np.ndarray, owner: np.ndarray,
                 local_index: np.ndarray, rank: int = 0):
        self.x = as_tensor(x_local, np.float32)
        self.global_ids = np.asarray(global_ids, np.int64)
        self.owner = owner
        self.local_index = local_index
        self.rank = int(rank)
        self.num_nodes = int(owner.shape[0])
        self.cache_ids = np.zeros(0, np.int64)
        self.cache_rows = self.x.new_zeros((0, self.x.shape[1]))
        self.cache_slot: Optional[np.ndarray] = None
        self.all_local = bool((owner == self.rank).all())
        self._owner_t = self._index_t = None  # device copies of owner / local_index

    @property
    def device(self) -> torch.device:
        return self.x.device

    def to(self, device) -> "FeatureStore":
        """Keep the rows (and the cache) on ``device`` with the owner map, so that ids given as
        tensors (the device sampler's) are gathered there without crossing to the host."""
        device = torch.device(device)
        self.x = self.x.to(device)
        self.cache_rows = self.cache_rows.to(device)
        self._owner_t = torch.from_numpy(self.owner).to(device)
        self._index_t = torch.from_numpy(self.local_index.astype(np.int64)).to(device)
        return self

    def nbytes(self) -> int:
        """Bytes of the rows this store holds (own rows and cache)."""
        return int(self.x.numel() * self.x.element_size()) + self.cache_bytes()

    def _idx(self, a: np.ndarray) -> torch.Tensor:
        """An int64 index tensor of ``a`` on the rows' device."""
        return torch.from_numpy(np.asarray(a, np.int64)).to(self.x.device)

    @property
    def row_bytes(self) -> int:
        return int(self.x.shape[1] * self.x.element_size())

    @classmethod
    def local(cls, x) -> "FeatureStore":
        """Every row on this one process (serial runs)."""
        n = int(np.asarray(x).shape[0]) if not isinstance(x, torch.Tensor) else int(x.shape[0])
        ids = np.arange(n, dtype=np.int64)
        return cls(x, ids, np.zeros(n, np.int32), ids.astype(index_dtype(n)), 0)

    @classmethod
    def from_shard(cls, shard, comm, axes) -> "FeatureStore":
        """Own rows from ``shard``; owner map from every rank's ``global_ids`` (setup traffic,
        counted in ``comm``'s current phase)."""
        owner, local_index, me = owner_map(shard, comm, axes)
        return cls(shard.x, shard.global_ids, owner, local_index, me)

    def set_cache(self, ids: np.ndarray, rows: torch.Tensor) -> None:
        """Hold ``rows`` (C, f) of remote vertices ``ids`` (C,) sorted distinct."""
        self.cache_ids = np.asarray(ids, np.int64)
        self.cache_rows = rows.to(self.x.device)
        self.cache_slot = np.full(self.num_nodes, -1, index_dtype(self.num_nodes))
        self.cache_slot[self.cache_ids] = np.arange(self.cache_ids.shape[0])

    def cache_bytes(self) -> int:
        return int(self.cache_rows.numel() * self.cache_rows.element_size())

    # ------------------------------------------------------------------ fetching
    def fetch(self, ids: np.ndarray, comm=None, axes=None, use_cache: bool = True):
        """``(table, stats)`` for sorted distinct global ``ids``: ``table`` serves any subset
        of ``ids`` (:meth:`MacroFeatures.gather`). Collective when ``comm`` spans ranks.
        ``ids`` may be a tensor (the device sampler's): with every row here nothing crosses
        to the host."""
        if isinstance(ids, torch.Tensor):
            if self.all_local and comm is None:
                return (MacroFeatures(self, np.zeros(0, np.int64), self.x[:0]),
                        FetchStats(unique=int(ids.shape[0])))
            ids = ids.cpu().numpy()
        ids = np.asarray(ids, np.int64)
        if self.all_local and comm is None:  # a serial store: nothing to look up
            return MacroFeatures(self, np.zeros(0, np.int64), self.x[:0]), FetchStats(
                unique=int(ids.shape[0]))
        remote = ids[self.owner[ids] != self.rank]
        stats = FetchStats(unique=int(ids.shape[0]), remote=int(remote.shape[0]))
        rows = self.x.new_empty((remote.shape[0], self.x.shape[1]))
        hit = np.zeros(remote.shape[0], bool)
        if use_cache and self.cache_slot is not None and remote.size:
            slot = self.cache_slot[remote]
            hit = slot >= 0
            if hit.any():
                rows[self._idx(np.flatnonzero(hit))] = self.cache_rows[self._idx(slot[hit])]
            stats.cache_hits = int(hit.sum())
        miss = remote[~hit]
        if comm is not None:
            rows[self._idx(np.flatnonzero(~hit))] = self._from_owners(miss, comm, axes)
            stats.moved_rows = int(miss.shape[0])
        elif miss.size:
            raise ValueError(f"{miss.size} remote rows asked for without a communicator")
        return MacroFeatures(self, remote, rows), stats

    def _from_owners(self, miss: np.ndarray, comm, axes) -> torch.Tensor:
        """Rows of ``miss`` (sorted ids, none owned here, none cached) from their owners."""
        size = len(comm.grid.ranks_of(axes))
        own = self.owner[miss].astype(np.int64)
        order = np.argsort(own, kind="stable")
        send_counts = np.bincount(own, minlength=size)
        with comm.in_phase("feature_requests"):
            recv_counts = comm.all_to_all(torch.as_tensor(send_counts).reshape(size, 1),
                                          [1] * size, [1] * size, axes).reshape(-1).numpy()
            want = torch.as_tensor(self.local_index[miss[order]].astype(np.int64))
            asked = comm.all_to_all(want, send_counts, recv_counts, axes)
        # rows go between ranks as host tensors (the gloo route of the group): the sampler
        # threads exchange them while the trainer runs its own collectives, and NCCL does not
        # allow operations of several communicators to overlap
        rows = self.x.index_select(0, asked.to(self.x.device)).cpu()
        with comm.in_phase("features"):
            got = comm.all_to_all(rows, recv_counts, send_counts, axes)
        out = torch.empty_like(got)
        out[torch.from_numpy(order)] = got
        return out.to(self.x.device)


def owner_map(shard, comm, axes):
    """``(owner (n,) int32, local_index (n,), my index on axes)`` from every rank's
    ``global_ids`` (one all-gather of n ids)."""
    ids = as_tensor(shard.global_ids, np.int64)
    sizes = [int(t) for t in torch.cat(comm.all_gather(torch.tensor([ids.shape[0]]), axes))]
    parts = comm.all_gather(ids, axes, sizes)
    n = int(shard.n_global)
    owner = np.full(n, -1, np.int32)
    local_index = np.zeros(n, index_dtype(n))
    for r, part in enumerate(parts):  # one vectorised assignment per rank
        owner[part.numpy()] = r
        local_index[part.numpy()] = np.arange(part.shape[0])
    if (owner < 0).any():
        raise ValueError("the shards' global_ids do not cover every vertex")
    return owner, local_index, comm.grid.ranks_of(axes).index(comm.grid.rank)


class MacroFeatures:
    """Feature rows of one macrobatch: own rows read in place, remote rows in a small table."""

    def __init__(self, store: FeatureStore, remote_ids: np.ndarray, remote_rows: torch.Tensor):
        self.store, self.remote_ids, self.remote_rows = store, remote_ids, remote_rows

    def gather(self, ids) -> torch.Tensor:
        """(len(ids), f) rows of ``ids`` (each one of the fetched ids), in that order, on the
        rows' device. ``ids``: numpy, or a tensor on the rows' device (gathered there)."""
        st = self.store
        if isinstance(ids, torch.Tensor) and st._index_t is not None:
            return self._gather_on_device(ids.to(st.x.device))
        if isinstance(ids, torch.Tensor):
            ids = ids.cpu().numpy()
        ids = np.asarray(ids, np.int64)
        if not self.remote_ids.size:
            return gather_rows(st.x, ids, st.local_index)
        mine = st.owner[ids] == st.rank
        out = new_rows(st.x, ids.shape[0])
        at = np.flatnonzero(mine)
        gather_rows(st.x, ids[at], st.local_index, out, at)
        at = np.flatnonzero(~mine)
        gather_rows(self.remote_rows, np.searchsorted(self.remote_ids, ids[at]), None, out, at)
        return out

    def gather_all(self, id_lists, drop=None) -> list:
        """``[self.gather(ids) for ids in id_lists]`` (a macrobatch's minibatches). With
        every row here and on the host, one pass in row order copies them all
        (:func:`~gnnpar.sampling.row_gather.gather_groups`): a row that several minibatches
        need is read from memory once. ``drop``: ``(seeds, p)``, each list's rows dropped
        on the way (``gather_groups``); only where :meth:`can_drop` says."""
        st = self.store
        if drop is not None and not self.can_drop(id_lists):
            raise ValueError("these rows cannot be dropped on the way (can_drop)")
        if drop is None and (self.remote_ids.size
                             or any(isinstance(ids, torch.Tensor) for ids in id_lists)):
            return [self.gather(ids) for ids in id_lists]
        return gather_groups(st.x, id_lists, st.local_index, drop)

    def can_drop(self, id_lists) -> bool:
        """Whether :meth:`gather_all` can drop the rows of ``id_lists`` as it copies them:
        every row in this rank's table, host ids, the compiled copy."""
        return (not self.remote_ids.size and compiled_for(self.store.x)
                and not any(isinstance(ids, torch.Tensor) for ids in id_lists))

    def _gather_on_device(self, ids: torch.Tensor) -> torch.Tensor:
        st = self.store
        if not self.remote_ids.size:
            return st.x.index_select(0, st._index_t[ids])
        mine = st._owner_t[ids] == st.rank
        out = st.x.new_empty((ids.shape[0], st.x.shape[1]))
        out[mine] = st.x.index_select(0, st._index_t[ids[mine]])
        remote = st._idx(self.remote_ids)
        out[~mine] = self.remote_rows.index_select(0, torch.searchsorted(remote, ids[~mine]))
        return out
