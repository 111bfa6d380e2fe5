"""1.5D SpMM with replication factor c on a (p/c) × c grid (axes ``row`` × ``replica``).

Z = Â · H for the rows each rank owns. Rank (i, k) (global rank ``i·c + k``) owns its 1D part
(or a seeded random balanced set with ``permute=True``), all f features. Row block R_i = the
rows of ranks (i, 0..c−1) — the c ranks of R_i share it, as CAGNET's replicas do. Block R_i is
*held* (assembled whole) by its holder, replica k = i mod c; replica k runs the stages
S_k = {j < p/c : j ≡ k (mod c)} — ⌈(p/c − k)/c⌉ of them, p/c² each when c² divides p. The
schedule needs nothing beyond c | p (with c² ∤ p the stage counts differ by one; with c > p/c
some replicas have no stage and only reduce zeros).

Rank (i, k) stores Â[R_i, ∪_{j∈S_k} R_j] (≈ m/p non-zeros: the c replicas of a row block split
its columns, so Â is not replicated — c times less memory than CAGNET's 1.5D, same traffic).

Forward   gather: each rank sends its H rows to the holder of its block (all-to-all over
          ``replica``); stages: for j ∈ S_k the holder (j, k) broadcasts H_{R_j} over ``row``
          (variant ``bcast``), or one sparsity-aware all-to-all over ``row`` sends only the rows
          of those blocks that this rank's non-zeros touch (variant ``halo``);
          Y = Â_local · [H_{R_j}]_{j∈S_k} (|R_i| × f); Z_mine = reduce-scatter of Y over
          ``replica``.
Backward  the transpose of each step: all-gather G over ``replica``; Âᵀ_local · G_{R_i};
          reduce-scatter over ``row`` with chunk n(R_j) for j ∈ S_k, 0 for the others (the
          reduce of every broadcast at once) or the halo plan's reverse all-to-all; the holder
          sends each replica its rows back (all-to-all over ``replica``).

Words sent per rank per SpMM (bcast; n_me owned rows, |R_i| ≈ nc/p): forward
n_me·f (non-holders) + (p/c − 1)·|R_i|·f (holders, one broadcast per block) + (|R_i| − n_me)·f;
≈ nf/c + 2nfc/p received per rank (DESIGN's table). Backward: (c − 1)·n_me·f +
(Σ_{j∈S_k} |R_j| − |R_i|·[holder])·f + (|R_i| − n_me)·f·[holder]. The halo variant replaces the
stage traffic by f × (rows this rank sends in its plan).

Shapes: h, Z (n_me, f); Â_local (|R_i|, Σ_{j∈S_k} |R_j|) (halo: compacted columns).
"""
from __future__ import annotations

import numpy as np
import torch

from gnnpar.datasets import InputError

from .blocks import (compact_plan, coo_to_csr, coords_of, exchange, rank_of, shard_entries,
                     world_axes)
from .comm import Comm
from .dist_op import DistOperator
from .local import csr_tensor, transpose_csr
from .spmm_2d import attach_ownership, ownership

VARIANTS = ("halo", "bcast")


class Op15D(DistOperator):
    def __init__(self, comm: Comm, rows, cols, vals, own, variant: str, device=None):
        if variant not in VARIANTS:
            raise InputError(f"unknown 1.5d variant {variant!r}; choose one of "
                             f"{', '.join(VARIANTS)}")
        grid = comm.grid
        self.comm, self.variant = comm, variant
        self.q, self.c = grid.shape["row"], grid.shape["replica"]
        self.i, self.k = grid.coord("row"), grid.coord("replica")
        self.holder = self.i % self.c
        self.stages = list(range(self.k, self.q, self.c))
        self.r_sizes = own.sizes(grid.ranks_of("replica"))
        self.block_sizes = [sum(own.sizes([j * self.c + r for r in range(self.c)]))
                            for j in range(self.q)]
        self.num_dst = self.num_src = self.r_sizes[self.k]
        self.n_block = self.block_sizes[self.i] if self.k == self.holder else 0
        (rm, rl), (cj, cpos) = rows, cols
        r = np.concatenate([[0], np.cumsum(self.r_sizes)])[rm] + rl
        if variant == "bcast":
            start = np.zeros(self.q, np.int64)
            start[self.stages] = np.concatenate([[0], np.cumsum(
                [self.block_sizes[j] for j in self.stages])])[:-1]
            c = start[cj] + cpos
            width = sum(self.block_sizes[j] for j in self.stages)
        else:
            c, self.plan = compact_plan(comm, "row", cj, cpos, self.n_block, device)
            width = self.n_block + self.plan.num_halo
        shape = (sum(self.r_sizes), width)
        arrays = coo_to_csr(r, c, vals, shape)
        self.A = csr_tensor(*arrays, shape, device)
        self.AT = csr_tensor(*transpose_csr(*arrays, shape), shape[::-1], device)

    def _holder_counts(self):
        mine = [self.num_src if r == self.holder else 0 for r in range(self.c)]
        held = self.r_sizes if self.k == self.holder else [0] * self.c
        return mine, held

    def to_holder(self, h):
        mine, held = self._holder_counts()
        return self.comm.all_to_all(h.contiguous(), mine, held, "replica")

    def from_holder(self, block):
        mine, held = self._holder_counts()
        return self.comm.all_to_all(block.contiguous(), held, mine, "replica")

    def forward_rows(self, h):
        block = self.to_holder(h)
        if self.variant == "bcast":
            cols = torch.cat([h.new_empty((0, h.shape[1]))] + [
                self.comm.broadcast(block if j == self.i else
                                    h.new_empty((self.block_sizes[j], h.shape[1])), j, "row")
                for j in self.stages])
        else:
            cols = self.plan.gather(self.comm, block, "row")
        return self.comm.reduce_scatter(torch.sparse.mm(self.A, cols), "replica", self.r_sizes)

    def backward_rows(self, grad):
        g_rows = torch.cat(self.comm.all_gather(grad, "replica", self.r_sizes))
        d_cols = torch.sparse.mm(self.AT, g_rows)
        if self.variant == "bcast":
            sizes = [self.block_sizes[j] if j in self.stages else 0 for j in range(self.q)]
            block = self.comm.reduce_scatter(d_cols, "row", sizes)
        else:
            block = self.plan.scatter_back(self.comm, d_cols, self.n_block, "row")
        return self.from_holder(block)



def build_15d(shard, comm: Comm, values, device=None, variant: str = "halo",
              permute: bool = False, seed: int = 0) -> Op15D:
    grid = comm.grid
    if set(grid.shape) != {"row", "replica"}:
        raise InputError(f"1.5d needs a (p/c) x c grid of axes row x replica, got "
                         f"{grid.describe()}")
    c = grid.shape["replica"]
    own = ownership(shard, comm, permute, seed)
    u, v, val = shard_entries(shard, values)
    cu, cv = coords_of(grid, own.owner[u]), coords_of(grid, own.owner[v])
    dest = rank_of(grid, {"row": cu["row"], "replica": cv["row"] % c})
    u, v, val = exchange(comm, world_axes(grid), dest, [u, v, val])
    rm, rl, _ = own.block_positions(grid.ranks_of("replica"), u)
    j = coords_of(grid, own.owner[v])["row"]
    # position of v inside its row block R_j: offset of its owner among (j, 0..c-1) + local
    pos = np.zeros_like(v)
    for jj in np.unique(j):
        sel = j == jj
        pos[sel] = own.block_positions([jj * c + r for r in range(c)], v[sel])[2]
    op = Op15D(comm, (rm, rl), (j, pos), val, own, variant, device)
    return attach_ownership(op, shard, comm, own)
