"""Full-batch link prediction: one loop for one process and for every distributed algorithm.

Each epoch the encoder (any model the node trainer runs: ``model(ops, x)`` → one embedding
row a vertex) runs on the training graph (:func:`gnnpar.link.split.split_edges`: no held-out
edge in it); every training positive is scored with its ``neg_ratio`` negatives
(:mod:`gnnpar.link.negatives`) by the rank that owns its source, the other endpoint's row
brought by ``pairs`` (:class:`LocalPairs` on one process, a
:class:`~gnnpar.link.exchange.PairExchange` on several); the loss is the mean binary
cross-entropy over all pairs of all ranks (each rank's sum over the global count, gradients
summed over the ranks, as the node trainer does).

Evaluation runs the encoder on the same training graph and reports ``val_auc``, ``test_auc``,
``val_mrr``, ``test_mrr`` and ``test_hits@K`` for K in :data:`gnnpar.link.metrics.HITS`: the
MRR from each rank's reciprocal ranks (a positive and its own negatives share a source, so
one rank), the AUC and Hits@K from every rank's scores gathered.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from gnnpar.training.epochs import run_epochs
from gnnpar.interfaces import LayerOps
from gnnpar.nn.precision import autocast, matmuls
from gnnpar.training.trainer import TrainConfig, costed_record, make_optimizer

from gnnpar.link.decoders import summed_link_loss
from gnnpar.link.metrics import HITS, auc, hits_at, reciprocal_ranks
from gnnpar.link.negatives import check_ratio, negatives
from gnnpar.link.split import LinkSplit


class LocalPairs:
    """One process's pairs: it owns every row; rows are picked from ``z`` directly."""

    def owns(self, ids: np.ndarray) -> np.ndarray:
        return np.ones(np.asarray(ids).shape, bool)

    def rows(self, z: torch.Tensor, pairs) -> Tuple[torch.Tensor, torch.Tensor]:
        p = torch.as_tensor(np.asarray(pairs), dtype=torch.int64, device=z.device)
        return z.index_select(0, p[0]), z.index_select(0, p[1])

    def gather(self, scores: np.ndarray) -> np.ndarray:
        return scores


def _scores(decoder, pairs_source, z: torch.Tensor, pairs: np.ndarray) -> torch.Tensor:
    return decoder(*pairs_source.rows(z, pairs))


#: pairs scored at a time in evaluation: their endpoint rows are two (pairs × width) tensors
EVAL_BLOCK = 1 << 16


def _scores_blocked(decoder, pairs_source, z: torch.Tensor, pairs: np.ndarray, runtime,
                    block: int = EVAL_BLOCK) -> torch.Tensor:
    """:func:`_scores` of ``pairs`` in blocks of ``block`` (no autograd: evaluation), so the
    endpoint rows held at once stay bounded (a test side's ranked pairs are K × R, e.g.
    9 · 10⁶ on an R-MAT graph of 2¹⁶ vertices: 9 GB of rows at width 256 in one call). Every
    rank takes the same number of blocks (the exchange is collective), empty where its own
    pairs have run out."""
    k = int(pairs.shape[1])
    count = runtime.all_reduce_max(-(-k // block))
    parts = [_scores(decoder, pairs_source, z, pairs[:, i * block:(i + 1) * block])
             for i in range(max(count, 1))]
    return torch.cat(parts)


def _mine(pairs_source, pairs: np.ndarray) -> np.ndarray:
    """The columns of ``pairs`` whose source this rank owns."""
    return np.flatnonzero(pairs_source.owns(pairs[0]))


def _encode(encoder, runtime, precision: str) -> torch.Tensor:
    with autocast(precision, runtime.x.device):
        z = encoder(LayerOps(runtime.op), runtime.x)
    return z.float()


def link_step(encoder, decoder, opt, runtime, pairs_source, split: LinkSplit, num_nodes: int,
              neg_ratio: int, seed: int, epoch: int, precision: str = "fp32") -> float:
    """One forward/backward/step over every training positive and its negatives (this rank's
    share: the positives whose source it owns); returns the global mean loss."""
    encoder.train()
    decoder.train()
    opt.zero_grad(set_to_none=True)
    runtime.start_pass()
    index = _mine(pairs_source, split.train_pos)
    pos = split.train_pos[:, index]
    neg = negatives(pos, index, num_nodes, neg_ratio, seed, epoch)
    count = float(split.train_pos.shape[1] * (1 + neg_ratio))
    with matmuls(precision):
        z = _encode(encoder, runtime, precision)
        loss_sum = summed_link_loss(_scores(decoder, pairs_source, z, pos),
                                    _scores(decoder, pairs_source, z, neg))
        (loss_sum / count).backward()
    runtime.sync_grads([p for m in (encoder, decoder) for p in m.parameters()])
    opt.step()
    total = runtime.all_reduce_sum(loss_sum.detach().to(torch.float64).reshape(1))
    return float(total[0]) / count


@torch.no_grad()
def evaluate_link(encoder, decoder, runtime, split: LinkSplit, pairs_source=None,
                  precision: str = "fp32") -> Dict[str, float]:
    """The metrics of the module docstring (collective on several ranks)."""
    pairs_source = pairs_source or LocalPairs()
    encoder.eval()
    decoder.eval()
    runtime.start_pass()
    with matmuls(precision):
        z = _encode(encoder, runtime, precision)
    out = {}
    for side in ("val", "test"):
        pos_all = getattr(split, f"{side}_pos")
        index = _mine(pairs_source, pos_all)
        pos_pairs = pos_all[:, index]
        neg_all = getattr(split, f"{side}_neg")
        neg_pairs = neg_all[:, _mine(pairs_source, neg_all)]
        dst = getattr(split, f"{side}_neg_dst")[index]
        ranked = np.stack([np.repeat(pos_pairs[0], dst.shape[1]), dst.reshape(-1)])
        pos, neg, against = (_scores_blocked(decoder, pairs_source, z, p, runtime).double()
                             for p in (pos_pairs, neg_pairs, ranked))
        against = against.reshape(dst.shape)
        # a positive and its own negatives share a source: the reciprocal ranks are local
        mrr_total = runtime.all_reduce_sum(torch.tensor(
            [reciprocal_ranks(pos.numpy(), against.numpy()).sum(), float(pos.shape[0])],
            dtype=torch.float64))
        pos_g, neg_g = pairs_source.gather(pos.numpy()), pairs_source.gather(neg.numpy())
        out[f"{side}_auc"] = auc(pos_g, neg_g)
        out[f"{side}_mrr"] = (float(mrr_total[0] / mrr_total[1]) if mrr_total[1] > 0
                              else float("nan"))
        if side == "test":
            out.update({f"test_hits@{k}": hits_at(pos_g, neg_g, k) for k in HITS})
    return out


def link_modules(encoder, decoder) -> nn.Module:
    """The encoder and decoder as one module (one optimiser, one parameter list)."""
    return nn.ModuleDict({"encoder": encoder, "decoder": decoder})


def fit_link(encoder, decoder, runtime, split: LinkSplit, cfg: TrainConfig, num_nodes: int,
             neg_ratio: int = 1, seed: int = 0, pairs_source=None,
             on_epoch: Optional[Callable[[dict], None]] = None, start_epoch: int = 0,
             opt=None, memory=None):
    """Train ``encoder`` and ``decoder`` on ``runtime`` (the training graph's rows); one
    record an epoch (loss, the metrics, and the node trainer's time, traffic and memory
    fields: :func:`gnnpar.training.trainer.costed_record`) from the loop every trainer shares
    (:func:`gnnpar.training.epochs.run_epochs`: it stops after an epoch whose loss is not finite).
    ``pairs_source``: None on one process, a :class:`~gnnpar.link.exchange.PairExchange` on
    several."""
    check_ratio(neg_ratio)
    pairs_source = pairs_source or LocalPairs()
    opt = opt or make_optimizer(link_modules(encoder, decoder), cfg)
    runtime.comm_stats()  # reset the counters: setup traffic is not an epoch's

    def train(epoch: int) -> float:
        return link_step(encoder, decoder, opt, runtime, pairs_source, split, num_nodes,
                         neg_ratio, seed, epoch, cfg.precision)

    def evaluate() -> Dict[str, float]:
        return evaluate_link(encoder, decoder, runtime, split, pairs_source, cfg.precision)

    return run_epochs(cfg, train, evaluate, costed_record(runtime, memory), {}, start_epoch,
                      on_epoch)
