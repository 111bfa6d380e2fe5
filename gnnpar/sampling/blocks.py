"""Sampled bipartite blocks, the minibatch that carries them, and their local numbering.

A :class:`Block` is one layer's sampled Â: an ``n_dst × n_src`` CSR matrix whose source
nodes start with its destination nodes (``src_ids[:n_dst] == dst_ids``, the convention of
``gnnpar.kernels.local.SparseOperator`` and ``gnnpar.nn.models``). Its operator
(:meth:`Block.operator`, :func:`block_operators`) is a :class:`BlockOperator`: a
SparseOperator whose Âᵀ comes from a compiled counting sort and may be deferred until a
backward pass needs it (the input block's, usually never). A :class:`MiniBatch` holds one
block per layer, outermost (input layer) first, so ``model([b.operator() for b in
mb.blocks], x[mb.input_ids])`` gives the outputs of ``mb.seeds`` in order.

Row ``i`` of a block holds Â_ii (when non-zero) first, then the sampled neighbours; column
indices are local source ids (int64). Without replacement a row has no repeated column;
with replacement a neighbour drawn twice appears twice (its entries add up in the SpMM). An
attention layer's edges (:meth:`BlockOperator.edges`) hold it once: its softmax is over the
distinct sampled neighbours, as in a grouped block (whose shard merges the repeated entries,
:func:`gnnpar.kernels.bipartite.block_shard`) and in the full graph when every neighbour is
drawn.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from gnnpar.kernels.csr_transpose import transpose_csr
from gnnpar.kernels.edge_ops import distinct_edges
from gnnpar.kernels.local import SparseOperator, csr_tensor

from gnnpar.sampling import fast
from gnnpar.sampling.topology import index_dtype


@dataclass
class Block:
    """Shapes: ``indptr`` (n_dst+1,) int64, ``indices`` (nnz,) int64 in [0, n_src),
    ``values`` (nnz,) float32, ``src_ids`` (n_src,) int64 global ids — numpy arrays (the host
    samplers) or tensors on one device (:mod:`.device_sampler`).
    ``num_sampled``: neighbour entries kept (self entries not counted). ``distinct``: no row
    lists a column twice (set by a sampler that drew without replacement or kept whole rows);
    False where a row may (drawn with replacement, or not known)."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    src_ids: np.ndarray
    num_dst: int
    num_sampled: int
    distinct: bool = False

    @property
    def num_src(self) -> int:
        return int(self.src_ids.shape[0])

    @property
    def dst_ids(self) -> np.ndarray:
        return self.src_ids[:self.num_dst]

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    def operator(self, device=None, transpose: bool = True,
                 on_demand: Optional[Callable[[], None]] = None) -> "BlockOperator":
        """The block as a :class:`BlockOperator` (Â and Âᵀ as CSR). ``transpose=False``
        (host blocks on the host): Âᵀ is built when a backward pass first needs it, which
        calls ``on_demand()`` first."""
        return BlockOperator(self.indptr, self.indices, self.values,
                             (self.num_dst, self.num_src), device, transpose, on_demand,
                             self.distinct)

    def numpy(self) -> "Block":
        """The same block with numpy arrays (tests, debugging)."""
        arrays = [a.cpu().numpy() if hasattr(a, "cpu") else a
                  for a in (self.indptr, self.indices, self.values, self.src_ids)]
        return Block(*arrays, self.num_dst, self.num_sampled, self.distinct)

    def to_scipy(self):
        """scipy CSR (n_dst × n_src), duplicates summed (tests, debugging)."""
        import scipy.sparse as sp
        b = self.numpy()
        m = sp.csr_matrix((b.values, b.indices, b.indptr),
                          shape=(self.num_dst, self.num_src))
        m.sum_duplicates()
        return m


class BlockOperator(SparseOperator):
    """A :class:`~gnnpar.kernels.local.SparseOperator` of a block whose Âᵀ may wait.

    Host arrays on the host: Âᵀ comes from the compiled counting sort
    (:func:`gnnpar.kernels.csr_transpose.transpose_csr`, the same arrays as the stable argsort),
    built now with ``transpose=True``, else on first use of :attr:`AT` — a backward pass that
    needs the input's gradient (``LocalSpMM`` skips Âᵀ when it does not: the input block's
    features never need one unless the layer's weight is applied before the product), or a
    move to a device. ``on_demand`` is called before a deferred Âᵀ is built. Tensors, or a
    device other than the CPU: the parent's operator. ``distinct``: the block's
    rows repeat no column (:attr:`Block.distinct`), so :meth:`edges` need not look for
    repeats.
    """

    def __init__(self, indptr, indices, values, shape, device=None, transpose: bool = True,
                 on_demand: Optional[Callable[[], None]] = None, distinct: bool = False):
        self._AT, self._pending, self._on_demand = None, None, None
        self.distinct = bool(distinct)
        host = (not isinstance(indptr, torch.Tensor)
                and (device is None or torch.device(device).type == "cpu"))
        if not host:
            super().__init__(indptr, indices, values, shape, device)
            return
        super().__init__(indptr, indices, values, shape, device, transpose=False)
        self._pending, self._on_demand = (indptr, indices, values), on_demand
        if transpose:
            self._build()

    def _build(self) -> None:
        indptr, indices, values = self._pending
        self._AT = csr_tensor(*transpose_csr(indptr, indices, values,
                                             (self.num_dst, self.num_src)),
                              (self.num_src, self.num_dst), self.A.device)
        self._pending = None

    @property
    def transposed(self) -> bool:
        """Whether Âᵀ is built."""
        return self._AT is not None

    @property
    def AT(self) -> torch.Tensor:  # noqa: N802 - the parent's attribute
        if self._AT is None and self._pending is not None:
            if self._on_demand is not None:
                self._on_demand()
            self._build()
        return self._AT

    @AT.setter
    def AT(self, m: torch.Tensor) -> None:  # noqa: N802
        self._AT, self._pending = m, None

    def edges(self):
        """The block's structure as edge-valued operations, each (row, column) pair once
        (:func:`~gnnpar.kernels.edge_ops.distinct_edges`, skipped for a ``distinct`` block):
        a neighbour drawn twice is one edge of an attention layer's softmax (module
        docstring). Made on first use and kept."""
        if getattr(self, "_edges", None) is None:
            if self.distinct:
                return super().edges()
            self._edges = distinct_edges(self.A.crow_indices(), self.A.col_indices(),
                                         self.num_src)
        return self._edges


def block_operators(blocks: List[Block], device=None,
                    transpose: Optional[Sequence[bool]] = None,
                    on_demand: Optional[Callable[[int], None]] = None) -> list:
    """The operators of one minibatch's blocks, input layer first. ``transpose[i]``: build
    block i's Âᵀ now (default: every block but the input block, whose features need no
    gradient in the built-in models); a deferred one calls ``on_demand(i)`` when it is built
    (see :class:`BlockOperator`)."""
    if transpose is None:
        transpose = [i > 0 for i in range(len(blocks))]
    return [b.operator(device, bool(t), None if on_demand is None else
                       functools.partial(on_demand, i))
            for i, (b, t) in enumerate(zip(blocks, transpose))]


@dataclass
class MiniBatch:
    """Seeds and their blocks; ``blocks[-1].dst_ids == seeds``, ``blocks[0].src_ids`` are the
    input nodes whose features the first layer reads. ``index``: (epoch, step)."""

    seeds: np.ndarray
    blocks: List[Block]
    index: Tuple[int, int] = (0, 0)

    @property
    def input_ids(self) -> np.ndarray:
        return self.blocks[0].src_ids

    @property
    def sampled_edges(self) -> int:
        return sum(b.num_sampled for b in self.blocks)


class Relabeler:
    """Global → local ids of one block's sources: destinations first, then new nodes ascending.

    Keeps two scratch arrays of n entries (a bitmap and an id table of 4 bytes per node below
    2³¹ nodes), clean between calls, so relabelling costs a few passes over the edges (and a
    scan of the bitmap, or a sort of the edges' ids when the graph is much larger than the
    block) instead of a sort of every id. Not thread-safe: each sampler worker owns one.
    :func:`assemble_block` hands the slot table to the compiled kernel of
    :mod:`.fast`, which keeps the same contract (clean between calls); calling a Relabeler
    runs the numpy reference.
    """

    def __init__(self, num_nodes: int):
        self.num_nodes = int(num_nodes)
        self.slot = np.full(self.num_nodes, -1, index_dtype(self.num_nodes))
        self.mark = np.zeros(self.num_nodes, bool)

    def __call__(self, dst: np.ndarray, cols: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(src_ids, local_cols)``: src_ids (n_src,) int64 = dst then the other ids of
        ``cols`` ascending; local_cols (E,) int64 positions of ``cols`` in src_ids."""
        slot, r = self.slot, dst.shape[0]
        fresh = np.zeros(0, np.int64)
        try:
            slot[dst] = np.arange(r, dtype=slot.dtype)
            fresh = self._new_ids(cols, dst)
            slot[fresh] = np.arange(r, r + fresh.shape[0], dtype=slot.dtype)
            local = slot[cols].astype(np.int64)
        finally:
            slot[dst] = -1
            slot[fresh] = -1
        return np.concatenate([np.asarray(dst, np.int64), fresh]), local

    def _new_ids(self, cols: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Distinct ids of ``cols`` not in ``dst``, ascending (``slot`` already marks dst)."""
        if self._bitmap_pays(cols.shape[0]):
            mark = self.mark
            mark[cols] = True
            mark[dst] = False
            out = np.flatnonzero(mark)
            mark[out] = False
            return out
        ids = np.unique(cols).astype(np.int64)
        return ids[self.slot[ids] < 0]

    def union(self, arrays) -> np.ndarray:
        """Sorted distinct ids of all ``arrays`` together, int64."""
        ids = np.concatenate(arrays) if len(arrays) else np.zeros(0, np.int64)
        if self._bitmap_pays(ids.shape[0]):
            self.mark[ids] = True
            out = np.flatnonzero(self.mark)
            self.mark[out] = False
            return out
        return np.unique(ids).astype(np.int64)

    def _bitmap_pays(self, count: int) -> bool:
        # a scan of n bytes against a sort of `count` ids: ~32 bytes scanned per id sorted
        return self.num_nodes <= 32 * count


def assemble_block(dst: np.ndarray, k: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                   self_vals: np.ndarray, relabel: Relabeler) -> Block:
    """One block from a layer's sampled entries.

    ``dst`` (R,) global ids; ``k`` (R,) entries kept per row; ``cols`` (E,) global ids and
    ``vals`` (E,) float32 grouped by row; ``self_vals`` (R,) Â_ii, stored first in each row
    where non-zero. Runs the compiled :func:`~gnnpar.sampling.fast.relabel_assemble` on
    ``relabel``'s slot table (the same block as :func:`assemble_block_numpy`, the reference,
    in two passes over the edges).
    """
    if fast.available():
        src_ids, indptr, indices, values = fast.relabel_assemble(
            relabel.slot, np.asarray(dst, np.int64), k, cols, vals, self_vals)
        return Block(indptr, indices, values, src_ids, dst.shape[0], int(cols.shape[0]))
    return assemble_block_numpy(dst, k, cols, vals, self_vals, relabel)


def assemble_block_numpy(dst: np.ndarray, k: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                         self_vals: np.ndarray, relabel: Relabeler) -> Block:
    """:func:`assemble_block` by vectorised numpy passes (the reference)."""
    src_ids, local = relabel(dst, cols)
    r = dst.shape[0]
    has_self = self_vals != 0
    if not has_self.any():
        indptr = np.zeros(r + 1, np.int64)
        np.cumsum(k, out=indptr[1:])
        return Block(indptr, local, np.asarray(vals, np.float32), src_ids, r, int(cols.shape[0]))
    n_self = has_self.astype(np.int64)
    lengths = k + n_self
    indptr = np.zeros(r + 1, np.int64)
    np.cumsum(lengths, out=indptr[1:])
    nnz = int(indptr[-1])
    indices = np.empty(nnz, np.int64)
    values = np.empty(nnz, np.float32)
    # entry e of row i lands after the self entries of rows 0..i
    slots = np.arange(cols.shape[0], dtype=np.int64) + np.repeat(np.cumsum(n_self), k)
    indices[slots] = local
    values[slots] = vals
    self_rows = np.flatnonzero(has_self)
    indices[indptr[self_rows]] = self_rows
    values[indptr[self_rows]] = self_vals[self_rows]
    return Block(indptr, indices, values, src_ids, r, int(cols.shape[0]))

