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

Building the parts makes no array of the block's size besides the parts themselves (a rank's
memory stays near its shard's): chunked passes over the block's CSR arrays (a shard's
memory map is read, never copied whole), a chunked counting sort for Âᵀ whose arrays the
backward's parts then slice, and int32 indices on the CPU (:func:`index_dtype`). The parts
are bit for bit those of sorting each part's entries by (row, column) (:class:`_Parts`).

An axis strategy (``a``, used for the column side of a product and the row side of the other)
gives ``cut``, ``start_gather(h) -> Pending`` (the rest's rows), ``start_reduce(y_send) ->
Pending`` and ``finish_reduce(y_own, received)``; :class:`Local` is the axis of a product with
nothing to reduce.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple, Optional

import numpy as np
import torch

from .cpu_spmm import add_csr_mm, csr_mm
from .local import csr_tensor, index_dtype


class Cut(NamedTuple):
    """Held positions ``[lo, hi)``; the others less ``offset`` (module docstring)."""

    lo: int
    hi: int
    offset: int

    def held(self, pos: np.ndarray) -> np.ndarray:
        """Mask of the held positions."""
        return (pos >= self.lo) & (pos < self.hi)

    def split(self, pos: np.ndarray):
        """(mask of held positions, position inside its part) of each entry."""
        held = self.held(pos)
        return held, np.where(held, pos - self.lo, pos - self.offset)

    def widths(self, width: int):
        return self.hi - self.lo, width - self.offset


#: source entries per chunk of the passes that cut a block into its parts (their masks and
#: prefix sums are the only transients besides the parts themselves)
CHUNK = 1 << 18


def _row_chunks(indptr: np.ndarray, start: int, stop: int):
    """Row ranges ``[r0, r1)`` covering ``[start, stop)``, of about :data:`CHUNK` entries each
    (a longer row alone)."""
    r0 = start
    while r0 < stop:
        r1 = int(np.searchsorted(indptr, indptr[r0] + CHUNK, side="right")) - 1
        r1 = min(stop, max(r1, r0 + 1))
        yield r0, r1
        r0 = r1


def _check_csr(indptr: np.ndarray, cols: np.ndarray, width: int) -> bool:
    """Whether every row's columns are non-decreasing; raises ValueError on arrays no CSR
    matrix of ``width`` columns has (the passes below index with them unchecked)."""
    nnz = int(cols.shape[0])
    if indptr.shape[0] < 1 or int(indptr[0]) != 0 or int(indptr[-1]) != nnz or \
            np.any(np.diff(indptr) < 0):
        raise ValueError("CSR row pointers must run non-decreasing from 0 to the entry count")
    ordered = True
    for a in range(0, nnz, CHUNK):
        c = np.asarray(cols[a:min(nnz, a + CHUNK + 1)])  # one past: the pair across chunks
        if int(c.min()) < 0 or int(c.max()) >= width:
            raise ValueError(f"a CSR column is outside [0, {width})")
        if ordered:
            down = np.flatnonzero(c[1:] < c[:-1]) + (a + 1)  # entries below their left one
            at = np.searchsorted(indptr, down)
            ordered = bool(np.all((at < indptr.shape[0]) &
                                  (indptr[np.minimum(at, indptr.shape[0] - 1)] == down)))
    return ordered


def _sort_rows(indptr, cols, vals):
    """The entries with every row's columns in ascending order (stable: equal columns keep
    their order)."""
    rows = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))
    order = np.lexsort((cols, rows))
    del rows
    return cols[order], vals[order]


def _transpose(indptr, cols, vals, shape, idx=np.int64):
    """CSR arrays of the transpose (column indices of dtype ``idx``), each of its rows in
    ascending source row: a stable counting sort, in chunks (entries of one source row and
    column keep their order) — the order a stable sort of the transposed entries by (row,
    column) gives."""
    n_cols, nnz = int(shape[1]), int(cols.shape[0])
    t_indptr = np.zeros(n_cols + 1, np.int64)
    np.cumsum(np.bincount(cols, minlength=n_cols), out=t_indptr[1:])
    t_cols = np.empty(nnz, idx)
    t_vals = np.empty(nnz, np.float32)
    cursor = t_indptr[:-1].copy()  # the next free place of each column
    for a in range(0, nnz, CHUNK):
        c = np.asarray(cols[a:a + CHUNK])
        order = np.argsort(c, kind="stable")
        key = c[order]
        first = np.ones(key.shape[0], bool)  # the first entry of each run of one column
        np.not_equal(key[1:], key[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        dest = np.arange(key.shape[0], dtype=np.int64)
        dest -= np.repeat(starts, np.diff(np.append(starts, key.shape[0])))  # rank in its run
        dest += cursor[key]
        src = order + a
        t_cols[dest] = np.searchsorted(indptr, src, side="right") - 1  # each entry's row
        t_vals[dest] = np.asarray(vals)[src]
        cursor[key[starts]] += np.diff(np.append(starts, key.shape[0]))
    return t_indptr, t_cols, t_vals


class _Parts:
    """One product's four parts ``{(row part, column part): CSR}``; row parts "own"/"send"
    (``send`` only with a row cut), column parts "held"/"rest".

    Built from the CSR arrays of the block (``indptr``, int64 ``cols``, float32 ``vals``) in
    chunked passes: the parts' arrays are the only full-size arrays made. A part keeps the
    entries in the block's order, which is the part's (row, column) order once every row's
    columns ascend (the rows of a part are a run of the block's, renumbered by one shift, and
    so are its columns) — what sorting each part by (row, column) gave, so the parts are the
    same, bit for bit. A block whose rows do not ascend is sorted first (a stable sort).
    ``views``: a part made of one run of the block's entries with unchanged columns may be a
    slice of ``cols``/``vals`` (arrays the caller made: writable, not shared). Indices are
    of :func:`index_dtype` (the same values either way)."""

    def __init__(self, indptr, cols, vals, shape, row_cut: Optional[Cut], col_cut: Cut,
                 device, views: bool = False):
        n_rows = int(shape[0])
        idx = index_dtype(cols.shape[0], shape, device)
        if not _check_csr(indptr, cols, int(shape[1])):
            cols, vals = _sort_rows(indptr, cols, vals)
            views = True  # the sorted copies are this call's own
        widths_c = dict(zip(("held", "rest"), col_cut.widths(shape[1])))
        shifts_c = {"held": col_cut.lo, "rest": col_cut.offset}
        if row_cut is None:
            parts = [("own", [(0, n_rows)], 0, n_rows)]
        else:
            lo, hi, off = row_cut
            own_h, send_h = row_cut.widths(n_rows)
            parts = [("own", [(lo, hi)], lo, own_h),
                     ("send", [(0, lo), (hi, n_rows)], off, send_h)]
        held_cnt = np.zeros(n_rows, np.int64)  # pass 1: each row's held entries
        for r0, r1 in _row_chunks(indptr, 0, n_rows):
            a, b = int(indptr[r0]), int(indptr[r1])
            cs = np.zeros(b - a + 1, np.int64)
            np.cumsum(col_cut.held(np.asarray(cols[a:b])), out=cs[1:])
            held_cnt[r0:r1] = cs[indptr[r0 + 1:r1 + 1] - a] - cs[indptr[r0:r1] - a]
        counts = {"held": held_cnt, "rest": np.diff(indptr) - held_cnt}
        self.blocks = {}
        for rp, segs, shift, height in parts:
            segs = [(s, e) for s, e in segs if e > s]
            out = {}
            for cp in ("held", "rest"):
                ptr = np.zeros(height + 1, np.int64)
                for s, e in segs:
                    ptr[s - shift + 1:e - shift + 1] = counts[cp][s:e]
                np.cumsum(ptr, out=ptr)
                total = int(ptr[-1])
                run = [(int(indptr[s]), int(indptr[e])) for s, e in segs]
                if total == 0:
                    out[cp] = [ptr, np.empty(0, idx), np.empty(0, np.float32), None]
                elif views and shifts_c[cp] == 0 and cols.dtype == idx and len(run) == 1 \
                        and total == run[0][1] - run[0][0]:
                    a, b = run[0]  # every entry of the one run, columns as they are
                    out[cp] = [ptr, cols[a:b], vals[a:b], None]
                else:
                    out[cp] = [ptr, np.empty(total, idx), np.empty(total, np.float32), 0]
            if any(o[3] is not None for o in out.values()):  # pass 2: fill the copies
                for s, e in segs:
                    for r0, r1 in _row_chunks(indptr, s, e):
                        a, b = int(indptr[r0]), int(indptr[r1])
                        c = np.asarray(cols[a:b])
                        held = col_cut.held(c)
                        v = np.asarray(vals[a:b])
                        for cp in ("held", "rest"):
                            o = out[cp]
                            if o[3] is None:
                                continue
                            sel = held if cp == "held" else ~held
                            k = int(np.count_nonzero(sel))
                            np.subtract(c[sel], shifts_c[cp], out=o[1][o[3]:o[3] + k])
                            o[2][o[3]:o[3] + k] = v[sel]
                            o[3] += k
            for cp, (ptr, c, v, _) in out.items():
                self.blocks[rp, cp] = csr_tensor(ptr, c, v, (height, widths_c[cp]), device,
                                                 idx)

    def product(self, h: torch.Tensor, col_axis, row_axis, pending=None) -> torch.Tensor:
        """Â·h for one direction: gather over ``col_axis`` (unless ``pending`` brings the
        rest's rows), reduce over ``row_axis``."""
        pending = pending or col_axis.start_gather(h)
        send = ("send", "held") in self.blocks
        y_send = csr_mm(self.blocks["send", "held"], h) if send else None
        y_own = csr_mm(self.blocks["own", "held"], h)
        rest = pending.wait()
        if send:
            add_csr_mm(y_send, self.blocks["send", "rest"], rest)
            back = row_axis.start_reduce(y_send)
        if rest.shape[0]:
            add_csr_mm(y_own, self.blocks["own", "rest"], rest)
        return row_axis.finish_reduce(y_own, back.wait()) if send else y_own


_FORWARD_ONLY = ContextVar("gnnpar_forward_only", default=False)


@contextmanager
def forward_only():
    """Operators built inside are for inference: :class:`Overlapped` makes no parts of Âᵀ
    (as much memory as the forward's parts, and their setup time), and a backward through
    one raises."""
    token = _FORWARD_ONLY.set(True)
    try:
        yield
    finally:
        _FORWARD_ONLY.reset(token)


class Overlapped:
    """Â (CSR arrays, ``shape``) as the parts of :mod:`overlap`, for both directions: the
    forward gathers over ``col_axis`` and reduces over ``row_axis`` (None: nothing to reduce),
    the backward (Âᵀ) the other way round. The parts hold their own arrays: the caller's
    (memory-mapped ones included) are only read, and not kept."""

    def __init__(self, indptr, indices, values, shape, col_axis, row_axis=None, device=None):
        indptr = np.asarray(indptr, np.int64)
        cols = np.asarray(indices, np.int64)  # no copy of a (mapped) int64 array
        vals = np.asarray(values, np.float32)
        self.col_axis, self.row_axis = col_axis, row_axis or Local()
        row_cut = None if row_axis is None else row_axis.cut
        self.fwd = _Parts(indptr, cols, vals, tuple(shape), row_cut, col_axis.cut, device)
        self.bwd = None
        if not _FORWARD_ONLY.get():
            # Âᵀ: its own CSR arrays, which its parts may slice (no second copy)
            t = _transpose(indptr, cols, vals, tuple(shape),
                           index_dtype(cols.shape[0], tuple(shape)[::-1], device))
            self.bwd = _Parts(*t, tuple(shape)[::-1], col_axis.cut,
                              row_cut or Cut(0, int(shape[0]), int(shape[0])), device,
                              views=True)
        self.nnz, self.shape = int(cols.shape[0]), tuple(int(d) for d in shape)

    def forward(self, h: torch.Tensor, pending=None) -> torch.Tensor:
        """Â·h; ``pending`` (a Pending of the rest's rows) replaces the column axis's gather
        for a kernel that brings them another way."""
        return self.fwd.product(h, self.col_axis, self.row_axis, pending)

    def backward(self, grad: torch.Tensor) -> torch.Tensor:
        if self.bwd is None:
            raise RuntimeError("this operator was built for inference (forward_only): it has "
                               "no transpose to run a backward with")
        return self.bwd.product(grad, self.row_axis, self.col_axis)

    def structure(self):
        """(indptr, columns) of the whole block, int64 tensors, each row's columns ascending:
        the forward's parts put back at their positions (:class:`Cut`), so an operator needs
        no copy of its block kept for the few layers (attention) that ask for it."""
        rows, cols = [], []
        row_cut = getattr(self.row_axis, "cut", None)
        col_cut = self.col_axis.cut
        for (rp, cp), part in self.fwd.blocks.items():
            crow, col = part.crow_indices().cpu(), part.col_indices().cpu().to(torch.int64)
            r = torch.repeat_interleave(torch.arange(crow.shape[0] - 1), crow.diff(),
                                        output_size=col.shape[0])
            rows.append(r + (0 if row_cut is None else
                             row_cut.lo if rp == "own" else row_cut.offset))
            cols.append(col + (col_cut.lo if cp == "held" else col_cut.offset))
        rows, cols = torch.cat(rows), torch.cat(cols)
        order = torch.argsort(rows * self.shape[1] + cols)
        indptr = torch.zeros(self.shape[0] + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(rows, minlength=self.shape[0]), 0, out=indptr[1:])
        return indptr, cols[order]


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
