"""Small graphs for tests (no dataset module needed)."""
import numpy as np

from gnnpar.datasets import Graph, split_masks


def random_graph(n=23, avg_deg=4, f=5, classes=3, seed=0, directed=False, weighted=False,
                 self_loops=False):
    """A random graph with every node data array; isolated vertices are likely at small n."""
    rng = np.random.default_rng(seed)
    m = n * avg_deg
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    if not self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    if not directed:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    w = rng.uniform(0.5, 2.0, src.size).astype(np.float32) if weighted else None
    indptr, indices, w = Graph.csr_from_edges(src, dst, n, w)
    x = rng.normal(size=(n, f)).astype(np.float32)
    y = rng.integers(0, classes, n).astype(np.int64)
    y[:classes] = np.arange(classes)
    g = Graph(indptr, indices, x, y, *split_masks(n, rng), num_classes=classes, edge_weight=w,
              name=f"random{n}")
    return g.validate()
