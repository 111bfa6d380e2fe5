"""Overlap: compute with the rows a rank holds while the others are in flight.

A rank's block of Â (and of Âᵀ for the backward) is cut two ways:

- by column, into the columns whose input rows the rank already holds (*held*: its own) and
  the *rest* (rows the gather of this product brings);
- by row, into the output rows the rank keeps (*own*) and the rows whose partial sums go to
  other ranks (*send*: the reduction's input; none in the 1D algorithms).

Â·H = Â_held·H_held + Â_rest·H_rest, so :meth:`Overlapped.product` issues the gather
(``Comm.start_*``) and multiplies the held columns while the rows travel; then it finishes the
*send* rows first and issues the reduction, and finishes its own rows while the partial sums
travel. The backward is the same with Âᵀ and the two axes' roles swapped.

Each cut is a :class:`Cut`: the held (own) range ``[lo, hi)`` of positions, renumbered from 0,
and the offset the other positions lose (0: the rest keeps full positions — a dense gather or
reduce-scatter, whose own rows are then empty; ``hi``: the rest is exactly the positions past
``hi`` — a halo layout). The four parts hold every non-zero once, so memory and flops are
those of the unsplit block; the sums are taken in another order than one CSR product would
take them (fp32 rounding, not exactness to serial, changes). ``Comm.seconds`` then counts only
the exposed waits (:mod:`kernels.comm`).

An axis strategy (``a``, used for the column side of a product and the row side of the other)
gives ``cut``, ``start_gather(h) -> Pending`` (the rest's rows), ``start_reduce(y_send) ->
Pending`` and ``finish_reduce(y_own, received)``; :class:`Local` is the axis of a product with
nothing to reduce.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from .cpu_spmm import csr_mm
from .local import csr_tensor


class Cut(NamedTuple):
    """Held positions ``[lo, hi)``; the others less ``offset`` (module docstring)."""

    lo: int
    hi: int
    offset: int

    def split(self, pos: np.ndarray):
        """(mask of held positions, position inside its part) of each entry."""
        held = (pos >= self.lo) & (pos < self.hi)
        return held, np.where(held, pos - self.lo, pos - self.offset)

    def widths(self, width: int):
        return self.hi - self.lo, width - self.offset


def _csr(rows, cols, vals, shape, device) -> Optional[torch.Tensor]:
    order = np.lexsort((cols, rows))
    indptr = np.zeros(shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=shape[0]), out=indptr[1:])
    return csr_tensor(indptr, cols[order], vals[order], shape, device)


class _Parts:
    """One product's four parts ``{(row part, column part): CSR}``; row parts "own"/"send"
    (``send`` only with a row cut), column parts "held"/"rest"."""

    def __init__(self, rows, cols, vals, shape, row_cut: Optional[Cut], col_cut: Cut, device):
        held_c, cpos = col_cut.split(cols)
        widths_c = dict(zip(("held", "rest"), col_cut.widths(shape[1])))
        if row_cut is None:
            own_r, rpos = np.ones(rows.shape[0], bool), rows
            heights = {"own": shape[0]}
        else:
            own_r, rpos = row_cut.split(rows)
            heights = dict(zip(("own", "send"), row_cut.widths(shape[0])))
        self.blocks = {}
        for rp, rmask in (("own", own_r), ("send", ~own_r)):
            if rp not in heights:
                continue
            for cp, cmask in (("held", held_c), ("rest", ~held_c)):
                m = rmask & cmask
                self.blocks[rp, cp] = _csr(rpos[m], cpos[m], vals[m], (heights[rp], widths_c[cp]),
                                           device)

    def product(self, h: torch.Tensor, col_axis, row_axis, pending=None) -> torch.Tensor:
        """Â·h for one direction: gather over ``col_axis`` (unless ``pending`` brings the
        rest's rows), reduce over ``row_axis``."""
        pending = pending or col_axis.start_gather(h)
        send = ("send", "held") in self.blocks
        y_send = csr_mm(self.blocks["send", "held"], h) if send else None
        y_own = csr_mm(self.blocks["own", "held"], h)
        rest = pending.wait()
        if send:
            y_send.add_(csr_mm(self.blocks["send", "rest"], rest))
            back = row_axis.start_reduce(y_send)
        if rest.shape[0]:
            y_own.add_(csr_mm(self.blocks["own", "rest"], rest))
        return row_axis.finish_reduce(y_own, back.wait()) if send else y_own


class Overlapped:
    """Â (CSR arrays, ``shape``) as the parts of :mod:`overlap`, for both directions: the
    forward gathers over ``col_axis`` and reduces over ``row_axis`` (None: nothing to reduce),
    the backward (Âᵀ) the other way round."""

    def __init__(self, indptr, indices, values, shape, col_axis, row_axis=None, device=None):
        indptr = np.asarray(indptr, np.int64)
        cols = np.asarray(indices, np.int64)
        vals = np.asarray(values, np.float32)
        rows = np.repeat(np.arange(int(shape[0]), dtype=np.int64), np.diff(indptr))
        self.col_axis, self.row_axis = col_axis, row_axis or Local()
        row_cut = None if row_axis is None else row_axis.cut
        self.fwd = _Parts(rows, cols, vals, tuple(shape), row_cut, col_axis.cut, device)
        self.bwd = _Parts(cols, rows, vals, tuple(shape)[::-1], col_axis.cut,
                          row_cut or Cut(0, int(shape[0]), int(shape[0])), device)
        self.nnz = int(cols.shape[0])

    def forward(self, h: torch.Tensor, pending=None) -> torch.Tensor:
        """Â·h; ``pending`` (a Pending of the rest's rows) replaces the column axis's gather
        for a kernel that brings them another way."""
        return self.fwd.product(h, self.col_axis, self.row_axis, pending)

    def backward(self, grad: torch.Tensor) -> torch.Tensor:
        return self.bwd.product(grad, self.row_axis, self.col_axis)


class Local:
    """The axis of a product's rows when this rank keeps all of them (1D): nothing to gather
    in the backward's columns, nothing to reduce in the forward's rows."""

    def start_gather(self, h):
        return _Empty(h)


class _Empty:
    """No rows arrive: the rest is empty."""

    def __init__(self, like):
        self.like = like

    def wait(self):
        return self.like.new_zeros((0,) + tuple(self.like.shape[1:]))
