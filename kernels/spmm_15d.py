"""1.5D SpMM with replication factor c on a (p/c) × c grid (axes ``row`` × ``replica``).

Z = Â · H for the rows each rank owns. Rank (i, k) (global rank ``i·c + k``) owns its 1D part
(or a seeded random balanced set with ``permute=True``), all f features. Row block R_i = the
rows of ranks (i, 0..c−1): the c *replicas* of block i share its output rows. The product is
staged over the column blocks R_j (j < p/c), and every stage's data H_{R_j} is split over the
replicas of block j: replica k of every row block runs stage j on C_kj = the rows rank (j, k)
owns, with (j, k) as its root. So the roots rotate: in the layer of ranks (·, k) each member is
the root of exactly one stage (its own rows), and every replica sends 1/c of each stage's data.
Rank (i, k) stores Â_ik = Â[R_i, C_k], C_k = ∪_j C_kj (≈ m/p non-zeros; every non-zero sits
on one rank: Â is not replicated, c times less memory than a 1.5D that copies Â's block row
to its c replicas).

Forward   stages: H_{C_k} = the p/c broadcasts over ``row``, one rooted at each member — one
          all-gather of the owned rows (variant ``bcast``), or one all-to-all of only the rows
          Â_ik's non-zero columns touch (variant ``halo``); Y = Â_ik · H_{C_k} (|R_i| × f);
          Z_mine = reduce-scatter of Y over ``replica`` (``halo``: an all-to-all of only Y's rows
          that hold a non-zero, summed at their owners).
Backward  the transpose of each step: G_{R_i} = all-gather of G over ``replica`` (``halo``:
          only the rows Â_ik's non-zero rows touch); Â_ikᵀ · G_{R_i}; reduce-scatter over ``row``
          (``halo``: the stage plan's reverse all-to-all).

Words sent per rank per SpMM (``bcast``; n_me owned rows): forward (p/c − 1)·n_me·f +
(|R_i| − n_me)·f, backward (c − 1)·n_me·f + (|C_k| − n_me)·f; with equal parts each is
nf/c + (c − 2)·nf/p — exactly nf/2 at c = 2, ≈ nf/c while c² ≪ p — and the same on every
rank. Messages: (p/c − 1) + (c − 1) each way. ``halo`` sends f × (rows this rank sends in both
plans), never more than ``bcast``.

Why not one holder per row block (the schedule this replaces): it assembled R_j whole at one
replica, which broadcast it to the other p/c − 1 ranks of its layer, so that rank sent
(p/c − 1)·|R_j|·f ≈ nf per SpMM, like 1D, while its layer's other ranks sent nothing. Here
every rank sends its own rows only, so at p = 8, c = 2 on a dense random graph the busiest
rank sends 4/7 of what 1D's busiest rank sends with equal parts (``tests/test_15d_balance.py``
holds it to 1/c + 0.1 with uneven parts).

On its grid this is the A-stationary product of :mod:`spmm_2d` with ``replica`` as the axis of
the partial sums, and it is built by the same code (:func:`spmm_2d.build_block_op`):
``--algo 1.5d --replication c`` moves what ``--algo 2d --grid (p/c)x c`` moves over the same
blocks (``gnnpar-train`` gives 2d the balanced block layout, :func:`blocks.layout_options`;
1.5d keeps the shards' parts unless built with ``permute=True``). What 1.5D names is the choice
of grid: c replicas per row block, with c chosen small (c² ≪ p) so that the p/c-member stages
carry the traffic.

Shapes: h, Z (n_me, f); Â_ik (|R_i|, |C_k|) (halo: own rows first, then the touched remote
rows, compacted on both dims).
"""
from __future__ import annotations

from gnnpar.datasets import InputError

from .comm import Comm
from .cost_attention import per_layer
from .cost_terms import Cost, LinearCounts, dest_work
from .dist_op import shard_values
from .entry import Algorithm, GroupRule, group_of_size, variant_option
from .spmm_2d import (VARIANTS, BlockOp, attach_ownership, block_of, build_block_op, estimate_2d,
                      estimate_moves_2d, exact_2d, moves_2d, ownership, padding_2d)


def build_15d(shard, comm: Comm, norm: str, device=None, variant: str = "halo",
              permute: bool = False, seed: int = 0) -> BlockOp:
    """``variant="halo"`` by default: it never moves more bytes than ``"bcast"``. The stages
    gather over ``row`` and the partial sums reduce over ``replica``."""
    if set(comm.grid.shape) != {"row", "replica"}:
        raise InputError(f"1.5d needs a (p/c) x c grid of axes row x replica, got "
                         f"{comm.grid.describe()}")
    if variant not in VARIANTS:
        raise InputError(f"unknown 1.5d variant {variant!r}; choose one of "
                         f"{', '.join(VARIANTS)}")
    own = ownership(shard, comm, permute, seed)
    op = build_block_op(shard, comm, shard_values(shard, norm), own, "row", "replica", variant,
                        device)
    return attach_ownership(op, shard, comm, own)


# ---------------------------------------------------------------- registry entry
def row_replica(world: int, dims=None, replication: int = 1) -> dict:
    c = int(replication)
    if c < 1 or world % c:
        raise InputError(f"--replication {c} must divide the world size {world}")
    return {"row": world // c, "replica": c}


def exact_15d(s, c, variant, layers, rotate) -> LinearCounts:
    """Exact per-rank counts: the block product's on the (p/c) × c grid (``row`` gathers,
    ``replica`` reduces; global rank i·c + k, as 2D's i·pc + j)."""
    return exact_2d(s, (s.p // int(c), int(c)), variant, layers, rotate)


def estimate_15d(s, dims, variant):
    c = int(dims)
    return estimate_2d(s, (s.p // c, c), variant)


def moves_15d(s, c, variant, reduce: bool = True):
    """The block operator's moves on the (p/c) × c grid (``replica`` its out axis)."""
    return moves_2d(s, (s.p // int(c), int(c)), variant, reduce)


def estimate_moves_15d(s, c, variant):
    return estimate_moves_2d(s, (s.p // int(c), int(c)), variant)


def candidates_15d(p: int):
    return [(c, v) for c in range(2, p + 1) if p % c == 0 for v in VARIANTS]


def padding_15d(s, c, variant, reduce: bool = True):
    """1.5d is the 2d block product on the (p/c) × c grid (``replica`` as the column axis)."""
    return padding_2d(s, (s.p // int(c), int(c)), variant, reduce)


SPMM_15D = Algorithm(
    name="1.5d", axes=("row", "replica"), shape=row_replica, builder=build_15d,
    flags=("replication", "variant"), option_rule=variant_option, group=GroupRule(group_of_size),
    cost=Cost(exact_15d, estimate_15d, candidates=candidates_15d, padding=padding_15d,
              work=dest_work(lambda s, c: block_of(s, (s.p // int(c), int(c)))),
              moves=per_layer(moves_15d), moves_estimate=estimate_moves_15d))
