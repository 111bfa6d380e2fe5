"""The training loss: summed cross-entropy over a set of rows, from float32 logits.

Both trainers divide this rank's sum by the global count of training rows, so the summed
gradients equal the serial ones (:mod:`gnnpar.training.trainer`,
:mod:`gnnpar.training.minibatch_loop`).

On CUDA it is computed as ``-log_softmax(logits).gather(y).sum()``: torch's CUDA ``nll_loss``
with ``reduction="sum"`` reduces in a single thread block, a serial tail on a large graph
(``docs/performance.md`` has the profile). Elsewhere it is
:func:`torch.nn.functional.cross_entropy`. The two are the same sum, in another order.

Shapes: logits (n, classes), y (n,) int64, mask (n,) bool or None → a scalar (float32).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from gnnpar.nn.precision import loss_logits


def summed_cross_entropy(logits: torch.Tensor, y: torch.Tensor, mask=None) -> torch.Tensor:
    """Σᵢ −log softmax(logitsᵢ)[yᵢ] over float32 logits (:func:`loss_logits`), over the rows
    where ``mask`` (bool, (n,)) is set, or over every row. On CUDA the mask is applied to the
    per-row terms (no boolean indexing: no host sync, no gather of the selected rows); the
    labels of unselected rows are never read as indices."""
    if logits.device.type != "cuda":
        if mask is not None:  # the selected rows first, so only they are widened to fp32
            logits, y = logits[mask], y[mask]
        return F.cross_entropy(loss_logits(logits), y, reduction="sum")
    return by_gather(loss_logits(logits), y, mask)


def by_gather(logits: torch.Tensor, y: torch.Tensor, mask=None) -> torch.Tensor:
    """The CUDA form of :func:`summed_cross_entropy` (float32 logits; any device)."""
    if mask is not None:
        y = torch.where(mask, y, 0)
    terms = torch.log_softmax(logits, dim=1).gather(1, y.view(-1, 1)).view(-1)
    if mask is not None:
        terms = torch.where(mask, terms, 0.0)
    return -terms.sum()
