"""How one grid axis moves rows in and partial sums out of a block product.

A block product gathers the input rows it reads along one axis and, in 2D, reduces the partial
output rows along another. Two strategies, chosen once when an operator is built (``--variant``):

- :class:`DenseAxis` (``bcast``): all-gather every member's rows in, reduce-scatter out; a
  position on the axis is the member's offset plus its local row;
- :class:`HaloAxis` (``halo``): only the rows some non-zero touches move — a compacted plan
  (:class:`~gnnpar.kernels.halo.HaloPlan`), own rows first, then the touched remote rows.

Each gives what the overlapped product (:mod:`kernels.overlap`) asks of an axis: its ``cut``
(which positions this rank holds), ``start_gather``, ``start_reduce`` and ``finish_reduce``.
"""
from __future__ import annotations

import numpy as np
import torch

from .blocks import compact_plan
from .comm import Comm
from .overlap import Cut


class DenseAxis:
    """Variant ``bcast`` on one axis (module docstring); ``sizes``: every member's rows."""

    def __init__(self, comm: Comm, axis, sizes):
        self.comm, self.axis, self.sizes = comm, axis, [int(s) for s in sizes]
        self.width = sum(self.sizes)
        me = comm.grid.ranks_of(axis).index(comm.grid.rank)
        lo = sum(self.sizes[:me])
        # own rows [lo, lo + n_me); the rest keep their full positions (own ones empty)
        self.cut = Cut(lo, lo + self.sizes[me], 0)

    @classmethod
    def build(cls, comm: Comm, axis, member, local, sizes, n_own, device=None):
        """(positions of the non-zeros on the axis, the strategy)."""
        return np.concatenate([[0], np.cumsum(sizes)])[member] + local, cls(comm, axis, sizes)

    def start_gather(self, h):
        return _Stacked(self.comm.start_all_gather(h, self.axis, self.sizes))

    def start_reduce(self, y_send):
        """Partial sums of every member's rows (own rows zero): the others' sums come back."""
        return self.comm.start_reduce_scatter(y_send, self.axis, self.sizes)

    def finish_reduce(self, y_own, received):
        return y_own.add_(received)


class HaloAxis:
    """Variant ``halo`` on one axis (module docstring)."""

    def __init__(self, comm: Comm, axis, plan, n_own: int):
        self.comm, self.axis, self.plan, self.n_own = comm, axis, plan, int(n_own)
        self.width = self.n_own + plan.num_halo
        self.cut = Cut(0, self.n_own, self.n_own)  # the rest: exactly the halo positions

    @classmethod
    def build(cls, comm: Comm, axis, member, local, sizes, n_own, device=None):
        pos, plan = compact_plan(comm, axis, member, local, n_own, device)
        return pos, cls(comm, axis, plan, n_own)

    def start_gather(self, h):
        return self.plan.start_gather(self.comm, h, self.axis)

    def start_reduce(self, y_send):
        """The halo rows' partial sums, sent back to their owners."""
        return self.plan.start_return(self.comm, y_send, self.axis)

    def finish_reduce(self, y_own, received):
        return self.plan.add_returned(y_own, received)


class _Stacked:
    """A pending all-gather whose ``wait()`` gives the members' rows stacked."""

    def __init__(self, pending):
        self.pending = pending

    def wait(self):
        return torch.cat(self.pending.wait(), dim=0)
