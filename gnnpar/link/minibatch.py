"""Mini-batch link prediction: edge batches as seeds, data parallel or grouped.

A step's seeds are a batch of training positives with their negatives
(:func:`gnnpar.link.negatives.negatives`, keyed by each positive's index in ``train_pos``
and the epoch). The nodes sampled around are the union of the batch's endpoints
(:meth:`LinkPlan.minibatches`), so the macrobatch service samples, deduplicates, caches and
prefetches their blocks as it does a node batch's (:mod:`gnnpar.sampling.service`); the
encoder's output rows are those nodes in id order, and each pair's endpoints are picked
from them. The loss of a step is the summed binary cross-entropy of its pairs over the
step's pair count on every rank, so the gradients summed over the ranks are those of the
mean over all ranks' pairs of that step (as :mod:`gnnpar.training.minibatch_loop` does for nodes).

Rank ``r`` of ``W`` trains on the positives whose index is ``r`` modulo ``W``; its plan
shuffles them per epoch and splits them into the same number of steps as every other rank
(:class:`gnnpar.sampling.seeds.EpochPlan`). Grouped (``--algo A --group-size g``,
:mod:`gnnpar.sampling.grouped`), the plan's ranks are the d groups: the g members of group k
share its steps and each scores the pairs whose source it owns (:func:`link_minibatch_step`).
Evaluation runs the encoder over the whole training graph with the exact Â (full
neighbourhood, no sampling) and scores the held-out pairs as the full-batch loop does
(:func:`gnnpar.link.loop.evaluate_link`).
"""
from __future__ import annotations

import threading
from typing import Dict, List, Tuple

import numpy as np
import torch

from gnnpar.interfaces import LayerOps
from gnnpar.kernels.bipartite import member_rows
from gnnpar.nn.precision import autocast, matmuls
from gnnpar.sampling.seeds import EpochPlan

from gnnpar.link.decoders import summed_link_loss
from gnnpar.link.exchange import PairExchange
from gnnpar.link.loop import evaluate_link
from gnnpar.link.negatives import negatives

Pairs = Tuple[np.ndarray, np.ndarray]  #: (positives (2, B), negatives (2, B·ratio))


def rank_positives(count: int, world: int, rank: int) -> np.ndarray:
    """Indices into ``train_pos`` that data-parallel rank ``rank`` trains on."""
    return np.arange(rank, count, world, dtype=np.int64)


class LinkPlan(EpochPlan):
    """The steps of data-parallel rank ``stream`` (module docstring): ``train_pos`` (2, K)
    global ids, ``world`` ranks, ``batch_size`` positives a step over all of this rank's
    steps, ``ratio`` negatives a positive on ``num_nodes`` nodes. Counts (``total``,
    :meth:`global_count`) are of pairs, positives and negatives together."""

    def __init__(self, train_pos: np.ndarray, world: int, stream: int, batch_size: int,
                 seed: int, ratio: int, num_nodes: int):
        k = int(train_pos.shape[1])
        counts = [rank_positives(k, world, r).shape[0] for r in range(world)]
        super().__init__(rank_positives(k, world, stream), counts, stream, batch_size, seed)
        self.train_pos, self.ratio, self.num_nodes = train_pos, int(ratio), int(num_nodes)
        self._pairs: Dict[int, List[Pairs]] = {}
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return super().total * (1 + self.ratio)

    def global_count(self, step: int) -> int:
        return super().global_count(step) * (1 + self.ratio)

    def minibatches(self, epoch: int) -> List[np.ndarray]:
        """The nodes of each of this rank's steps of ``epoch`` (sorted, distinct): the
        endpoints of the step's positives and negatives (kept for :meth:`pairs`)."""
        steps = []
        nodes = []
        for index in super().minibatches(epoch):  # positive indices, sorted within a step
            pos = self.train_pos[:, index]
            neg = negatives(pos, index, self.num_nodes, self.ratio, self.seed, epoch)
            steps.append((pos, neg))
            nodes.append(np.unique(np.concatenate([pos.reshape(-1), neg[1]])))
        with self._lock:
            for old in [e for e in self._pairs if e < epoch - 1]:
                del self._pairs[old]
            self._pairs[epoch] = steps
        return nodes

    def pairs(self, epoch: int, step: int) -> Pairs:
        """Step ``step`` of ``epoch``'s positives and negatives (after :meth:`minibatches`)."""
        with self._lock:
            return self._pairs[epoch][step]


def _rows(z: torch.Tensor, nodes: np.ndarray, pairs: np.ndarray):
    """Both endpoints' rows of ``pairs`` (global ids) from ``z``, the rows of ``nodes``."""
    at = torch.from_numpy(np.searchsorted(nodes, pairs).astype(np.int64)).to(z.device)
    return z.index_select(0, at[0]), z.index_select(0, at[1])


class _GroupPairs:
    """A group member's view of a step's pairs: the
    :class:`~gnnpar.link.exchange.PairExchange` over the step's seeds (block-local ids
    ``[0, S)``; every member knows who owns each, ``batch.seed_owner``, so the directory
    costs no communication, and a member's rows are its owned ids ascending, as its encoder
    output holds them) and the map from the seeds' global ids to those block-local ids."""

    def __init__(self, group_comm, batch):
        owner = np.asarray(batch.seed_owner, np.int64)
        axes = tuple(group_comm.grid.shape)
        members = group_comm.grid.ranks_of(axes)
        me = members.index(group_comm.grid.rank)
        local, _, starts = member_rows(owner, len(members))
        self.exchange = PairExchange(group_comm, axes, owner, local, me,
                                     int(starts[me + 1] - starts[me]))
        self.ids = np.asarray(batch.blocks[-1].src_ids[:owner.shape[0]], np.int64)
        self.order = np.argsort(self.ids, kind="stable")

    def scores(self, decoder, z, pairs: np.ndarray) -> torch.Tensor:
        """Scores of the ``pairs`` (global ids) whose source this member owns; collective
        over the group (the other endpoints' rows come from their owners)."""
        at = self.order[np.searchsorted(self.ids, pairs, sorter=self.order)]
        return decoder(*self.exchange.rows(z, at[:, self.exchange.owns(at[0])]))


def link_minibatch_step(encoder, decoder, opt, engine, batch, plan: LinkPlan,
                        precision: str = "fp32") -> torch.Tensor:
    """One step on a ready minibatch of pairs; returns its summed loss (float64).

    Data parallel, a rank's encoder output holds every node of its step and it scores all
    its pairs. In a group (``batch.shards``: :mod:`gnnpar.sampling.grouped`) every member
    has the same step's pairs but only its owned seeds' rows: it scores the pairs whose
    source it owns, the other endpoint's row exchanged inside the group (with its gradient
    in the backward), so each pair is scored once in the world and the global count stays
    the normaliser."""
    pos, neg = plan.pairs(batch.epoch, batch.step)
    opt.zero_grad(set_to_none=True)
    with matmuls(precision):
        with autocast(precision, batch.x.device):
            z = encoder(LayerOps(engine.operators(batch), batch.x_dropout), batch.x)
        z = z.float()
        if batch.shards is None:
            loss = summed_link_loss(decoder(*_rows(z, batch.seeds, pos)),
                                    decoder(*_rows(z, batch.seeds, neg)))
        else:
            group = _GroupPairs(engine.group_comm, batch)
            loss = summed_link_loss(group.scores(decoder, z, pos), group.scores(decoder, z, neg))
        (loss / max(plan.global_count(batch.step), 1)).backward()
    engine.sync_grads([p for m in (encoder, decoder) for p in m.parameters()])
    opt.step()
    return loss.detach().to(torch.float64)


def link_minibatch_parts(encoder, decoder, split, pairs_source, precision: str = "fp32"):
    """``(step, evaluate)`` for :func:`gnnpar.training.minibatch_loop.fit_minibatch`: the link step
    above and the full-graph link evaluation on the run's evaluation runtime."""
    def step(opt, engine, batch, plan, _count):
        encoder.train()
        decoder.train()
        return link_minibatch_step(encoder, decoder, opt, engine, batch, plan, precision)

    def evaluate(runtime):
        return evaluate_link(encoder, decoder, runtime, split, pairs_source, precision)
    return step, evaluate
