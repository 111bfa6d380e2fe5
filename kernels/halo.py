"""Halo exchange plans for sparsity-aware SpMM: built once, used every layer and epoch.

A rank's local matrix has columns ``[0, n_local)`` for its own rows and
``[n_local, n_local + n_halo)`` for the *halo*: remote vertices its rows touch, grouped by
owner in member order. The plan says which own rows each member needs (``send_local``,
grouped by destination, ``send_counts``) and how many halo rows come from each member
(``recv_counts``). Like an MPI neighbourhood collective, it is set once and each exchange
only moves rows: one uneven all-to-all.

Forward  H_ext = [H; all_to_all(H[send_local])]
Backward dH    = G_own + index_add(send_local, all_to_all⁻¹(G_halo))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .comm import Comm, Pending
from .local import as_tensor


@dataclass
class HaloPlan:
    """Send/receive lists of one rank (shapes: send_local (Σ send_counts,), counts (g,))."""

    send_local: torch.Tensor
    send_counts: Sequence[int]
    recv_counts: Sequence[int]

    @classmethod
    def from_arrays(cls, send_local, send_counts, recv_counts, device=None) -> "HaloPlan":
        return cls(as_tensor(send_local, np.int64, device),
                   [int(c) for c in send_counts], [int(c) for c in recv_counts])

    @property
    def num_halo(self) -> int:
        return int(sum(self.recv_counts))

    def start_gather(self, comm: Comm, h: torch.Tensor, axes) -> Pending:
        """The halo rows (n_halo, f), issued (:mod:`kernels.overlap`)."""
        return comm.start_all_to_all(h.index_select(0, self.send_local), self.send_counts,
                                     self.recv_counts, axes)

    def start_return(self, comm: Comm, g_halo: torch.Tensor, axes) -> Pending:
        """The halo rows' gradients sent back to their owners, issued."""
        return comm.start_all_to_all(g_halo.contiguous(), self.recv_counts, self.send_counts,
                                     axes)

    def add_returned(self, g_own: torch.Tensor, back: torch.Tensor) -> torch.Tensor:
        """Own rows' gradient plus what their users sent back (:meth:`start_return`)."""
        return g_own.index_add(0, self.send_local, back)
