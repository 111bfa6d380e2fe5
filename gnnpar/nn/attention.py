"""Graph attention layers on the edge-valued operator contract (``kernels/edge_ops.py``).

:class:`GATLayer` is GAT (Veličković et al. 2018), as PyG's ``GATConv`` computes it: per head
k, ``z = h·W_k``; each edge (i ← j) scores ``e = LeakyReLU(a_srcᵀ z_j + a_dstᵀ z_i)`` (slope
0.2); the scores are soft-maxed over row i's edges (:func:`~gnnpar.kernels.edge_ops.
edge_softmax`), dropped out (attention dropout), and ``out_i = Σ_j α_ij z_j``. Hidden layers
concatenate their heads, the output layer averages them; the bias is added after. The edges
are the operator's: S = A' + I in full batch, so every node attends to itself, as in the
paper (the layer asks for Â of the ``"gcn"`` normalisation only for its structure; its
values are not used).

A layer reaches the edge operations through ``op.edges()``, which every operator serves: the
serial runtime's and a sampled block's (``kernels/edge_ops.py``: on a block, softmax over the
sampled neighbours, each once however often drawn, no Horvitz–Thompson rescaling), the 1D
operators' (all-gather and halo exchange, ``kernels/edge_dist.py``), the block operators' of
1.5d, 2d, 3d and 4d (``kernels/edge_block.py``) and a grouped mini batch's
(``kernels/bipartite.py``); an operator without them (a user's own) is refused with a message
that names it.

Shapes: H (num_src, f_in) → (num_dst, heads·f_out) concatenated, (num_dst, f_out) averaged.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn
from torch.nn import functional as F

from gnnpar.datasets import InputError

from gnnpar.nn.dropout import add_bias, dropout
from gnnpar.nn.model_registry import facts
from gnnpar.kernels.edge_ops import EdgeOperator, edge_softmax
from gnnpar.nn.bf16_dense import Linear

#: GAT's LeakyReLU slope on the attention scores
NEGATIVE_SLOPE = 0.2

#: attention heads of ``--model gat`` when not told (the GAT paper's 8)
GAT_HEADS = 8

def check_heads(model: str, heads, hidden: int) -> None:
    """``--heads`` only with an attention model (``--model gat``), and a GAT's ``--hidden``
    (its width in all) a multiple of its heads: gnnpar-train's and gnnpar-plan's flags
    alike."""
    if not facts(model).attention:
        if heads is not None:
            raise InputError(f"--heads sets the attention of --model gat; --model {model} has "
                             "none")
        return
    heads = GAT_HEADS if heads is None else heads
    if hidden % heads:
        raise InputError(f"--hidden {hidden} is a GAT hidden layer's width in all (heads x "
                         f"width per head): it must be a multiple of --heads {heads}")


def edge_operator(op) -> EdgeOperator:
    """``op``'s edge-valued operations, or an InputError naming the operator without them
    (every gnnpar operator serves them; a user's own operator may not)."""
    edges = getattr(op, "edges", None)
    if edges is None:
        raise InputError(f"{type(op).__name__} has no edge-valued operations (edges(), "
                         f"kernels/edge_ops.py): attention layers cannot run on it")
    return edges()


class GATLayer(nn.Module):
    """One GAT layer (module docstring). ``forward(op, h, attn=(p, training))``: ``attn`` is
    the attention dropout."""

    norm = "gcn"

    def __init__(self, f_in: int, f_out: int, heads: int = 1, concat: bool = True,
                 bias: bool = True):
        super().__init__()
        if heads < 1:
            raise ValueError(f"heads must be >= 1, got {heads}")
        self.heads, self.width, self.concat = heads, f_out, concat
        self.lin = Linear(f_in, heads * f_out, bias=False)
        self.att_src = nn.Parameter(torch.empty(heads, f_out))
        self.att_dst = nn.Parameter(torch.empty(heads, f_out))
        self.bias = nn.Parameter(torch.zeros(heads * f_out if concat else f_out)) if bias else None
        for w in (self.lin.weight, self.att_src, self.att_dst):  # Glorot, as GATConv
            nn.init.xavier_uniform_(w)

    def forward(self, op, h: torch.Tensor, attn: Tuple[float, bool] = (0.0, False)
                ) -> torch.Tensor:
        edges = edge_operator(op)
        n_dst = op.num_dst
        z = self.lin(h).view(h.shape[0], self.heads, self.width)
        src = (z * self.att_src).sum(dim=-1)                   # (num_src, heads)
        dst = (z[:n_dst] * self.att_dst).sum(dim=-1)           # (num_dst, heads)
        scores = F.leaky_relu(edges.at_src(src) + edges.at_dst(dst), NEGATIVE_SLOPE)
        alpha = dropout(edge_softmax(edges, scores), *attn)
        out = edges.spmm(z, alpha.to(z.dtype))                 # (num_dst, heads, f_out)
        out = out.reshape(n_dst, self.heads * self.width) if self.concat else out.mean(dim=1)
        return add_bias(out, self.bias)


def gat_layers(f_in: int, hidden: int, f_out: int, layers: int, heads: int) -> nn.ModuleList:
    """The layers of a GAT: ``hidden`` is a hidden layer's width in all (``heads`` heads of
    ``hidden // heads`` each, concatenated); the last layer averages ``heads`` heads of
    ``f_out``."""
    if hidden % heads:
        raise ValueError(f"hidden width {hidden} is not a multiple of {heads} heads")
    widths = [f_in] + [hidden] * (layers - 1)
    hidden_layers = [GATLayer(a, hidden // heads, heads, concat=True) for a in widths[:-1]]
    return nn.ModuleList(hidden_layers + [GATLayer(widths[-1], f_out, heads, concat=False)])
