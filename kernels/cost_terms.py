"""The pieces every algorithm's cost-model entry is written with (no algorithm names here).

An algorithm's :class:`Cost` (its field ``cost`` in :mod:`gnnpar.kernels.algorithms`) says, in
the terms of :mod:`gnnpar.kernels.cost_model`:

- ``exact(structure, dims, variant, layers, rotate)``: an object whose ``spmm(f, layer,
  wire)`` returns per-rank arrays ``(fwd bytes, fwd msgs, bwd bytes, bwd msgs)`` of one SpMM of
  width f whose feature rows travel at ``wire`` bytes an element, equal to what
  :class:`gnnpar.kernels.comm.Comm` counts (:class:`LinearCounts` when the rows sent do not
  depend on f);
- ``estimate(sizes, dims, variant)``: a function ``(f, needs_backward, wire) -> (bytes,
  messages, recv_rows)`` for the average rank of a graph known only by its :class:`Sizes`
  (:func:`per_feature` when the rows sent do not depend on f);
- ``matrix_bytes(a, n, m, dims, layers)`` (optional): peak bytes of Â a rank stores, given
  ``a`` = Â and Âᵀ as CSR over its owned rows (the default when absent);
- ``candidates(p)`` (optional): the ``(dims, variant)`` pairs ``--algo auto`` and
  ``gnnpar-plan`` rank at world size p; absent = never chosen automatically;
- ``padding(structure, dims, variant, reduce)`` (optional): per-rank arrays ``(fwd, bwd)`` of
  the rows per feature that ``all_gather``/``reduce_scatter`` move beyond the logical count
  (they pad every member's chunk to the group's largest: :func:`gather_padding`,
  :func:`reduce_padding`; ``reduce=False``: the all-gathers' alone, since a low-precision
  reduce-scatter travels as an all-to-all, which pads nothing); absent = none, unless the
  ``exact`` counts object has a ``padding_bytes(f, layer, wire, reduce)`` method giving per-rank
  ``(fwd, bwd)`` padded bytes itself (3d: its feature slices and Â pieces do not pad rows × f);
- ``work(structure, dims, variant, layers, rotate)`` (optional): a function ``(f, layer)`` ->
  per-rank multiply-adds of one SpMM of width f (the rank's non-zeros × the features it
  multiplies); absent = the cost model's table for the built-in kernels, else the owned rows'
  non-zeros × f.

- ``moves(structure, dims, variant, layers, rotate, reduce)`` (optional): a function
  ``layer -> Moves``, the rows of each move of the edge-valued operations
  (:mod:`gnnpar.kernels.cost_attention`); ``moves_estimate(sizes, dims, variant)`` (optional):
  the average rank's; absent = a 1D operator's, from ``exact``/``padding`` and ``estimate``.

``dims`` is the algorithm's grid in the cost model's convention: None (1D), c (1.5d),
(pr, pc) (2d), (px, py, pz) (3d/4d).

**The wire.** Every floating tensor an SpMM exchanges (feature rows, their gradients, partial
sums) travels at ``wire`` bytes an element: the ``--comm-dtype``, else the features' own dtype
(bf16 under ``--precision bf16``), else float32 (:data:`F32`). Everything else keeps its dtype:
the weights' gradient all-reduce (float32, :func:`allreduce_bytes`), index plans, and 3d's Â
pieces (int64 row pointers and indices, float32 values sent exactly).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from gnnpar.datasets.normalize import union_structure

F32 = 4


# ----------------------------------------------------------------- the model's workload
def gat_kind(heads: int) -> str:
    """The cost model's ``kind`` of a GAT with ``heads`` heads."""
    return f"gat:{int(heads)}"


def gat_heads(kind: str) -> Optional[int]:
    """Heads of a GAT ``kind`` (:func:`gat_kind`), None for any other model."""
    return int(kind[4:]) if kind.startswith("gat:") else None


def layer_exchanges(kind: str, widths: Sequence[int]):
    """[(layer, f, needs_backward)]: every product-like pass over Â's non-zeros of one
    forward pass, ``f`` features wide, in order (``kind``: ``"gcn"``, ``"sage"`` or
    :func:`gat_kind`): the products' traffic, and every model's sparse work. GCN and SAGE: one
    a layer, at min(f_in, f_out) (they aggregate at the narrower width); the first layer's
    has no backward when it reads the raw features (f_in ≤ f_out). GAT: two a layer, each
    with a backward (both depend on the layer's weights): the source scores, ``heads`` wide,
    and the weighted product of the projected rows z, the layer's width in all (``hidden``
    for a hidden layer, heads × f_out for the output layer, which averages its heads); its
    traffic is not a product's (:mod:`gnnpar.kernels.cost_attention`)."""
    heads = gat_heads(kind)
    pairs = list(zip(widths[:-1], widths[1:]))
    if heads is None:
        return [(l, min(fi, fo), l > 0 or fi > fo) for l, (fi, fo) in enumerate(pairs)]
    out = []
    for l, (_, fo) in enumerate(pairs):
        out += [(l, heads, True), (l, gat_z_width(heads, fo, l == len(pairs) - 1), True)]
    return out


def gat_z_width(heads: int, f_out: int, last: bool) -> int:
    """A GAT layer's projected width in all: f_out (heads concatenated) or heads × f_out."""
    return heads * f_out if last else f_out


def spmm_widths(kind: str, widths: Sequence[int]):
    """[(f, needs_backward)] of :func:`layer_exchanges`, without the layer."""
    return [(f, back) for _, f, back in layer_exchanges(kind, widths)]


def param_count(kind: str, widths: Sequence[int]) -> int:
    """Parameters of :class:`gnnpar.nn.models.GNN` (GCN: W + b; SAGE: W_neigh + b + W_root;
    GAT: W, a_src and a_dst, each z wide, and the bias, z wide in a hidden layer and f_out in
    the output layer). Any other kind (a user's model) is counted as GCN."""
    heads = gat_heads(kind)
    pairs = list(zip(widths[:-1], widths[1:]))
    if heads is not None:
        total = 0
        for l, (fi, fo) in enumerate(pairs):
            last = l == len(pairs) - 1
            z = gat_z_width(heads, fo, last)
            total += fi * z + 2 * z + (fo if last else z)
        return int(total)
    per = (lambda a, b: 2 * a * b + b) if kind == "sage" else (lambda a, b: a * b + b)
    return int(sum(per(a, b) for a, b in pairs))


def _chunk(numel: int, g: int, i):
    return numel // g + (np.asarray(i) < numel % g)


def allreduce_bytes(numel: int, p: int) -> np.ndarray:
    """Comm.all_reduce's count of a float32 tensor over p ranks, per rank."""
    if p == 1:
        return np.zeros(1, np.int64)
    return 2 * (numel - _chunk(numel, p, np.arange(p))) * F32


def coll(g, present=True):
    """Messages one rank sends in a collective over g ranks (Comm's rule)."""
    return (g - 1) if (g > 1 and present) else 0


def factorisations(p: int, k: int):
    """Every ordered k-tuple of positive integers whose product is p."""
    if k == 1:
        yield (p,)
        return
    for d in range(1, p + 1):
        if p % d == 0:
            for rest in factorisations(p // d, k - 1):
                yield (d,) + rest


# ----------------------------------------------------------------- exact per-rank counts
@dataclass
class Structure:
    """Â's non-zeros as (row, col) global ids and each vertex's owner rank (p ranks)."""

    rows: np.ndarray
    cols: np.ndarray
    owner: np.ndarray
    p: int

    @classmethod
    def from_graph(cls, graph, owner, p: int) -> "Structure":
        indptr, indices, _ = union_structure(graph)
        rows = np.repeat(np.arange(graph.num_nodes, dtype=np.int64), np.diff(indptr))
        return cls(rows, np.asarray(indices, np.int64), np.asarray(owner, np.int64), p)

    @property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.owner, minlength=self.p).astype(np.int64)


def plan_counts(p, dest, item, item_owner):
    """Distinct (dest, item) pairs with a remote owner: (recv rows, send rows, recv msgs,
    send msgs) per rank — a :class:`HaloPlan` built by ``compact_plan`` or the 1D shards."""
    keep = item_owner != dest
    n = int(item.max(initial=0)) + 1
    key = np.unique(dest[keep] * n + item[keep])
    d, it = key // n, key % n
    # owner of each distinct item (items keep their owner whatever the destination)
    lookup = np.zeros(n, np.int64)
    lookup[item[keep]] = item_owner[keep]
    o = lookup[it]
    recv = np.bincount(d, minlength=p)
    send = np.bincount(o, minlength=p)
    pairs = np.unique(d * p + o)
    recv_msgs = np.bincount(pairs // p, minlength=p)
    send_msgs = np.bincount(pairs % p, minlength=p)
    return recv, send, recv_msgs, send_msgs


def _group_max(values, group):
    """Per rank: the largest of ``values`` over the members of its ``group`` (group ids)."""
    values, group = np.asarray(values, np.int64), np.asarray(group, np.int64)
    mx = np.zeros(int(group.max(initial=0)) + 1, np.int64)
    np.maximum.at(mx, group, values)
    return mx[group]


def gather_padding(sizes, group) -> np.ndarray:
    """Rows per feature an ``all_gather`` of ``sizes`` rows per member moves beyond its logical
    count, per rank (``group``: each rank's group id): (g − 1)·(max chunk − mine)."""
    g = np.bincount(group)[group]
    return (g - 1) * (_group_max(sizes, group) - np.asarray(sizes, np.int64))


def reduce_padding(sizes, group, total=None) -> np.ndarray:
    """The same for a ``reduce_scatter`` whose chunks are ``sizes`` (a rank's own chunk):
    (g − 1)·max chunk − (total − mine), total = the group's Σ sizes unless given."""
    sizes, group = np.asarray(sizes, np.int64), np.asarray(group, np.int64)
    g = np.bincount(group)[group]
    if total is None:
        total = np.bincount(group, weights=sizes).astype(np.int64)[group]
    return (g - 1) * _group_max(sizes, group) - (total - sizes)


class LinearCounts:
    """Exact counts of a kernel whose rows sent do not depend on f: ``rows`` = (fwd, bwd) rows
    each rank sends per feature, ``msgs`` = (fwd, bwd) messages, per-rank arrays."""

    def __init__(self, rows, msgs):
        self.rows, self.msgs = rows, msgs

    def spmm(self, f: int, layer: int, wire: int = F32):
        """(fwd bytes, fwd msgs, bwd bytes, bwd msgs) per rank, ``wire`` bytes an element."""
        return (self.rows[0] * f * wire, self.msgs[0], self.rows[1] * f * wire, self.msgs[1])


# ----------------------------------------------------------------- estimates (no partition)
@dataclass(frozen=True)
class Sizes:
    """What an estimate knows: n vertices, m non-zeros, p ranks and the share ``cut`` of
    non-zeros whose column another rank owns (default 1 − 1/p, a random partition)."""

    n: int
    m: int
    p: int
    cut: float

    @classmethod
    def of(cls, n: int, m: int, p: int, cut_fraction: Optional[float] = None) -> "Sizes":
        cut = (1.0 - 1.0 / p) if cut_fraction is None else float(cut_fraction)
        return cls(n, m, p, cut)

    @property
    def nr(self) -> float:
        return self.n / self.p

    @property
    def mr(self) -> float:
        return self.m / self.p

    @property
    def scale(self) -> float:
        """The cut relative to a random partition's."""
        return self.cut / (1.0 - 1.0 / self.p) if self.p > 1 else 0.0


def distinct(e: float, w: float) -> float:
    """Expected distinct rows hit by e uniform non-zeros over w candidate rows."""
    return w * (1.0 - np.exp(-e / w)) if w > 0 and e > 0 else 0.0


def partners(rows: float, g: int) -> float:
    """Expected ranks (of g − 1 others) that send at least one of ``rows`` uniform rows."""
    return (g - 1) * (1.0 - np.exp(-rows / (g - 1))) if g > 1 else 0.0


def per_feature(fwd_rows, bwd_rows, fwd_msgs, bwd_msgs, recv_rows):
    """An estimate whose rows sent do not depend on f: rows and received rows per feature."""
    def spmm(f: int, back: bool, wire: int = F32):
        return ((fwd_rows + (bwd_rows if back else 0)) * f * wire,
                fwd_msgs + (bwd_msgs if back else 0), recv_rows * f)
    return spmm


# ----------------------------------------------------------------- an algorithm's entry
@dataclass(frozen=True)
class Cost:
    """An algorithm's cost-model entry (see the module docstring for each field)."""

    exact: Callable
    estimate: Callable
    matrix_bytes: Optional[Callable] = None
    candidates: Optional[Callable] = None
    padding: Optional[Callable] = None
    work: Optional[Callable] = None
    moves: Optional[Callable] = None
    moves_estimate: Optional[Callable] = None


# ----------------------------------------------------------------- padding and work rules
def no_padding(s: Structure, dims, variant, reduce: bool = True):
    """Per-rank padded rows (forward, backward) of an algorithm that pads nothing
    (all-to-all moves exactly its rows)."""
    return np.zeros(s.p, np.int64), np.zeros(s.p, np.int64)


def owned_rows_work(s: Structure, dims, variant, layers, rotate):
    """Work rule of the 1D algorithms: each rank multiplies its own rows' non-zeros."""
    nnz = np.bincount(s.owner[s.rows], minlength=s.p).astype(np.int64)
    return lambda f, layer: nnz * f


def dest_work(dest_of):
    """Work rule of a block layout: ``dest_of(structure, dims)`` gives each non-zero's rank."""
    def work(s: Structure, dims, variant, layers, rotate):
        nnz = np.bincount(dest_of(s, dims), minlength=s.p).astype(np.int64)
        return lambda f, layer: nnz * f
    return work
