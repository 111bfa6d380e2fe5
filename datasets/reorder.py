"""Vertex orders that put a node's neighbours near each other in memory (``--reorder``).

A sparse product reads the feature row of every neighbour of every row; with the ids of a
synthetic or crawled graph in random order each read is a cache miss. Renumbering the
vertices once at load makes those reads local:

- ``degree``: by degree, highest first — the few rows every other row reads (R-MAT's hubs)
  share a small, hot region;
- ``rcm``: reverse Cuthill–McKee (scipy) on the symmetrised structure — neighbours get
  nearby ids, the bandwidth of the matrix shrinks;
- ``partition``: METIS clusters of about :data:`CLUSTER_ROWS` vertices, one after another
  (hubs first inside each) — the rows of a block read mostly their own cluster;
- ``none``: the dataset's own order.

On R-MAT, whose ids come in random order, each reordering makes the product and the whole
training step faster (``docs/performance.md`` has the figures). ``gnnpar-train``'s default,
``auto``, is ``degree`` for a single-process full-batch run (hubs first, cheap: one sort) and
``none`` for mini batch and distributed runs, where no gain is shown (and the ``block``
partitioner would put every hub on one rank);
:func:`gnnpar.training.shard_source.resolve_reorder` settles it. Library calls (``load_dataset``,
``SerialRuntime``) never reorder on their own.

The reordered graph is the same graph: every array is permuted alike, so training is the same
up to floating-point summation order and which random draws fall on which node. Its
``meta["vertex_order"]`` maps back: node k of the reordered graph is node
``vertex_order[k]`` of the dataset (gnnpar reports no per-node results itself; a user's
predictions on the reordered graph go back with ``out[inverse]``, ``inverse[vertex_order] =
arange(n)``).

Shapes: ``order`` (n,) int64, a permutation of ``range(n)``.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .errors import InputError
from .metis_call import metis_part_graph
from .graph import Graph

ORDERS = ("none", "degree", "rcm", "partition")
#: rows per cluster of the ``partition`` order: about one core's L2 of 256-wide fp32 rows
CLUSTER_ROWS = 8192


def vertex_order(graph: Graph, how: str) -> np.ndarray:
    """New position → dataset id, for order ``how`` (see :data:`ORDERS`)."""
    n = graph.num_nodes
    if how == "none":
        return np.arange(n, dtype=np.int64)
    if how == "degree":
        return np.argsort(-graph.degrees(), kind="stable").astype(np.int64)
    if how == "rcm":
        import scipy.sparse.csgraph as csgraph
        return np.asarray(csgraph.reverse_cuthill_mckee(graph.to_scipy().tocsr(),
                                                        symmetric_mode=False), np.int64)
    if how == "partition":
        return partition_order(graph)
    raise InputError(f"--reorder must be one of {', '.join(ORDERS)}, got {how!r}")


def partition_order(graph: Graph, rows: int = CLUSTER_ROWS, seed: int = 0) -> np.ndarray:
    """Clusters of about ``rows`` vertices with few edges between them (METIS k-way on the
    symmetrised structure, unit weights), one after another, each cluster's vertices by
    degree, highest first: a block of rows then reads mostly its own cluster's feature rows."""
    import scipy.sparse as sp
    n = graph.num_nodes
    k = max(1, -(-n // rows))
    if k == 1:
        return np.argsort(-graph.degrees(), kind="stable").astype(np.int64)
    a = graph.to_scipy().tocsr()
    a = (a + a.T).tocsr()
    a.setdiag(0)
    a.eliminate_zeros()
    a = sp.csr_matrix(a)
    part = metis_part_graph(k, a.indptr.astype(np.int64), a.indices.astype(np.int64),
                            seed=int(seed))
    return np.lexsort((-graph.degrees(), np.asarray(part))).astype(np.int64)


def reorder(graph: Graph, how: str) -> Graph:
    """``graph`` with its vertices renumbered in order ``how`` (the same graph for ``none``)."""
    order = vertex_order(graph, how)
    if how == "none":
        return graph
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.shape[0], dtype=np.int64)
    src, dst = graph.edges()
    indptr, indices, weight = Graph.csr_from_edges(inverse[src], inverse[dst], graph.num_nodes,
                                                   graph.edge_weight, dedup=False)
    take = lambda a: np.ascontiguousarray(np.asarray(a)[order])  # noqa: E731
    return replace(graph, indptr=indptr, indices=indices, edge_weight=weight,
                   x=take(graph.x), y=take(graph.y), train_mask=take(graph.train_mask),
                   val_mask=take(graph.val_mask), test_mask=take(graph.test_mask),
                   meta={**graph.meta, "vertex_order": order, "reorder": how})
