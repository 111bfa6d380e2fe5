"""1D SpMM (CAGNET 1D): block rows, every H block shared with every rank.

Rank r of p holds the block row A_r (n_r × n, columns in partition order) and H_r (n_r × f).

Forward  Z_r = A_r · [H_0; …; H_{p−1}]   — one all-gather of the H blocks (uneven n_r);
Backward dH_r = (Σ_q A_qᵀ · G_q)_r        — each rank forms A_rᵀ·G_r (n × f) locally, then
                                            one reduce-scatter returns row block r.

Words moved per rank per SpMM: (p−1)·n_r·f forward, n·f − n_r·f backward.
Shapes: A_r (n_r, n); H_r, Z_r, G_r, dH_r (n_r, f).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .comm import Comm
from .dist_op import DistOperator
from .local import csr_tensor, transpose_csr

AXIS = "row"


class Op1D(DistOperator):
    """1D all-gather operator over the grid axis ``row`` (all p ranks).

    ``indptr, indices, values``: this rank's rows of Â with columns as *positions in partition
    order* (part q's vertices at ``[offsets[q], offsets[q+1])``); ``sizes``: every part's n_q.
    """

    def __init__(self, comm: Comm, indptr, indices, values, sizes: Sequence[int], device=None):
        self.comm = comm
        self.sizes = [int(s) for s in sizes]
        me = comm.grid.coord(AXIS)
        self.num_dst = self.num_src = self.sizes[me]
        n = int(np.sum(self.sizes))
        shape = (self.num_dst, n)
        self.A = csr_tensor(indptr, indices, values, shape, device)
        self.AT = csr_tensor(*transpose_csr(indptr, indices, values, shape), (n, self.num_dst),
                             device)

    def forward_rows(self, h):
        blocks = self.comm.all_gather(h, AXIS, self.sizes)
        return torch.sparse.mm(self.A, torch.cat(blocks, dim=0))

    def backward_rows(self, grad):
        return self.comm.reduce_scatter(torch.sparse.mm(self.AT, grad), AXIS, self.sizes)
