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
≈ nf/c + 2nfc/p received per rank. Backward: (c − 1)·n_me·f +
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
from .cost_terms import Cost, LinearCounts, coll, distinct, partners, per_feature, plan_counts
from .cpu_spmm import csr_mm
from .dist_op import DistOperator, shard_values
from .entry import Algorithm, GroupRule, group_of_size, variant_option
from .local import csr_tensor, transpose_csr
from .spmm_2d import attach_ownership, ownership


class BcastStages:
    """Variant ``bcast``: the holder of each stage block broadcasts it whole over ``row``; the
    backward reduce-scatters over ``row`` (chunk |R_j| for j ∈ S_k, 0 for the others)."""

    def __init__(self, comm: Comm, i, stages, block_sizes, cj, cpos, n_block, device=None):
        self.comm, self.i, self.stages, self.block_sizes = comm, i, stages, block_sizes
        start = np.zeros(len(block_sizes), np.int64)
        start[stages] = np.concatenate([[0], np.cumsum([block_sizes[j] for j in stages])])[:-1]
        self.columns = start[cj] + cpos
        self.width = sum(block_sizes[j] for j in stages)
        self.back_sizes = [block_sizes[j] if j in stages else 0 for j in range(len(block_sizes))]

    def gather(self, block, h):
        return torch.cat([h.new_empty((0, h.shape[1]))] + [
            self.comm.broadcast(block if j == self.i else
                                h.new_empty((self.block_sizes[j], h.shape[1])), j, "row")
            for j in self.stages])

    def reduce(self, d_cols):
        return self.comm.reduce_scatter(d_cols, "row", self.back_sizes)


class HaloStages:
    """Variant ``halo``: one all-to-all over ``row`` of only the stage blocks' rows this rank's
    non-zeros touch (a compacted plan built once); its reverse in the backward."""

    def __init__(self, comm: Comm, i, stages, block_sizes, cj, cpos, n_block, device=None):
        self.comm, self.n_block = comm, n_block
        self.columns, self.plan = compact_plan(comm, "row", cj, cpos, n_block, device)
        self.width = n_block + self.plan.num_halo

    def gather(self, block, h):
        return self.plan.gather(self.comm, block, "row")

    def reduce(self, d_cols):
        return self.plan.scatter_back(self.comm, d_cols, self.n_block, "row")


#: variant -> how the stage blocks move (chosen once, when the operator is built)
VARIANTS = {"halo": HaloStages, "bcast": BcastStages}


class Op15D(DistOperator):
    def __init__(self, comm: Comm, rows, cols, vals, own, variant: str, device=None):
        if variant not in VARIANTS:
            raise InputError(f"unknown 1.5d variant {variant!r}; choose one of "
                             f"{', '.join(VARIANTS)}")
        grid = comm.grid
        self.comm = comm
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
        self.move = VARIANTS[variant](comm, self.i, self.stages, self.block_sizes, cj, cpos,
                                      self.n_block, device)
        shape = (sum(self.r_sizes), self.move.width)
        arrays = coo_to_csr(r, self.move.columns, vals, shape)
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
        cols = self.move.gather(self.to_holder(h), h)
        return self.comm.reduce_scatter(csr_mm(self.A, cols), "replica", self.r_sizes)

    def backward_rows(self, grad):
        g_rows = torch.cat(self.comm.all_gather(grad, "replica", self.r_sizes))
        d_cols = csr_mm(self.AT, g_rows)
        return self.from_holder(self.move.reduce(d_cols))


def build_15d(shard, comm: Comm, norm: str, device=None, variant: str = "halo",
              permute: bool = False, seed: int = 0) -> Op15D:
    """``variant="halo"`` by default: it never moves more bytes than ``"bcast"`` (each stage
    block's needed rows are a subset of the block)."""
    grid = comm.grid
    if set(grid.shape) != {"row", "replica"}:
        raise InputError(f"1.5d needs a (p/c) x c grid of axes row x replica, got "
                         f"{grid.describe()}")
    c = grid.shape["replica"]
    own = ownership(shard, comm, permute, seed)
    u, v, val = shard_entries(shard, shard_values(shard, norm))
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


# ---------------------------------------------------------------- registry entry
def row_replica(world: int, dims=None, replication: int = 1) -> dict:
    c = int(replication)
    if c < 1 or world % c:
        raise InputError(f"--replication {c} must divide the world size {world}")
    return {"row": world // c, "replica": c}


def exact_15d(s, c, variant, layers, rotate) -> LinearCounts:
    n_r, qn = s.sizes, s.p // c
    q = np.arange(s.p)
    i, k = q // c, q % c
    holder = (k == i % c)
    R = np.bincount(i, weights=n_r, minlength=qn).astype(np.int64)
    stage_rows = np.array([R[kk::c].sum() for kk in range(c)])[k]
    others = np.array([[n_r[ii * c + r] > 0 for r in range(c)] for ii in range(qn)])
    to_holder = np.where(holder, 0, n_r)
    to_msgs = np.where(holder | (n_r == 0) | (c == 1), 0, 1)
    from_msgs = np.where(holder, others[i].sum(1) - (n_r > 0), 0) if c > 1 else 0 * q
    rs_rows, rs_msgs = R[i] - n_r, coll(c)
    if variant == "bcast":
        b_rows = np.where(holder, (qn - 1) * R[i], 0)
        b_msgs = np.where(holder, coll(qn), 0)
        red_rows = stage_rows - np.where(holder, R[i], 0)
        fwd_stage, bwd_stage = (b_rows, b_msgs), (red_rows, np.full(s.p, coll(qn)))
    else:
        ou, ov = s.owner[s.rows], s.owner[s.cols]
        j = ov // c
        dest = (ou // c) * c + j % c
        recv, send, rm, sm = plan_counts(s.p, dest, s.cols, j * c + j % c)
        fwd_stage, bwd_stage = (send, sm), (recv, rm)
    return LinearCounts((to_holder + fwd_stage[0] + rs_rows,
                         (c - 1) * n_r + bwd_stage[0] + np.where(holder, R[i] - n_r, 0)),
                        (to_msgs + fwd_stage[1] + rs_msgs, coll(c) + bwd_stage[1] + from_msgs))


def estimate_15d(s, dims, variant):
    c, n, nr, mr, p = int(dims), s.n, s.nr, s.mr, s.p
    q, R = p // c, n * c / p
    base_f = nr * (c - 1) / c + R - nr
    base_b = (c - 1) * nr + (R - nr) / c
    mf, mb = (1 if c > 1 else 0) + coll(c), 2 * coll(c)
    if variant == "bcast":
        return per_feature(base_f + (q - 1) * R / c, base_b + n / c - R / c, mf + coll(q) / c,
                           mb + coll(q), n / c)
    h = distinct(mr * s.scale * (1 - 1 / q), n / c)
    k = partners(mr * s.scale * (1 - 1 / q), q)
    return per_feature(base_f + h, base_b + h, mf + k, mb + k, h + R)


def candidates_15d(p: int):
    return [(c, v) for c in range(2, p + 1) if p % c == 0 for v in VARIANTS]


SPMM_15D = Algorithm(
    name="1.5d", axes=("row", "replica"), shape=row_replica, builder=build_15d,
    flags=("replication", "variant"), option_rule=variant_option, group=GroupRule(group_of_size),
    cost=Cost(exact_15d, estimate_15d, candidates=candidates_15d))
