"""Synthetic graphs: R-MAT (power-law, for scaling runs) and a stochastic block model (learnable).

Both generators are vectorised numpy, deterministic per ``seed``, and never build a dense n × n
matrix. Each random ingredient (edges, vertex permutation, features, labels, masks) draws from
its own child stream of ``np.random.SeedSequence(seed)``, so changing ``feat`` does not change
the edges, and changing ``classes`` does not change the features.

Undirected graphs are stored with both directions of every edge, no self loops, no duplicates,
and sorted columns in every CSR row.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .errors import InputError
from .graph import Graph, split_masks
from .limits import check_memory, check_num_classes

_CHUNK = 1 << 22  # edge samples generated per step: bounds the temporaries to ~100 MB


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise InputError(msg)


def _streams(seed: int, k: int):
    """``k`` independent generators derived from one seed."""
    _check(isinstance(seed, (int, np.integer)) and seed >= 0, f"seed must be an integer >= 0, got {seed!r}")
    return [np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(k)]


def rmat_bytes(scale: int, ef: int, feat: int) -> int:
    """About the peak bytes :func:`rmat` needs (an estimate, checked against peak RSS): per edge
    sample its uint32 ends, their concatenation, the deduplicated COO/CSR and the int64 result
    (both directions), ~32 bytes; per vertex the permutation, ``x`` (float32), ``y``, the masks
    and the row pointers."""
    n = 1 << int(scale)
    return 32 * int(ef) * n + n * (4 * int(feat) + 12 + 8 + 3 + 16)


def sbm_bytes(n: int, blocks: int, p_in: float, p_out: float, feat: int, directed: bool) -> int:
    """About the peak bytes :func:`sbm` needs (an estimate, checked against peak RSS): the
    expected edge count times ~100 bytes (sampled ends, their int64 copies, COO/CSR, both
    directions), the block-pair tables, and ``x`` (built in float64, ~24 bytes a value)."""
    n, blocks = int(n), int(blocks)
    size = n / blocks
    inside = blocks * size * (size - 1) * p_in
    across = (n * n - blocks * size * size) * p_out
    edges = (inside + across) / (1 if directed else 2)
    return int(100 * edges + 48 * blocks * blocks + n * (24 * int(feat) + 8 * 4 + 3))


def _adjacency(src: np.ndarray, dst: np.ndarray, n: int, directed: bool):
    """CSR (indptr, indices) int64 of the sampled edges: self loops dropped, repeats merged.

    Row = target. Undirected: each pair is stored once in the upper triangle and the matrix is
    then added to its transpose. scipy's COO→CSR and CSR+CSR run in linear time in C++, about
    five times faster than sorting 64-bit edge keys with numpy at R-MAT scale 20.
    """
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if directed:
        rows, cols = dst, src
    else:
        rows, cols = np.minimum(src, dst), np.maximum(src, dst)
    del src, dst
    # int32 counts: int8 would wrap to 0 on a pair drawn 256 times, and CSR addition drops zeros
    adj = sp.coo_matrix((np.ones(rows.size, np.int32), (rows, cols)), shape=(n, n)).tocsr()
    del rows, cols
    if not directed:
        adj = (adj + adj.T).tocsr()
    adj.sum_duplicates()  # no-op when scipy already marks it canonical: sorted, unique columns
    return adj.indptr.astype(np.int64), adj.indices.astype(np.int64)


def rmat(scale: int, ef: int, feat: int = 128, classes: int = 16, seed: int = 0,
         a: float = 0.57, b: float = 0.19, c: float = 0.19, directed: bool = False,
         permute: bool = True) -> Graph:
    """R-MAT power-law graph (Chakrabarti, Zhan, Faloutsos, SDM 2004) with random node data.

    n = 2**scale vertices, ``ef * n`` edge samples. Each sample picks one quadrant of the
    adjacency matrix per level with probabilities (a, b, c, d = 1 - a - b - c), top-left first;
    the quadrant's row half gives the next bit of the source id, its column half that of the
    target id.
    Self loops are dropped and repeated samples merged, so the graph has fewer than
    ``2 * ef * n`` stored edges (both directions when undirected). With ``permute`` the vertex
    ids are relabelled by a random permutation (as Graph500 does), so that high degree
    vertices are not all packed at small ids.

    Node data carry no signal (for timing, not accuracy): ``x`` (n, feat) float32 standard
    normal, ``y`` (n,) uniform in [0, classes), random 60/20/20 masks.
    """
    _check(isinstance(scale, (int, np.integer)) and 2 <= scale <= 31,
           f"rmat scale must be an integer in [2, 31], got {scale!r}")
    _check(isinstance(ef, (int, np.integer)) and ef >= 1, f"rmat ef must be an integer >= 1, got {ef!r}")
    _check(isinstance(feat, (int, np.integer)) and feat >= 1, f"rmat feat must be an integer >= 1, got {feat!r}")
    _check(isinstance(classes, (int, np.integer)) and classes >= 1,
           f"rmat classes must be an integer >= 1, got {classes!r}")
    for name, p in (("a", a), ("b", b), ("c", c)):
        _check(0.0 <= p <= 1.0, f"rmat {name} must be a probability in [0, 1], got {p!r}")
    _check(a + b + c <= 1.0, f"rmat needs a + b + c <= 1, got {a + b + c:.6g}")
    n, samples = 1 << int(scale), int(ef) << int(scale)
    check_num_classes(int(classes), n, "rmat classes", "most classes would have no node")
    check_memory(rmat_bytes(scale, ef, feat), f"rmat scale={scale} ({n:,} nodes, {samples:,} "
                 f"edge samples, {int(feat):,} features)")
    edge_rng, perm_rng, x_rng, y_rng, mask_rng = _streams(seed, 5)
    # cumulative quadrant bounds in float32 so that the comparisons stay in float32
    t_a, t_ab, t_abc = (np.float32(v) for v in (a, a + b, a + b + c))
    perm = perm_rng.permutation(n).astype(np.uint32) if permute else None
    srcs, dsts = [], []
    for start in range(0, samples, _CHUNK):
        size = min(_CHUNK, samples - start)
        src = np.zeros(size, dtype=np.uint32)
        dst = np.zeros(size, dtype=np.uint32)
        for _ in range(scale):
            r = edge_rng.random(size, dtype=np.float32)
            # quadrant q in 0..3 (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right)
            q = (r >= t_a).view(np.uint8) + (r >= t_ab).view(np.uint8) + (r >= t_abc).view(np.uint8)
            src <<= 1
            src |= q >> 1
            dst <<= 1
            dst |= q & 1
        if perm is not None:
            src, dst = perm[src], perm[dst]
        srcs.append(src)
        dsts.append(dst)
    indptr, indices = _adjacency(np.concatenate(srcs), np.concatenate(dsts), n, directed)
    del srcs, dsts
    x = x_rng.standard_normal((n, int(feat)), dtype=np.float32)
    y = y_rng.integers(0, int(classes), size=n, dtype=np.int64)
    train, val, test = split_masks(n, mask_rng)
    return Graph(indptr, indices, x, y, train, val, test, int(classes),
                 name=f"rmat-s{scale}-ef{ef}",
                 meta={"generator": "rmat", "scale": int(scale), "ef": int(ef), "a": a, "b": b, "c": c,
                       "seed": int(seed), "directed": bool(directed), "permute": bool(permute)})


def sbm(n: int, blocks: int, p_in: float, p_out: float, feat: int = 32, noise: float = 1.0,
        seed: int = 0, directed: bool = False) -> Graph:
    """Stochastic block model with planted classes: ``y[v]`` is the block of v.

    Blocks have sizes n // blocks or n // blocks + 1, and membership is a random permutation,
    so block ids are not contiguous ranges of vertex ids (a block partitioner gets no free
    hint). Each pair of distinct vertices is an edge with probability ``p_in`` inside a block
    and ``p_out`` across blocks. Generation works per block pair: the pair's edge count is drawn
    from Binomial(#vertex pairs, p), then that many endpoint pairs are drawn uniformly; the rare
    repeated draws are merged, so the realised count is very slightly below the binomial draw.
    Undirected by default (each unordered pair drawn once, stored both ways); with ``directed``
    each ordered pair is drawn independently. No self loops.

    Features: ``x = mu[y] + noise * N(0, I)`` with ``mu[k]`` a random unit vector in R^feat, so
    the per-node signal-to-noise is 1 / noise; averaging over neighbours (what a GCN does)
    raises it, which is why the graph matters. Masks random 60/20/20.

    Shapes: ``x`` (n, feat) float32, ``y`` (n,) int64 in [0, blocks).
    """
    _check(isinstance(n, (int, np.integer)) and n >= 3, f"sbm n must be an integer >= 3, got {n!r}")
    _check(isinstance(blocks, (int, np.integer)) and 1 <= blocks <= n,
           f"sbm blocks must be an integer in [1, n={n}], got {blocks!r}")
    for name, p in (("p_in", p_in), ("p_out", p_out)):
        _check(0.0 <= p <= 1.0, f"sbm {name} must be a probability in [0, 1], got {p!r}")
    _check(isinstance(feat, (int, np.integer)) and feat >= 1, f"sbm feat must be an integer >= 1, got {feat!r}")
    _check(np.isfinite(noise) and noise >= 0, f"sbm noise must be a finite number >= 0, got {noise!r}")
    n, blocks = int(n), int(blocks)
    check_memory(sbm_bytes(n, blocks, p_in, p_out, feat, directed),
                 f"sbm n={n:,} ({blocks:,} blocks, {int(feat):,} features)")
    member_rng, edge_rng, x_rng, mask_rng = _streams(seed, 4)
    sizes = np.full(blocks, n // blocks, dtype=np.int64)
    sizes[: n % blocks] += 1
    y = member_rng.permutation(np.repeat(np.arange(blocks, dtype=np.int64), sizes))
    members = np.argsort(y, kind="stable")  # vertices of block k: members[first[k]:first[k] + sizes[k]]
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])

    bi, bj = np.meshgrid(np.arange(blocks), np.arange(blocks), indexing="ij")
    bi, bj = bi.ravel(), bj.ravel()
    if not directed:
        upper = bi <= bj
        bi, bj = bi[upper], bj[upper]
    same = bi == bj
    pairs = np.where(same, sizes[bi] * (sizes[bi] - 1), sizes[bi] * sizes[bj])
    if not directed:
        pairs = np.where(same, pairs // 2, pairs)
    counts = edge_rng.binomial(pairs, np.where(same, p_in, p_out))
    which = np.repeat(np.arange(bi.size), counts)
    srcs, dsts = [], []
    for start in range(0, which.size, _CHUNK):
        w = which[start:start + _CHUNK]
        size_i = sizes[bi[w]]
        # floor(r * s) with r < 1 can still round up to s: clip to the last member
        u = np.minimum(np.floor(edge_rng.random(w.size) * size_i).astype(np.int64), size_i - 1)
        # inside a block draw the second end among the other s - 1 vertices: never a self loop
        other = sizes[bj[w]] - same[w]
        v = np.minimum(np.floor(edge_rng.random(w.size) * other).astype(np.int64), other - 1)
        v += same[w] & (v >= u)
        srcs.append(members[first[bi[w]] + u])
        dsts.append(members[first[bj[w]] + v])
    empty = [np.zeros(0, np.int64)]
    indptr, indices = _adjacency(np.concatenate(srcs or empty), np.concatenate(dsts or empty), n, directed)

    mu = x_rng.standard_normal((blocks, int(feat)))
    mu /= np.linalg.norm(mu, axis=1, keepdims=True)
    x = (mu[y] + noise * x_rng.standard_normal((n, int(feat)))).astype(np.float32)
    train, val, test = split_masks(n, mask_rng)
    return Graph(indptr, indices, x, y, train, val, test, blocks,
                 name=f"sbm-n{n}-b{blocks}",
                 meta={"generator": "sbm", "p_in": float(p_in), "p_out": float(p_out), "noise": float(noise),
                       "seed": int(seed), "directed": bool(directed)})
