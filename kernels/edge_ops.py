"""Edge-valued operators: what an attention layer asks of the graph.

GCN and SAGE only ask an operator for Â·h, with Â's values fixed when it was built. An
attention layer (GAT, GATv2, a learned edge gate) computes one value per edge and head from
the features at the edge's two ends, normalises them over each destination row and
aggregates with them. :class:`gnnpar.interfaces.EdgeOperator` is that contract (importable
from here too); a layer written against it runs wherever an operator serves it
(``op.edges()``).

The edges are the structure of the operator's Â: in full batch S = A' + I, so every row has
its self loop, as the GAT paper takes it. Â's values are not used. Each (row, column) pair is
one edge: a sampled block whose rows repeat a neighbour (drawn twice with replacement) serves
it once (:func:`distinct_edges`), as a grouped block's merged shard does, so an attention
layer's softmax is over the distinct sampled neighbours in every mode. Edges are numbered in
the operator's CSR order (row by row), so per-edge tensors are ``(E, heads)``.

- ``at_src(s)``: ``s`` (num_src, H) → (E, H), each edge's source row of ``s``;
- ``at_dst(d)``: ``d`` (num_dst, H) → (E, H), each edge's destination row;
- ``row_max(e)``: (E, H) → (num_dst, H), the largest value of each row, no gradient (the
  shift that keeps :func:`edge_softmax` finite; 0 for a row without edges);
- ``row_sum(e)``: (E, H) → (num_dst, H), with gradient;
- ``spmm(h, w)``: ``h`` (num_src, H, F), ``w`` (E, H) → (num_dst, H, F),
  ``out[i, k] = Σ_{e=(i,j)} w[e, k]·h[j, k]``, with gradients to both: ``dh`` is the
  transposed product, ``dw[e, k] = ⟨g[i, k], h[j, k]⟩`` (an SDDMM over the same edges).

:class:`CsrEdges` serves one process's CSR (the serial runtime's operator). On the CPU in
float32 the product (either way) and the SDDMM are compiled passes over the rows, every head
at once (numba, ``parallel=True`` on the rank's threads, as :mod:`.cpu_spmm`), summing in
float64 with reassociation allowed (:data:`FASTMATH`) so the dot products vectorise;
elsewhere the product runs head by head through :func:`gnnpar.kernels.cpu_spmm.csr_mm` and
the SDDMM over blocks of edges. Neither holds an E × F tensor.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from gnnpar.interfaces import EdgeOperator  # the contract, with the other ones

from .cpu_spmm import available, csr_mm, pool_threads, row_blocks, run_parallel
from .csr_transpose import transpose_csr_tensors
from .jit import compile_module

#: elements of one SDDMM block (edges × heads × width): bounds its temporaries
SDDMM_BLOCK = 1 << 22


def edge_softmax(op: EdgeOperator, e: torch.Tensor) -> torch.Tensor:
    """Softmax of ``e`` (E, H) over each destination row's edges, shifted by the row's
    maximum so no exponential overflows; gradient through both the numerator and the sum."""
    p = torch.exp(e - op.at_dst(op.row_max(e)))
    return p / op.at_dst(op.row_sum(p))


def rows_flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` as (rows, everything else), contiguous: what a row exchange moves (zero rows
    included, which ``reshape(n, -1)`` refuses)."""
    return t.reshape(t.shape[0], math.prod(t.shape[1:])).contiguous()


def no_empty_rows(row_max: torch.Tensor, empty=0.0) -> torch.Tensor:
    """Row maxima with ``empty`` where a row had no edge (-inf): a finite shift everywhere."""
    return row_max.masked_fill_(torch.isinf(row_max) & (row_max < 0), empty)


# ---------------------------------------------------------------- compiled CPU passes
prange = range  # numba.prange once compiled (gnnpar.kernels.jit)
heads_spmm = sddmm_rows = None  # the compiled passes, set by _compiled()


def _heads_spmm(indptr, cols, edge, w, h, out, bounds):  # pragma: no cover - compiled
    # out[i, k, :] = sum over the row's entries p of w[edge[p], k] * h[cols[p], k, :], summed
    # in float64 and rounded once: a row's sum then hardly depends on its entries' order
    # (a distributed rank's columns come in another order than the serial CSR's)
    heads, width = h.shape[1], h.shape[2]
    for b in prange(bounds.shape[0] - 1):
        acc = np.empty((heads, width), np.float64)
        for i in range(bounds[b], bounds[b + 1]):
            acc[:] = 0.0
            for p in range(indptr[i], indptr[i + 1]):
                row = h[cols[p]]
                e = edge[p]
                for k in range(heads):
                    v = np.float64(w[e, k])
                    for f in range(width):
                        acc[k, f] += v * row[k, f]
            o = out[i]
            for k in range(heads):
                for f in range(width):
                    o[k, f] = acc[k, f]


def _sddmm_rows(indptr, cols, g, h, out, bounds):  # pragma: no cover - compiled
    # out[p, k] = <g[i, k, :], h[cols[p], k, :]> for the entries p of row i (float64 sums)
    heads, width = h.shape[1], h.shape[2]
    for b in prange(bounds.shape[0] - 1):
        for i in range(bounds[b], bounds[b + 1]):
            gi = g[i]
            for p in range(indptr[i], indptr[i + 1]):
                hj = h[cols[p]]
                for k in range(heads):
                    acc = 0.0
                    for f in range(width):
                        acc += gi[k, f] * hj[k, f]
                    out[p, k] = acc


#: numba's floating-point flags for the passes: sums may be reassociated, so the SDDMM's dot
#: products vectorise (lanes of partial sums over a width known only at run time); nothing
#: else of IEEE arithmetic is relaxed (inf and NaN propagate)
FASTMATH = {"reassoc"}


def _compiled():
    import numba
    return numba, compile_module(__name__, ("heads_spmm", "sddmm_rows"), parallel=True,
                                 cache=True, nogil=True, fastmath=FASTMATH)


def _compiled_serves(*tensors) -> bool:
    """The compiled passes take float32 CPU tensors (numba present, ``GNNPAR_SPMM`` not
    ``torch``); anything else runs the torch path."""
    return available() and all(t.device.type == "cpu" and t.dtype == torch.float32
                               for t in tensors)


class CsrEdges:
    """:class:`EdgeOperator` over a CSR structure (``indptr`` (num_dst+1,), ``indices`` (E,)
    int64 tensors on one device), with its transpose kept for the product's backward."""

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, num_src: int):
        self.num_dst, self.num_src = int(indptr.shape[0] - 1), int(num_src)
        self.num_edges = int(indices.shape[0])
        self.indptr, self.cols = indptr.to(torch.int64), indices.to(torch.int64)
        # the transpose (a stable sort, as every operator's): its edges are this operator's,
        # column by column; ``order`` gives each one's id here
        self._ids = ids = torch.arange(self.num_edges, dtype=torch.int64, device=indptr.device)
        self.t_indptr, self.t_cols, self.order = transpose_csr_tensors(
            self.indptr, self.cols, ids, (self.num_dst, self.num_src))
        self.rows = torch.repeat_interleave(
            torch.arange(self.num_dst, dtype=torch.int64, device=indptr.device),
            self.indptr[1:] - self.indptr[:-1], output_size=self.num_edges)
        self._bounds = {}

    def _host(self, transpose: bool):
        """(indptr, columns, edge ids) as numpy arrays for the compiled passes, either way."""
        if transpose:
            return self.t_indptr.numpy(), self.t_cols.numpy(), self.order.numpy()
        return self.indptr.numpy(), self.cols.numpy(), self._ids.numpy()

    def _blocks(self, indptr, threads: int, transpose: bool):
        key = (transpose, threads)
        if key not in self._bounds:
            self._bounds[key] = row_blocks(indptr, threads * 8)
        return self._bounds[key]

    def at_src(self, s: torch.Tensor) -> torch.Tensor:
        return s.index_select(0, self.cols)

    def at_dst(self, d: torch.Tensor) -> torch.Tensor:
        return d.index_select(0, self.rows)

    def row_max(self, e: torch.Tensor, empty=0.0) -> torch.Tensor:
        """``empty`` for a row without edges (None: -inf, what a distributed operator folds
        with its other ranks' maxima before it puts 0 there, :func:`no_empty_rows`)."""
        e = e.detach()
        out = torch.full((self.num_dst,) + tuple(e.shape[1:]), float("-inf"), dtype=e.dtype,
                         device=e.device)
        index = self.rows.view(-1, *([1] * (e.dim() - 1))).expand_as(e)
        out.scatter_reduce_(0, index, e, reduce="amax", include_self=True)
        return out if empty is None else no_empty_rows(out, empty)

    def row_sum(self, e: torch.Tensor) -> torch.Tensor:
        out = e.new_zeros((self.num_dst,) + tuple(e.shape[1:]))
        return out.index_add(0, self.rows, e)

    def spmm(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if h.dim() != 3 or w.dim() != 2 or h.shape[1] != w.shape[1]:
            raise ValueError(f"spmm takes h (num_src, heads, width) and w (edges, heads), got "
                             f"{tuple(h.shape)} and {tuple(w.shape)}")
        if h.shape[0] != self.num_src or w.shape[0] != self.num_edges:
            raise ValueError(f"spmm expects {self.num_src} source rows and {self.num_edges} "
                             f"edges, got {h.shape[0]} and {w.shape[0]}")
        return EdgeSpMM.apply(h, w, self)

    # ---------------------------------------------------------------- per-head products
    def product(self, w: torch.Tensor, h: torch.Tensor, transpose: bool) -> torch.Tensor:
        """Σ over edges of ``w``-weighted rows of ``h`` (num, H, F): the operator's matrix, or
        its transpose, with the edge values ``w`` (E, H). float32 on the CPU: one compiled
        pass over the rows, every head at once; else head by head through
        :func:`~gnnpar.kernels.cpu_spmm.csr_mm`."""
        heads = h.shape[1]
        if _compiled_serves(w, h):
            numba, passes = _compiled()
            threads = pool_threads(numba)
            indptr, cols, edge = self._host(transpose)
            out = h.new_empty((indptr.shape[0] - 1, heads, h.shape[2]))
            run_parallel(numba, threads, passes.heads_spmm, indptr, cols, edge,
                         w.detach().contiguous().numpy(), h.detach().contiguous().numpy(),
                         out.numpy(), self._blocks(indptr, threads, transpose))
            return out
        values = torch.float64 if h.dtype == torch.float64 else torch.float32  # bf16 h: fp32 sums
        if transpose:
            shape, crow, col = (self.num_src, self.num_dst), self.t_indptr, self.t_cols
            w = w[self.order]
        else:
            shape, crow, col = (self.num_dst, self.num_src), self.indptr, self.cols
        out = h.new_empty((shape[0], heads, h.shape[2]))
        for k in range(heads):
            a = torch.sparse_csr_tensor(crow, col, w[:, k].contiguous().to(values), size=shape,
                                        check_invariants=False)
            out[:, k] = csr_mm(a, h[:, k].contiguous())
        return out

    def sddmm(self, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``⟨g[row(e), k], h[col(e), k]⟩`` for every edge and head: (E, H). float32 on the
        CPU: one compiled pass over the rows; else in blocks of edges (at most
        :data:`SDDMM_BLOCK` elements of temporaries)."""
        heads, width = h.shape[1], h.shape[2]
        if _compiled_serves(g, h):
            numba, passes = _compiled()
            threads = pool_threads(numba)
            indptr, cols, _ = self._host(False)
            out = h.new_empty((self.num_edges, heads))
            run_parallel(numba, threads, passes.sddmm_rows, indptr, cols,
                         g.detach().contiguous().numpy(), h.detach().contiguous().numpy(),
                         out.numpy(), self._blocks(indptr, threads, False))
            return out
        out = h.new_empty((self.num_edges, heads),
                          dtype=torch.float64 if h.dtype == torch.float64 else torch.float32)
        step = max(1, SDDMM_BLOCK // max(1, heads * width))
        for a in range(0, self.num_edges, step):
            b = min(self.num_edges, a + step)
            gi, hj = g.index_select(0, self.rows[a:b]), h.index_select(0, self.cols[a:b])
            if gi.dtype != out.dtype or hj.dtype != out.dtype:
                gi, hj = gi.to(out.dtype), hj.to(out.dtype)
            torch.sum(gi * hj, dim=2, out=out[a:b])
        return out


def distinct_edges(indptr: torch.Tensor, indices: torch.Tensor, num_src: int) -> CsrEdges:
    """:class:`CsrEdges` of a CSR structure whose rows may list a column more than once (a
    block sampled with replacement), each (row, column) pair once: the first entry of each
    pair is kept, in the rows' order, so a structure without repeats gives its own edges.
    One stable sort of the entries' (row, column) keys."""
    indptr, indices = indptr.to(torch.int64), indices.to(torch.int64)
    n_dst, nnz, device = int(indptr.shape[0] - 1), int(indices.shape[0]), indptr.device
    rows = torch.repeat_interleave(torch.arange(n_dst, dtype=torch.int64, device=device),
                                   indptr[1:] - indptr[:-1], output_size=nnz)
    key, order = torch.sort(rows * max(int(num_src), 1) + indices, stable=True)
    first = torch.ones(nnz, dtype=torch.bool, device=device)
    first[1:] = key[1:] != key[:-1]
    if bool(first.all()):
        return CsrEdges(indptr, indices, num_src)
    keep = torch.zeros_like(first)
    keep[order[first]] = True
    kept_indptr = torch.zeros_like(indptr)
    torch.cumsum(torch.bincount(rows[keep], minlength=n_dst), 0, out=kept_indptr[1:])
    return CsrEdges(kept_indptr, indices[keep], num_src)


class EdgeSpMM(torch.autograd.Function):
    """``out = spmm(h, w)`` (module docstring), gradients to ``h`` and ``w`` as asked."""

    @staticmethod
    def forward(ctx, h, w, op: CsrEdges):
        ctx.op = op
        ctx.save_for_backward(h, w)
        return op.product(w, h.contiguous(), transpose=False)

    @staticmethod
    def backward(ctx, g):
        h, w = ctx.saved_tensors
        op = ctx.op
        g = g.contiguous()
        dh = op.product(w, g, transpose=True) if ctx.needs_input_grad[0] else None
        dw = op.sddmm(g, h).to(w.dtype) if ctx.needs_input_grad[1] else None
        return dh, dw, None
