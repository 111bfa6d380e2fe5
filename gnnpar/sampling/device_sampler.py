"""The bulk sampler in torch ops, on the training device (``--sample-on device``).

The same algorithm as :mod:`.bulk` — per layer, the frontiers of a macrobatch's K
minibatches stacked, kept positions chosen on their degrees (Floyd's algorithm, vectorised),
one gather of the kept entries, Horvitz–Thompson rescaling, then per minibatch a relabelling
to block-local ids with destinations first — written on torch tensors so that it runs where
the model runs: on a GPU nothing of a minibatch crosses the PCIe bus (the topology, the
blocks and, with ``--features-on device``, the features stay on the card). On CPU it
runs on host tensors (what CI tests).

Given :class:`~gnnpar.sampling.draws.PcgDraws` it returns exactly the blocks of
:class:`~gnnpar.sampling.bulk.BulkSampler` (tested); by default it uses
:class:`~gnnpar.sampling.draws.HashDraws`, made on the device.

Shapes: as :mod:`.bulk`; every array of a :class:`Block` is a tensor on the device.
Memory on the device: the replicated topology (``8(n+1) + 12e + 4n`` bytes per kind) plus
two n-entry scratch arrays per sampler worker (relabelling).
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np
import torch

from gnnpar.datasets import InputError

from gnnpar.sampling.blocks import Block
from gnnpar.sampling.choose import keeps_distinct
from gnnpar.sampling.neighbor import SamplerConfig


class TorchTopology:
    """A replicated :class:`~gnnpar.sampling.topology.Topology` as tensors on ``device``."""

    replicated = True

    def __init__(self, topo, device):
        if not topo.replicated:
            raise InputError("--sample-on device needs the replicated sampling structure "
                             "(drop --no-replicate-graph)")
        dev = torch.device(device)
        self.device = dev
        self.num_nodes = topo.num_nodes
        self.indptr = torch.as_tensor(topo.indptr, dtype=torch.int64).to(dev)
        self.degree = self.indptr[1:] - self.indptr[:-1]
        self.cols = torch.from_numpy(np.ascontiguousarray(topo.indices)).to(dev)
        self.values = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev)
                       for k, v in topo.values.items()}
        self.self_values = {k: torch.from_numpy(v).to(dev) for k, v in topo.self_values.items()}
        self.kinds = tuple(topo.self_values)

    def check_kind(self, kind: str) -> None:
        if kind not in self.self_values:
            raise InputError(f"the sampling topology holds normalisations {list(self.kinds)}, "
                             f"not {kind!r}")

    def nbytes(self) -> int:
        ts = [self.indptr, self.cols, *self.values.values(), *self.self_values.values()]
        return int(sum(t.numel() * t.element_size() for t in ts))


class TorchRelabeler:
    """Global → block-local ids, destinations first, then new ids ascending (as
    :class:`~gnnpar.sampling.blocks.Relabeler`, on tensors). Two n-entry scratch arrays,
    clean between calls; not thread-safe (one per worker)."""

    def __init__(self, num_nodes: int, device):
        self.num_nodes = int(num_nodes)
        self.slot = torch.full((self.num_nodes,), -1, dtype=torch.int64, device=device)
        self.mark = torch.zeros(self.num_nodes, dtype=torch.bool, device=device)
        # a scan of n flags is cheap on a GPU; on a CPU a sort of the ids pays below n/32
        self.scan_factor = 0 if torch.device(device).type == "cuda" else 32

    def __call__(self, dst: torch.Tensor, cols: torch.Tensor):
        slot, r = self.slot, dst.shape[0]
        slot[dst] = torch.arange(r, dtype=torch.int64, device=dst.device)
        fresh = self._new_ids(cols, dst)
        slot[fresh] = torch.arange(r, r + fresh.shape[0], dtype=torch.int64, device=dst.device)
        local = slot[cols]
        slot[dst] = -1
        slot[fresh] = -1
        return torch.cat([dst, fresh]), local

    def _new_ids(self, cols, dst):
        if self.num_nodes <= self.scan_factor * cols.shape[0] or self.scan_factor == 0:
            mark = self.mark
            mark[cols] = True
            mark[dst] = False
            out = torch.nonzero(mark).reshape(-1)
            mark[out] = False
            return out
        ids = torch.unique(cols)
        return ids[self.slot[ids] < 0]

    def union(self, arrays: Sequence[torch.Tensor]) -> torch.Tensor:
        """Sorted distinct ids of all ``arrays`` together."""
        return torch.unique(torch.cat(list(arrays)))


def floyd_subsets(deg: torch.Tensor, k: int, u: torch.Tensor) -> torch.Tensor:
    """:func:`gnnpar.sampling.choose.floyd_subsets` on tensors: (R, k) int64 distinct
    positions in ``[0, deg_i)`` for rows with ``deg_i >= k``; ``u`` (R, k) float64."""
    rows = deg.shape[0]
    out = torch.empty((k, rows), dtype=torch.int64, device=deg.device)
    u_steps = u.t()
    for step in range(k):
        j = deg - k + step
        t = torch.minimum((u_steps[step] * (j.to(torch.float64) + 1.0)).to(torch.int64), j)
        if step:
            seen = (out[:step] == t).any(dim=0)
            t = torch.where(seen, j, t)
        out[step] = t
    return out.t()


def _row_ranges(k: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """``cat([base_i + arange(k_i)])`` (Σk,) int64."""
    total = int(k.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.int64, device=k.device)
    start = torch.cumsum(k, 0) - k
    return (torch.arange(total, dtype=torch.int64, device=k.device)
            - torch.repeat_interleave(start - base, k, output_size=total))


class TorchBulkSampler:
    """Samples a macrobatch on ``topo.device`` (module docstring)."""

    def __init__(self, topo: TorchTopology, cfg: SamplerConfig):
        topo.check_kind(cfg.kind)
        self.topo, self.cfg = topo, cfg

    def sample(self, seeds: Sequence, draws: Sequence, relabel: TorchRelabeler = None
               ) -> List[List[Block]]:
        """One list of blocks (input layer first) per seed array; ``draws[b]`` (a
        :mod:`.draws` source) drives minibatch b."""
        if len(seeds) != len(draws):
            raise ValueError(f"got {len(seeds)} seed arrays but {len(draws)} draw sources")
        topo, cfg, dev = self.topo, self.cfg, self.topo.device
        relabel = relabel or TorchRelabeler(topo.num_nodes, dev)
        frontiers = [self._check(s) for s in seeds]
        selfv = topo.self_values[cfg.kind]
        per_batch: List[List[Block]] = [[] for _ in seeds]
        for fanout in reversed(cfg.fanouts):
            sizes = [int(f.shape[0]) for f in frontiers]
            rows = torch.cat(frontiers) if frontiers else torch.zeros(0, dtype=torch.int64,
                                                                      device=dev)
            deg = topo.degree[rows]
            k, entry = self._choose(deg, topo.indptr[rows], fanout, sizes, draws)
            cols = topo.cols[entry].to(torch.int64)
            vals = topo.values[cfg.kind][entry]
            if fanout >= 0:
                factor = torch.where(k > 0, deg.to(torch.float64) / k.clamp(min=1), 1.0)
                vals = vals * torch.repeat_interleave(factor.to(torch.float32), k,
                                                      output_size=entry.shape[0])
            k_host = k.cpu()
            row_cut = np.cumsum([0] + sizes)
            edge_cut = np.concatenate([[0], np.cumsum(k_host.numpy())])[row_cut]
            dst_self = selfv[rows]
            for b, front in enumerate(frontiers):
                r0, r1, e0, e1 = (int(v) for v in (row_cut[b], row_cut[b + 1], edge_cut[b],
                                                   edge_cut[b + 1]))
                block = _assemble(front, k[r0:r1], cols[e0:e1], vals[e0:e1], dst_self[r0:r1],
                                  relabel)
                block.distinct = keeps_distinct(fanout, cfg.replace)
                per_batch[b].append(block)
                frontiers[b] = block.src_ids
        return [blocks[::-1] for blocks in per_batch]

    def _check(self, seeds) -> torch.Tensor:
        t = torch.as_tensor(np.asarray(seeds, np.int64) if not isinstance(seeds, torch.Tensor)
                            else seeds, dtype=torch.int64).to(self.topo.device)
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.topo.num_nodes):
            raise InputError(f"seed ids must lie in [0, {self.topo.num_nodes})")
        return t

    def _choose(self, deg, base, fanout: int, sizes, draws):
        """``(k (R,), entry (Σk,))``: positions kept per row, as CSR entry indices
        (:func:`gnnpar.sampling.choose.choose_entries` on tensors, draws per minibatch)."""
        replace = self.cfg.replace
        if fanout == 0:
            return torch.zeros_like(deg), torch.zeros(0, dtype=torch.int64, device=deg.device)
        if fanout < 0:
            for d in draws:
                d.next(0, fanout)
            return deg.clone(), _row_ranges(deg, base)
        drawn = deg > 0 if replace else deg > fanout
        running = torch.cat([torch.zeros(1, dtype=torch.int64, device=deg.device),
                             torch.cumsum(drawn.to(torch.int64), 0)])
        cut = torch.as_tensor(np.cumsum([0] + sizes), dtype=torch.int64, device=deg.device)
        counts = np.diff(running[cut].cpu().numpy()).tolist()
        parts = [d.next(c, fanout) for d, c in zip(draws, counts)]
        u = torch.cat(parts) if parts else torch.zeros((0, fanout), dtype=torch.float64,
                                                       device=deg.device)
        u = u.to(deg.device)
        if replace:
            k = torch.where(drawn, fanout, 0)
            d = deg[drawn][:, None]
            pos = torch.minimum((u * d).to(torch.int64), d - 1)
            return k, (base[drawn][:, None] + pos).reshape(-1)
        k = deg.clamp(max=fanout)
        entry = _row_ranges(k, base)
        if u.shape[0]:
            start = torch.cumsum(k, 0) - k
            slots = (start[drawn][:, None] + torch.arange(fanout, device=deg.device)).reshape(-1)
            entry[slots] = (base[drawn][:, None] + floyd_subsets(deg[drawn], fanout, u)
                            ).reshape(-1)
        return k, entry


def _assemble(dst, k, cols, vals, self_vals, relabel: TorchRelabeler) -> Block:
    """:func:`gnnpar.sampling.blocks.assemble_block` on tensors."""
    src_ids, local = relabel(dst, cols)
    r, dev = dst.shape[0], dst.device
    n_self = (self_vals != 0).to(torch.int64)
    indptr = torch.zeros(r + 1, dtype=torch.int64, device=dev)
    torch.cumsum(k + n_self, 0, out=indptr[1:])
    nnz = int(indptr[-1])
    n_edges = int(cols.shape[0])
    if nnz == n_edges:  # no self entries
        return Block(indptr, local, vals.to(torch.float32), src_ids, r, n_edges)
    indices = torch.empty(nnz, dtype=torch.int64, device=dev)
    values = torch.empty(nnz, dtype=torch.float32, device=dev)
    slots = (torch.arange(n_edges, dtype=torch.int64, device=dev)
             + torch.repeat_interleave(torch.cumsum(n_self, 0), k, output_size=n_edges))
    indices[slots] = local
    values[slots] = vals
    self_rows = torch.nonzero(n_self).reshape(-1)
    indices[indptr[self_rows]] = self_rows
    values[indptr[self_rows]] = self_vals[self_rows]
    return Block(indptr, indices, values, src_ids, r, n_edges)
