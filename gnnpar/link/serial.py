"""Full-batch link prediction on one process: the reference loop every distributed and
mini-batch path is to be tested against (issue 42).

Each epoch: the encoder (any model the node trainer runs: ``model(ops, x)`` → one embedding
row a vertex) runs on the training graph (:func:`gnnpar.link.split.split_edges`: no held-out
edge in it), every training positive is scored with its ``neg_ratio`` negatives
(:mod:`gnnpar.link.negatives`), and the loss is the mean binary cross-entropy over all those
pairs. Evaluation runs the encoder on the same training graph and reports ``val_auc``,
``test_auc``, ``val_mrr``, ``test_mrr`` and ``test_hits@K`` for K in
:data:`gnnpar.link.metrics.HITS` (:mod:`gnnpar.link.metrics`).
"""
from __future__ import annotations

import math
import time
from typing import Callable, Dict, Optional

import numpy as np
import torch
from torch import nn

from gnnpar.interfaces import LayerOps
from gnnpar.precision import autocast, matmuls
from gnnpar.trainer import TrainConfig, make_optimizer

from .decoders import summed_link_loss
from .metrics import HITS, auc, hits_at, mrr
from .negatives import check_ratio, negatives
from .split import LinkSplit


def _pair_scores(decoder, z: torch.Tensor, pairs) -> torch.Tensor:
    pairs = torch.as_tensor(np.asarray(pairs), dtype=torch.int64, device=z.device)
    return decoder(z.index_select(0, pairs[0]), z.index_select(0, pairs[1]))


def link_step(encoder, decoder, opt, runtime, split: LinkSplit, neg_ratio: int, seed: int,
              epoch: int, precision: str = "fp32") -> float:
    """One forward/backward/step over every training positive and its negatives; returns
    the mean loss."""
    encoder.train()
    decoder.train()
    opt.zero_grad(set_to_none=True)
    runtime.start_pass()
    pos = split.train_pos
    neg = negatives(pos, np.arange(pos.shape[1]), runtime.x.shape[0], neg_ratio, seed, epoch)
    count = float(pos.shape[1] + neg.shape[1])
    with matmuls(precision):
        with autocast(precision, runtime.x.device):
            z = encoder(LayerOps(runtime.op), runtime.x)
        z = z.float()
        loss_sum = summed_link_loss(_pair_scores(decoder, z, pos), _pair_scores(decoder, z, neg))
        (loss_sum / count).backward()
    opt.step()
    return float(loss_sum.detach()) / count


@torch.no_grad()
def evaluate_link(encoder, decoder, runtime, split: LinkSplit, precision: str = "fp32"
                  ) -> Dict[str, float]:
    """The metrics of the module docstring, the encoder run on the training graph."""
    encoder.eval()
    decoder.eval()
    runtime.start_pass()
    with matmuls(precision), autocast(precision, runtime.x.device):
        z = encoder(LayerOps(runtime.op), runtime.x)
    z = z.float()
    out = {}
    for side in ("val", "test"):
        pos_pairs = getattr(split, f"{side}_pos")
        pos = _pair_scores(decoder, z, pos_pairs).cpu().numpy()
        neg = _pair_scores(decoder, z, getattr(split, f"{side}_neg")).cpu().numpy()
        dst = getattr(split, f"{side}_neg_dst")
        ranked = np.stack([np.repeat(pos_pairs[0], dst.shape[1]), dst.reshape(-1)])
        ranked_scores = _pair_scores(decoder, z, ranked).cpu().numpy().reshape(dst.shape)
        out[f"{side}_auc"] = auc(pos, neg)
        out[f"{side}_mrr"] = mrr(pos, ranked_scores)
        if side == "test":
            out.update({f"test_hits@{k}": hits_at(pos, neg, k) for k in HITS})
    return out


def fit_link(encoder, decoder, runtime, split: LinkSplit, cfg: TrainConfig,
             neg_ratio: int = 1, seed: int = 0,
             on_epoch: Optional[Callable[[dict], None]] = None):
    """Train ``encoder`` and ``decoder`` on ``runtime`` (the training graph's); one record an
    epoch (loss, the metrics, epoch_s); stops after an epoch whose loss is not finite."""
    check_ratio(neg_ratio)
    opt = make_optimizer(nn.ModuleDict({"encoder": encoder, "decoder": decoder}), cfg)
    history = []
    metrics = {}
    for epoch in range(cfg.epochs):
        t0 = time.perf_counter()
        loss = link_step(encoder, decoder, opt, runtime, split, neg_ratio, seed, epoch,
                         cfg.precision)
        if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
            metrics = evaluate_link(encoder, decoder, runtime, split, cfg.precision)
        rec = {"epoch": epoch, "loss": loss, **metrics, "epoch_s": time.perf_counter() - t0}
        history.append(rec)
        if on_epoch is not None:
            on_epoch(rec)
        if not math.isfinite(loss):
            break
    return history
