"""Scoring pairs on a distributed full-batch runtime: each rank scores the pairs whose source
it owns, and the other endpoint's embedding row comes from its owner.

Every algorithm leaves each rank with its own rows of the encoder's output, all features
(``runtime.global_ids`` name them), so one exchange serves all of them:

1. a *directory* (made once, :class:`PairExchange`): every rank learns which rank owns each
   global id and at which local row — one all-gather of the ranks' id lists at setup, the
   partition book DistDGL keeps too (8 bytes a vertex on every rank);
2. per scoring call, the rank asks each owner for the distinct rows its pairs' destinations
   need (one all-to-all of counts and one of local row ids), which makes a
   :class:`~gnnpar.kernels.halo.HaloPlan` of that call;
3. the rows move through :class:`~gnnpar.kernels.edge_dist.HaloGather` — one uneven
   all-to-all of only those rows forward, and the reverse all-to-all of their gradients in
   the backward, added at the owners' rows.

All three are :class:`~gnnpar.kernels.comm.Comm` collectives over the runtime's world axes,
counted with the runtime's traffic. The scores and their gradients equal the serial ones: the
same rows reach the decoder, and each row's gradient is the same sum (own contributions,
then the returned ones, in member order).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from gnnpar.kernels.edge_dist import HaloGather
from gnnpar.kernels.halo import HaloPlan


class PairExchange:
    """The directory of a set of rows spread over ``axes`` of ``comm`` (module docstring,
    step 1): ``owner[v]`` the member holding id ``v``, ``local[v]`` its row there; this
    member is ``me`` and holds ``n_local`` rows. :meth:`of_runtime` makes it for a runtime's
    rows (collective); a mini-batch group, whose members all know the step's ownership, makes
    it without communication (:mod:`gnnpar.link.minibatch`)."""

    def __init__(self, comm, axes, owner: np.ndarray, local: np.ndarray, me: int,
                 n_local: int):
        self.comm, self.axes = comm, axes
        self.world = len(comm.grid.ranks_of(axes))
        self.owner, self.local, self.me, self.n_local = owner, local, int(me), int(n_local)

    @classmethod
    def of_runtime(cls, runtime, num_nodes: int) -> "PairExchange":
        """The directory of a runtime's rows (``runtime.global_ids`` over its
        ``world_axes``): one all-gather of the members' id lists (setup traffic)."""
        comm, axes = runtime.comm, runtime.world_axes
        members = comm.grid.ranks_of(axes)
        world, me = len(members), members.index(comm.grid.rank)
        ids = torch.from_numpy(np.array(runtime.global_ids, np.int64))  # a copy: may be mapped
        counts = torch.zeros(world, dtype=torch.int64)
        counts[me] = ids.shape[0]
        sizes = [int(c) for c in comm.reduce_control(counts, axes, "sum")]
        with comm.in_phase("setup"):
            parts = comm.all_gather(ids, axes, sizes)
        owner = np.full(num_nodes, -1, np.int32)
        local = np.zeros(num_nodes, np.int64)
        for member, part in enumerate(parts):
            p = part.numpy()
            owner[p] = member
            local[p] = np.arange(p.shape[0])
        if (owner < 0).any():
            raise ValueError(f"{int((owner < 0).sum())} vertices are owned by no rank")
        return cls(comm, axes, owner, local, me, int(ids.shape[0]))

    def owns(self, ids: np.ndarray) -> np.ndarray:
        """Whether this rank owns each of the global ``ids``."""
        return self.owner[np.asarray(ids, np.int64)] == self.me

    def rows(self, z: torch.Tensor, pairs: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        """The endpoints' rows ``(z_u, z_v)`` of ``pairs`` (2, K) global ids whose sources this
        rank owns; ``z`` is this rank's rows of the encoder output. Collective: every rank
        calls it together (with its own pairs, possibly none)."""
        src, dst = (np.asarray(p, np.int64) for p in pairs)
        if not self.owns(src).all():
            raise ValueError("a pair's source is not this rank's row")
        owner, local = self.owner[dst].astype(np.int64), self.local[dst]
        remote = owner != self.me
        # distinct (owner, row) requests, grouped by owner: the halo of this call
        keys = np.unique(owner[remote] * self.n_global_rows + local[remote])
        want_owner, want_local = np.divmod(keys, self.n_global_rows)
        recv_counts = np.bincount(want_owner, minlength=self.world)
        send_counts = self._exchange_counts(recv_counts)
        send_local = self._exchange_ids(want_local, recv_counts, send_counts)
        plan = HaloPlan.from_arrays(send_local, send_counts, recv_counts, z.device)
        ext = HaloGather.apply(z, plan, self.comm, self.axes)
        pos = local.copy()
        pos[remote] = self.n_local + np.searchsorted(keys, owner[remote] * self.n_global_rows
                                                     + local[remote])
        return (ext.index_select(0, _index(self.local[src], z.device)),
                ext.index_select(0, _index(pos, z.device)))

    def gather(self, scores: np.ndarray) -> np.ndarray:
        """Every rank's ``scores`` (1-D float64) concatenated in member order (for the
        metrics that rank all pairs together); collective, not the algorithm's traffic."""
        t = torch.as_tensor(np.asarray(scores, np.float64))
        counts = torch.zeros(self.world, dtype=torch.int64)
        counts[self.me] = t.shape[0]
        sizes = [int(c) for c in self.comm.reduce_control(counts, self.axes, "sum")]
        with self.comm.in_phase("eval"):
            parts = self.comm.all_gather(t, self.axes, sizes, exact=True)
        return torch.cat(parts).numpy()

    @property
    def n_global_rows(self) -> int:
        return int(self.owner.shape[0])

    def _exchange_counts(self, recv_counts: np.ndarray) -> np.ndarray:
        """How many rows each member asks of this rank, from how many it asks of each."""
        out = self.comm.all_to_all(torch.as_tensor(recv_counts, dtype=torch.int64),
                                   [1] * self.world, [1] * self.world, self.axes)
        return out.numpy().astype(np.int64)

    def _exchange_ids(self, want_local, recv_counts, send_counts) -> np.ndarray:
        """The local rows each member asks of this rank, grouped by member."""
        out = self.comm.all_to_all(torch.as_tensor(want_local, dtype=torch.int64),
                                   [int(c) for c in recv_counts],
                                   [int(c) for c in send_counts], self.axes)
        return out.numpy()


def _index(rows: np.ndarray, device) -> torch.Tensor:
    return torch.as_tensor(rows, dtype=torch.int64, device=device)


def scoring_bytes(owner: np.ndarray, pairs_by_rank, width: int, row_bytes_per_feature: int = 4
                  ) -> np.ndarray:
    """The bytes each rank sends for one :meth:`PairExchange.rows` call and its backward,
    predicted from every rank's pairs (``pairs_by_rank[r]``: (2, K_r) global ids, sources
    owned by r) and the owner of each vertex — what :class:`~gnnpar.kernels.comm.Comm`
    counts: the request counts (8 bytes to each other rank), the requested row ids (8 bytes
    each, to their owners), the rows (``width`` features of ``row_bytes_per_feature`` bytes,
    from the owners) and their gradients (the same rows back). With the split and the
    counter-based negatives every rank can compute every rank's pairs, so this is exact."""
    world = len(pairs_by_rank)
    sent = np.zeros(world, np.int64)
    row = int(width) * int(row_bytes_per_feature)
    for r, pairs in enumerate(pairs_by_rank):
        dst = np.asarray(pairs, np.int64)[1]
        need = np.unique(dst[owner[dst] != r])  # distinct remote rows r asks for
        per_owner = np.bincount(owner[need], minlength=world)
        sent[r] += 8 * (world - 1) + 8 * int(need.shape[0])  # counts, then ids
        sent += per_owner * row  # each owner sends its rows to r ...
        sent[r] += int(need.shape[0]) * row  # ... and r returns their gradients
    return sent
