"""Propagation matrices Â: the sparse operator a GNN layer aggregates with.

Every trainer (serial or distributed) and every shard uses the same values, computed here once
in float64 on the whole graph and stored as float32, so distributed runs differ from the serial
one only by summation order.

Kinds (A is the stored adjacency, row i aggregates from its columns):

- ``gcn``: Â = D̃^{-1/2} (A' + I) D̃^{-1/2}, where A' is A without its self loops and
  D̃ = rowsum(A' + I) (Kipf & Welling). Existing self loops are *replaced* by weight-1 loops.
  Column sums are used for the right factor, so a directed A is handled without assuming symmetry.
- ``mean``: Â = D^{-1} A, D = rowsum(A) (GraphSAGE mean aggregation; rows with no neighbours
  stay zero). Not symmetric even for a symmetric A.
- ``sum``: Â = A (GIN-style sum aggregation).

:func:`union_structure` gives one CSR structure (A' + I) on which all kinds have values, so a
shard stores its indices once and one value array per kind.
"""
from __future__ import annotations

import numpy as np

from .errors import InputError
from .graph import Graph

KINDS = ("gcn", "mean", "sum")


def union_structure(graph: Graph):
    """(indptr, indices, raw_weight) of A' + I with raw weights (1.0 where unweighted; the
    stored loop weight, or 0.0 for an added loop). Columns sorted within each row."""
    src, dst = graph.edges()
    w = (np.ones(graph.num_edges, np.float64) if graph.edge_weight is None
         else np.asarray(graph.edge_weight, np.float64))
    n = graph.num_nodes
    loop = src == dst
    loop_w = np.zeros(n, np.float64)
    np.add.at(loop_w, src[loop], w[loop])
    keep = ~loop
    nodes = np.arange(n, dtype=np.int64)
    s = np.concatenate([src[keep], nodes])
    d = np.concatenate([dst[keep], nodes])
    ww = np.concatenate([w[keep], loop_w])
    key = d * n + s
    order = np.argsort(key, kind="stable")
    key, ww = key[order], ww[order]
    first = np.ones(key.size, dtype=bool)
    first[1:] = key[1:] != key[:-1]
    starts = np.nonzero(first)[0]
    ww = np.add.reduceat(ww, starts) if key.size else ww
    rows, cols = np.divmod(key[first], n) if n else (key, key)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return indptr, cols.astype(np.int64), ww


def sum_values(raw: np.ndarray) -> np.ndarray:
    """Â of the ``"sum"`` kind: S's raw weights as float32 (no copy when they are float32).
    The shard writer stores this, and a shard written without it gives it from its
    ``raw_weight`` (``kernels/dist_op.shard_values``)."""
    raw = np.asarray(raw)
    return raw if raw.dtype == np.float32 else raw.astype(np.float32)


def values_for(kind: str, indptr: np.ndarray, indices: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """Values of Â of ``kind`` on the union structure (float32, same order as ``indices``)."""
    if kind not in KINDS:
        raise InputError(f"unknown normalisation {kind!r}; choose one of {', '.join(KINDS)}")
    n = indptr.shape[0] - 1
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    if kind == "sum":
        return sum_values(raw)
    if kind == "mean":
        _refuse_negative(raw, rows, indices, kind, "D^-1 A divides by each weighted degree")
        rowsum = np.bincount(rows, weights=raw, minlength=n)
        inv = np.divide(1.0, rowsum, out=np.zeros(n), where=rowsum != 0)
        return (raw * inv[rows]).astype(np.float32)
    # gcn: loops become weight 1
    w = np.where(rows == indices, 1.0, raw)
    _refuse_negative(w, rows, indices, kind, "D^-1/2 (A+I) D^-1/2 takes each weighted degree's "
                                             "square root")
    rowsum = np.bincount(rows, weights=w, minlength=n)
    colsum = np.bincount(indices, weights=w, minlength=n)
    rinv = np.divide(1.0, np.sqrt(rowsum), out=np.zeros(n), where=rowsum > 0)
    cinv = np.divide(1.0, np.sqrt(colsum), out=np.zeros(n), where=colsum > 0)
    return (w * rinv[rows] * cinv[indices]).astype(np.float32)


def _refuse_negative(w: np.ndarray, rows: np.ndarray, cols: np.ndarray, kind: str,
                     why: str) -> None:
    """Degree-normalised kinds need non-negative weights: a negative one can make a degree
    zero or negative, whose root or inverse is no number (the row would be silently zeroed)."""
    neg = np.flatnonzero(w < 0)
    if neg.size:
        i = int(neg[0])
        raise InputError(f"the {kind} normalisation needs edge weights >= 0 ({why}); "
                         f"{neg.size:,} edge(s) have a negative weight, the first "
                         f"{int(cols[i])} -> {int(rows[i])} ({w[i]:g}); only 'sum' aggregation "
                         "takes negative weights")


def propagation_matrix(graph: Graph, kind: str):
    """(indptr, indices, values) of Â for ``kind`` over the union structure A' + I."""
    indptr, indices, raw = union_structure(graph)
    return indptr, indices, values_for(kind, indptr, indices, raw)
