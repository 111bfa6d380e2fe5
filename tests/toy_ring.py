"""A toy algorithm for tests/test_registry.py: "1d-ring", 1D SpMM whose forward gathers the H
row blocks with one broadcast per root rank (p broadcasts over ``row``) instead of 1d's one
all-gather; the backward is 1d's reduce-scatter. Same rows, same words, another pattern.

It is one file and one :class:`~gnnpar.kernels.entry.Algorithm`: no grid flags, no builder
options, no mini-batch group rule and no cost-model entry (so ``--algo auto`` skips it).
"""
import torch

from gnnpar.kernels.comm import Pending
from gnnpar.kernels.entry import Algorithm
from gnnpar.kernels.spmm_1d import AXIS, Op1D, partition_order, row_axis


class OpRing(Op1D):
    """Op1D with the forward all-gather replaced by a broadcast from every rank in turn."""

    def forward_rows(self, h):
        me, f = self.comm.grid.coord(AXIS), h.shape[1]
        blocks = [self.comm.broadcast(h.contiguous() if q == me else h.new_empty((n_q, f)),
                                      q, AXIS)
                  for q, n_q in enumerate(self.sizes)]
        # Op1D's own columns times h, plus the rest times the stacked blocks (nothing in flight)
        return self.block.forward(h, Pending.ready(torch.cat(blocks, dim=0)))


def build_ring(shard, comm, norm: str, device=None) -> OpRing:
    indptr, indices, values, sizes = partition_order(shard, comm, norm)
    return OpRing(comm, indptr, indices, values, sizes, device)


RING = Algorithm(name="1d-ring", axes=("row",), shape=row_axis, builder=build_ring)
