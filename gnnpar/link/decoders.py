"""Pair scores from the two endpoints' embeddings, and the loss on them.

``decoder(z_u, z_v)`` → one logit a pair (rows of z_u and z_v are the pairs' endpoints):
:class:`DotDecoder` ⟨z_u, z_v⟩ (no parameters) and :class:`MLPDecoder`, an MLP on the Hadamard
product z_u ⊙ z_v. Both are symmetric in u and v, as undirected edges are.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from gnnpar.nn.bf16_dense import Linear
from gnnpar.nn.custom_model import load_factory
from gnnpar.datasets import InputError


class DotDecoder(nn.Module):
    def forward(self, zu: torch.Tensor, zv: torch.Tensor) -> torch.Tensor:
        return (zu * zv).sum(dim=-1)


class MLPDecoder(nn.Module):
    """Linear(width → hidden) → ReLU → … → Linear(hidden → 1) on z_u ⊙ z_v (``layers``
    linear layers, at least 1)."""

    def __init__(self, width: int, hidden: int = None, layers: int = 2):
        super().__init__()
        if layers < 1:
            raise InputError(f"an MLP decoder needs at least one layer, got {layers}")
        hidden = hidden or width
        dims = [width] + [hidden] * (layers - 1) + [1]
        self.lins = nn.ModuleList(Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, zu: torch.Tensor, zv: torch.Tensor) -> torch.Tensor:
        h = zu * zv
        for i, lin in enumerate(self.lins):
            h = lin(h)
            if i < len(self.lins) - 1:
                h = F.relu(h)
        return h.squeeze(-1)


DECODERS = {"dot": DotDecoder, "mlp": MLPDecoder}


def build_decoder(name: str, width: int) -> nn.Module:
    """``--decoder``: ``dot``, ``mlp``, or a user's ``package.module:factory`` — called as
    ``factory(width)`` (the embeddings' width), returning a ``torch.nn.Module`` whose
    ``forward(z_u, z_v)`` gives one logit a pair; imported as ``--model`` factories are
    (:mod:`gnnpar.nn.custom_model`)."""
    if name == "dot":
        return DotDecoder()
    if name == "mlp":
        return MLPDecoder(width)
    if ":" not in name:
        raise InputError(f"unknown decoder {name!r}; choose one of {', '.join(DECODERS)} or "
                         "name your own as package.module:factory")
    try:
        decoder = load_factory(name, "--decoder")(int(width))
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: one line
        raise InputError(f"--decoder {name}: factory({width}) raised "
                         f"{type(exc).__name__}: {exc}") from None
    if not isinstance(decoder, nn.Module):
        raise InputError(f"--decoder {name}: factory({width}) returned "
                         f"{type(decoder).__name__}, not a torch.nn.Module")
    return decoder


def summed_link_loss(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of positive (label 1) and negative (label 0) logits, summed over
    the pairs (a distributed run divides by the global count, as the node loss does)."""
    pos, neg = pos.float(), neg.float()
    return (F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos), reduction="sum")
            + F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg), reduction="sum"))
