"""Node-wise neighbour sampling of one minibatch, layer by layer from the seeds outwards.

Fanouts follow DGL's ``NeighborSampler`` order: ``fanouts[l]`` is the fanout of GNN layer
``l`` counted from the input, so the seeds (the last layer's destinations) draw
``fanouts[-1]`` neighbours each and the input layer ``fanouts[0]``. ``-1`` keeps every
neighbour.

Values (``kind`` = the model's normalisation). Row i keeps its diagonal Â_ii exactly; a kept
neighbour j gets Â_ij · d_i / k_i, where d_i is i's neighbour count and k_i the number of
draws (the Horvitz–Thompson weight, so the sampled row is an unbiased estimate of row i of
the full-graph Â·H, with or without replacement). Hence:

- ``gcn``: the full-graph normalisation D̃^{-1/2}(A'+I)D̃^{-1/2} of the sampled edges, rescaled
  by d_i/k_i; the self term stays exact.
- ``mean`` (SAGE), unweighted graph without self loops: Â_ij = 1/d_i, so every kept
  neighbour gets 1/k_i — exactly the standard sampled mean.
- fanout −1 (or d_i ≤ fanout without replacement): k_i = d_i, no rescaling, the block rows
  *are* Â's rows, and a step on them equals full-batch training on those seeds.

Randomness comes only from the ``rng`` handed in (see :func:`batch_rng`): one
``rng.random((rows drawn, fanout))`` per layer, seeds' layer first.

Shapes: seeds (B,) distinct global ids → L blocks, ``blocks[-1]`` is B × n_src.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

from gnnpar.datasets import InputError

from gnnpar.sampling import fast
from gnnpar.sampling.blocks import Block, Relabeler, assemble_block
from gnnpar.sampling.choose import choose_entries, choose_positions, draw_count, keeps_distinct


def batch_rng(seed: int, epoch: int, stream: int, step: int) -> np.random.Generator:
    """The generator of one minibatch: a function of (seed, epoch, stream, step) only, never of
    which worker samples it or what else it is sampled with. ``stream`` is the data-parallel
    rank (0 serially)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [int(seed), int(epoch), int(stream), int(step)])))


def input_dropout_seed(seed: int, epoch: int, stream: int, step: int) -> int:
    """The seed of one minibatch's input-feature dropout mask (:mod:`gnnpar.nn.dropout`'s hash
    mask), in [0, 2⁶²) as the ones a model draws: like :func:`batch_rng`, a function of
    (seed, epoch, stream, step) only, from a seed sequence of its own (a fifth word), so it
    does not repeat the sampler's draws and a resumed run draws it again alike."""
    state = np.random.SeedSequence([int(seed), int(epoch), int(stream), int(step), 1])
    return int(state.generate_state(1, np.uint64)[0] >> np.uint64(2))


def parse_fanouts(text) -> Tuple[int, ...]:
    """``"15,10,5"`` (or a sequence) → (15, 10, 5); each −1 (all) or ≥ 0."""
    try:
        fanouts = tuple(int(t) for t in (text.split(",") if isinstance(text, str) else text))
    except (TypeError, ValueError):
        raise InputError(f"--fanouts must be comma-separated integers like 15,10,5, got {text!r}")
    if not fanouts or any(f < -1 for f in fanouts):
        raise InputError(f"--fanouts needs one integer >= 0 (or -1 = all) per layer, got {text!r}")
    return fanouts


@dataclass(frozen=True)
class SamplerConfig:
    """fanouts: per layer, input layer first (−1 = all neighbours); kind: the model's
    normalisation (``gcn``/``mean``/``sum``); replace: draw with replacement."""

    fanouts: Tuple[int, ...]
    kind: str = "gcn"
    replace: bool = False

    def __post_init__(self):
        object.__setattr__(self, "fanouts", parse_fanouts(self.fanouts))


def sample_entries(topo, kind: str, dst: np.ndarray, fanout: int, replace: bool,
                   u: np.ndarray, owners=None):
    """The kept entries of rows ``dst``: ``(k (R,), cols (E,), vals (E,) float32)``.

    Rows are read through their CSR offsets, i.e. the product Q·A of the selection matrix Q
    (one 1 per row, at column dst[r]) with the off-diagonal adjacency, restricted to the
    positions :func:`~gnnpar.sampling.choose.choose_entries` keeps; the other entries of Q·A
    are never touched. A partitioned topology asks the rows' owners through ``owners`` =
    ``(comm, axes)`` (a collective). A replicated one runs the compiled
    :func:`~gnnpar.sampling.fast.sample_rows` (the same arrays as :func:`sample_entries_numpy`,
    the reference, in a few flat passes).
    """
    if topo.replicated and fast.available():
        return fast.sample_rows(topo.indptr, topo.entries, kind, np.asarray(dst, np.int64),
                                fanout, replace, u)
    return sample_entries_numpy(topo, kind, dst, fanout, replace, u, owners)


def sample_entries_numpy(topo, kind: str, dst: np.ndarray, fanout: int, replace: bool,
                         u: np.ndarray, owners=None):
    """:func:`sample_entries` by vectorised numpy passes (partitioned topologies; the
    reference the compiled kernel is tested against)."""
    deg = topo.degree[dst]
    if topo.replicated:
        k, entry = choose_entries(deg, topo.indptr[dst], fanout, replace, u)
        kept = topo.entries[entry]
        cols, vals = np.ascontiguousarray(kept["col"]), kept[kind]
    else:
        k, pos = choose_positions(deg, fanout, replace, u)
        cols, vals = topo.lookup(dst, k, pos, kind, *owners)
    if fanout >= 0:
        factor = np.divide(deg, k, out=np.ones(k.shape[0]), where=k > 0)
        if np.any(factor != 1.0):
            return k, cols, vals * np.repeat(factor.astype(np.float32), k)
    return k, cols, np.ascontiguousarray(vals)


class NeighborSampler:
    """Samples one minibatch at a time (the reference the bulk sampler is tested against)."""

    def __init__(self, topo, cfg: SamplerConfig):
        topo.check_kind(cfg.kind)
        self.topo, self.cfg = topo, cfg

    def sample(self, seeds: np.ndarray, rng: np.random.Generator,
               relabel: Relabeler = None, owners=None) -> List[Block]:
        """Blocks for ``seeds``, input layer first (``owners``: see :func:`sample_entries`)."""
        topo, cfg = self.topo, self.cfg
        relabel = relabel or Relabeler(topo.num_nodes)
        frontier = check_seeds(seeds, topo.num_nodes)
        blocks = []
        for fanout in reversed(cfg.fanouts):
            deg = topo.degree[frontier]
            u = draw_uniforms(rng, draw_count(deg, fanout, cfg.replace), fanout)
            k, cols, vals = sample_entries(topo, cfg.kind, frontier, fanout, cfg.replace, u, owners)
            block = assemble_block(frontier, k, cols, vals, topo.self_values[cfg.kind][frontier],
                                   relabel)
            block.distinct = keeps_distinct(fanout, cfg.replace)
            blocks.append(block)
            frontier = block.src_ids
        return blocks[::-1]


def draw_uniforms(rng: np.random.Generator, rows: int, fanout: int) -> np.ndarray:
    """(rows, fanout) uniforms in [0, 1); nothing is drawn for fanout −1."""
    if fanout < 0:
        return None
    return rng.random((rows, fanout)) if rows else np.zeros((0, fanout))


def check_seeds(seeds: Sequence[int], num_nodes: int) -> np.ndarray:
    seeds = np.asarray(seeds, np.int64)
    if seeds.size and (seeds.min() < 0 or seeds.max() >= num_nodes):
        raise InputError(f"seed ids must lie in [0, {num_nodes})")
    return seeds
