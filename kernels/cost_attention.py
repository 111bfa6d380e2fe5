"""The cost model's terms for attention: the row moves of the edge-valued operations.

An operator serving the edge-valued operations (``kernels/edge_dist.py``,
``kernels/edge_block.py``) moves rows between their owners and its positions in five ways. Each
is, per rank, a number of rows per feature (whatever the width), messages and padded rows per
feature (:class:`Moves`):

- ``g_in`` / ``r_in``: the gather over its column (in) axis and the adjoint reduction;
- ``g_out`` / ``r_out``: the gather over its row (out) axis and the reduction of partial rows
  to their owners;
- ``m_out``: the row maximum over the out axis: one all-to-all of ``r_out``'s rows, float32
  whatever the wire (the values are sent exactly), no padding.

A 1D operator has no out axis. An SpMM is ``g_in + r_out`` forward and ``g_out + r_in``
backward. A GAT layer with H heads and projected width z (:func:`~.cost_terms.gat_z_width`)
makes (:data:`GAT_CALLS`):

- forward: ``g_in`` of the source scores (H) and of z; ``g_out`` of the destination scores,
  the row maxima and the row sums (H each); ``m_out`` (H); ``r_out`` of the row sums (H) and
  of the product (z);
- backward: ``r_in`` of the source scores' and z's gradients; ``r_out`` of the destination
  scores' and the row sums' (H each); ``g_out`` of the row sums' (H) and the product's (z).

Under ``--precision bf16`` (a float32 wire) the two widths travel in different dtypes: z and
the product's rows are bf16 (autocast's projection), the scores float32 (a bf16 z times a
float32 attention vector is promoted), and so are the softmax's row maxima and sums.

Each algorithm's entry gives its moves exactly (``Cost.moves``) and estimated
(``Cost.moves_estimate``); a 1D entry without them has its in axis only, taken from its
``exact``/``padding`` or ``estimate`` (:func:`exact_moves`, :func:`estimated_moves`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np

from .cost_terms import F32

#: calls of each move in one GAT layer, forward and backward: (heads wide, z wide)
GAT_CALLS = {"g_in": (1, 1), "r_in": (1, 1), "g_out": (4, 1), "r_out": (3, 1), "m_out": (1, 0)}


@dataclass
class Moves:
    """Per move (module docstring): rows per feature each rank sends, its messages and its
    padded rows per feature (per-rank arrays; floats for an average-rank estimate)."""

    rows: Dict[str, object] = field(default_factory=dict)
    msgs: Dict[str, object] = field(default_factory=dict)
    pad: Dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, **moves) -> "Moves":
        """``move=(rows, msgs[, pad])`` for each move there is; the others move nothing."""
        out = cls()
        for name, (rows, msgs, *pad) in moves.items():
            out.rows[name], out.msgs[name] = rows, msgs
            out.pad[name] = pad[0] if pad else 0
        return out

    def gat_layer(self, heads: int, z: int, wire: int = F32, score_wire: Optional[int] = None,
                  scores: Optional["Moves"] = None):
        """(bytes, padded bytes, messages) of one GAT layer, forward and backward: its z-wide
        moves at ``wire`` bytes an element, its heads-wide ones (scores, row maxima and sums,
        their gradients) at ``score_wire`` (default ``wire``; the maximum's all-to-all at
        float32 whatever the wire). ``scores``: the moves whose padding the heads-wide ones
        take (default these), when the two widths travel in dtypes whose reductions pad
        differently (a float32 reduce-scatter pads, a low-precision one does not)."""
        score_wire = wire if score_wire is None else score_wire
        scores = self if scores is None else scores
        nbytes = padded = msgs = 0
        for move, (a, b) in GAT_CALLS.items():
            if move not in self.rows:
                continue
            each = F32 if move == "m_out" else score_wire
            nbytes = nbytes + self.rows[move] * (a * heads * each + b * z * wire)
            padded = padded + scores.pad[move] * a * heads * each + self.pad[move] * b * z * wire
            msgs = msgs + self.msgs[move] * (a + b)
        return nbytes, padded, msgs


def product_rows(mv: Moves):
    """((forward, backward) rows per feature, (forward, backward) messages) of the operator's
    own product: ``g_in + r_out`` forward, ``g_out + r_in`` backward."""
    return ((mv.rows["g_in"] + mv.rows["r_out"], mv.rows["g_out"] + mv.rows["r_in"]),
            (mv.msgs["g_in"] + mv.msgs["r_out"], mv.msgs["g_out"] + mv.msgs["r_in"]))


def per_layer(moves):
    """A ``Cost.moves`` from ``moves(structure, dims, variant, reduce)`` alike for every
    layer."""
    def entry(s, dims, variant, layers, rotate, reduce: bool = True):
        mv = moves(s, dims, variant, reduce)
        return lambda layer: mv
    return entry


def exact_moves(cost, structure, dims, variant, layers, rotate, reduce: bool):
    """``layer -> Moves`` of an algorithm on ``structure``: its entry's ``moves``, or for a
    1D entry its in axis from ``exact`` (a :class:`~.cost_terms.LinearCounts`: forward =
    gather, backward = reduction) and ``padding``."""
    if cost.moves is not None:
        return cost.moves(structure, dims, variant, layers, rotate, reduce)
    counts = cost.exact(structure, dims, variant, layers, rotate)
    pad = (cost.padding(structure, dims, variant, reduce) if cost.padding is not None
           else (0, 0))
    moves = Moves.of(g_in=(counts.rows[0], counts.msgs[0], pad[0]),
                     r_in=(counts.rows[1], counts.msgs[1], pad[1]))
    return lambda layer: moves


def estimated_moves(cost, sizes, dims, variant) -> Moves:
    """The average rank's :class:`Moves`: the entry's ``moves_estimate``, or for a 1D entry
    its in axis from ``estimate`` (forward rows and messages = gather, the backward's =
    reduction)."""
    if cost.moves_estimate is not None:
        return cost.moves_estimate(sizes, dims, variant)
    spmm = cost.estimate(sizes, dims, variant)
    fwd, back = spmm(1, False, 1), spmm(1, True, 1)
    return Moves.of(g_in=(fwd[0], fwd[1]), r_in=(back[0] - fwd[0], back[1] - fwd[1]))


def others_with_rows(sizes, group) -> np.ndarray:
    """Per rank: the other members of its ``group`` (group ids) owning at least one row —
    the messages of an all-to-all sending each member its rows."""
    has = (np.asarray(sizes) > 0).astype(np.int64)
    return np.bincount(group, weights=has).astype(np.int64)[group] - has
