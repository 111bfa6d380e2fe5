"""Bulk matrix sampling: all K minibatches of a macrobatch in one pass per layer.

Per layer l, stack the K frontiers (destination sets) F_1 … F_K into one selection matrix

    Q_l  (R × n),  R = Σ_b |F_b|,   Q_l[r, F(r)] = 1        (block-diagonal over minibatches)

and sample per row of the product P_l = Q_l · A (A = the off-diagonal adjacency of
:class:`~gnnpar.sampling.topology.Topology`). A one-nonzero-per-row Q makes the product a
row gather: P_l's row r is A's row F(r), so ``P.indptr = cumsum(deg[F])`` and P is never
materialised — the fanout positions are chosen on P's row lengths for all R rows at once
and only the kept entries of A are read (one gather of columns and values for the whole
macrobatch). The kept columns of each minibatch's rows, united with its destinations, are
the next frontier (the rows of Q_{l+1}); relabelling them to block-local ids is the only
per-minibatch work (a vectorised pass each, no per-node loop).

So the per-layer costs (degree and offset gathers, position choice, entry gathers, value
scaling) are paid once per macrobatch instead of once per minibatch. Randomness is drawn
per minibatch from its own generator in the same order as :class:`NeighborSampler`, hence
``BulkSampler.sample(seeds_list, rngs)[b]`` equals ``NeighborSampler.sample(seeds_list[b],
rngs[b])`` block for block (tested), whatever K and whichever worker runs it.

Shapes: K seed arrays (B_b,) → K lists of L blocks (input layer first).
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from gnnpar.sampling.blocks import Block, Relabeler, assemble_block
from gnnpar.sampling.choose import draw_count, keeps_distinct
from gnnpar.sampling.neighbor import SamplerConfig, check_seeds, sample_entries


class BulkSampler:
    """Samples a whole macrobatch at once (see module docstring)."""

    def __init__(self, topo, cfg: SamplerConfig):
        topo.check_kind(cfg.kind)
        self.topo, self.cfg = topo, cfg

    def sample(self, seeds: Sequence[np.ndarray], rngs: Sequence[np.random.Generator],
               relabel: Relabeler = None, owners=None) -> List[List[Block]]:
        """One list of blocks (input layer first) per seed array; ``rngs[b]`` drives
        minibatch b. ``owners`` = (comm, axes) to ask the rows' owners in a partitioned
        topology: one lookup per layer for the whole macrobatch."""
        if len(seeds) != len(rngs):
            raise ValueError(f"got {len(seeds)} seed arrays but {len(rngs)} generators")
        topo, cfg = self.topo, self.cfg
        relabel = relabel or Relabeler(topo.num_nodes)
        selfv = topo.self_values[cfg.kind]
        frontiers = [check_seeds(s, topo.num_nodes) for s in seeds]
        per_batch: List[List[Block]] = [[] for _ in seeds]
        for fanout in reversed(cfg.fanouts):
            rows = np.concatenate(frontiers) if frontiers else np.zeros(0, np.int64)
            row_cut = np.cumsum([0] + [f.shape[0] for f in frontiers])
            deg = topo.degree[rows]
            u = self._uniforms(rngs, deg, row_cut, fanout)
            k, cols, vals = sample_entries(topo, cfg.kind, rows, fanout, cfg.replace, u, owners)
            edge_cut = np.concatenate([[0], np.cumsum(k)])[row_cut]
            dst_self = selfv[rows]
            for b, front in enumerate(frontiers):
                r0, r1, e0, e1 = row_cut[b], row_cut[b + 1], edge_cut[b], edge_cut[b + 1]
                block = assemble_block(front, k[r0:r1], cols[e0:e1], vals[e0:e1],
                                       dst_self[r0:r1], relabel)
                block.distinct = keeps_distinct(fanout, cfg.replace)
                per_batch[b].append(block)
                frontiers[b] = block.src_ids
        return [blocks[::-1] for blocks in per_batch]

    def _uniforms(self, rngs, deg, row_cut, fanout):
        """Each minibatch's draws from its own generator, concatenated in minibatch order."""
        if fanout < 0:
            return None
        counts = [draw_count(deg[row_cut[b]:row_cut[b + 1]], fanout, self.cfg.replace)
                  for b in range(len(rngs))]
        cut = np.cumsum([0] + counts)
        u = np.empty((int(cut[-1]), fanout))
        for b, rng in enumerate(rngs):
            if counts[b] and fanout:
                # the numbers rng.random((rows, fanout)) returns, written in place
                rng.random(out=u[cut[b]:cut[b + 1]])
        return u

