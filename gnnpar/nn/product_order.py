"""Which order a GCN or SAGE layer multiplies in: (Â·H)·W or Â·(H·W).

Both give the same Z (up to rounding); their costs differ. With Â an ``n_dst × n_src`` matrix
of ``nnz`` entries, H ``(n_src, f_in)`` and W ``(f_in, f_out)``, counted in multiply-adds:

- aggregate first, (Â·H)·W: the SpMM at width ``f_in`` (``nnz·f_in``), then the GEMM over the
  ``n_dst`` aggregated rows (``n_dst·f_in·f_out``);
- transform first, Â·(H·W): the GEMM over all ``n_src`` input rows (``n_src·f_in·f_out``),
  then the SpMM at width ``f_out`` (``nnz·f_out``).

:func:`aggregate_first` picks the cheaper (aggregate first on a tie). In full batch
(``n_dst == n_src``) it is exactly the width rule ``f_in <= f_out`` the layers use today
(:mod:`gnnpar.nn.models`). On a sampled block (``n_src`` several times ``n_dst``) the row
counts decide: e.g. a last layer 256 → 16 on a 1022 × 2959 block with 2584 entries costs
4.9 M multiply-adds aggregating first against 12.2 M transforming first, although
``f_in > f_out``. The backward pass mirrors the forward (the same products, transposed), so
the same order is the cheaper there too; where H needs no gradient (a model's input layer)
aggregating first also leaves the block's Âᵀ unused.

SAGE's root term ``H[:n_dst]·W_root`` costs the same in either order and is not counted.
"""
from __future__ import annotations

from gnnpar.kernels.local import SparseOperator


def product_costs(nnz: int, n_dst: int, n_src: int, f_in: int, f_out: int):
    """(aggregate first, transform first) multiply-adds of one layer's neighbour product."""
    nnz, n_dst, n_src, f_in, f_out = (int(v) for v in (nnz, n_dst, n_src, f_in, f_out))
    return nnz * f_in + n_dst * f_in * f_out, n_src * f_in * f_out + nnz * f_out


def aggregate_first(nnz: int, n_dst: int, n_src: int, f_in: int, f_out: int) -> bool:
    """Whether (Â·H)·W costs no more than Â·(H·W) (module docstring):
    ``nnz·f_in + n_dst·f_in·f_out <= n_src·f_in·f_out + nnz·f_out``."""
    first, second = product_costs(nnz, n_dst, n_src, f_in, f_out)
    return first <= second


def aggregate_first_op(op, f_in: int, f_out: int) -> bool:
    """:func:`aggregate_first` for a local operator (a
    :class:`~gnnpar.kernels.local.SparseOperator`: the serial runtime's Â, a sampled block);
    any other operator gets the width rule ``f_in <= f_out``: a distributed product is one
    collective, and every rank must take the same order, which its own part's counts would
    not guarantee."""
    if not isinstance(op, SparseOperator):
        return f_in <= f_out
    return aggregate_first(op.nnz, op.num_dst, op.num_src, f_in, f_out)
