"""Synthetic graphs: R-MAT (power-law, for scaling runs) and a stochastic block model (learnable).

Both generators are vectorised numpy, deterministic per ``seed``, and never build a dense n × n
matrix. Each random ingredient (edges, vertex permutation, features, labels, masks) draws from
its own child stream of ``np.random.SeedSequence(seed)``, so changing ``feat`` does not change
the edges, and changing ``classes`` does not change the features.

Undirected graphs are stored with both directions of every edge, no self loops, no duplicates,
and sorted columns in every CSR row.

Each generator writes into an output (:mod:`.ingest`): :func:`write_rmat` / :func:`write_sbm`
stream into a cache folder in bounded memory (edges through :func:`.csr_stream.build_csr`,
the samples spilled to a scratch file between its passes; features a block of rows at a
time, the same draws in the same order), and :func:`rmat` / :func:`sbm` run the same code
into memory, so both give the same graph bit for bit.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from .csr_stream import build_csr, csr_bytes
from .errors import InputError
from .graph import Graph, split_masks
from .ingest import MemoryWriter, edge_spill, write_csr, write_rows
from .limits import check_memory, check_num_classes
from .progress import throttled

#: edge samples drawn per step. Part of the graph's definition: the draws of one step are
#: made level by level, so another value gives another graph (never change it).
_CHUNK = 1 << 22


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise InputError(msg)


def _streams(seed: int, k: int):
    """``k`` independent generators derived from one seed."""
    _check(isinstance(seed, (int, np.integer)) and seed >= 0,
           f"seed must be an integer >= 0, got {seed!r}")
    return [np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(k)]


def _streaming_bytes(entries: int, n: int, in_memory: bool, row_bytes: int) -> int:
    """Peak bytes of a generator (an estimate): the streamed CSR (:func:`.csr_stream.csr_bytes`),
    one chunk of samples being drawn, and in memory the node features (``row_bytes`` a
    vertex)."""
    return (csr_bytes(entries, n, in_memory) + 40 * min(entries, _CHUNK)
            + (row_bytes * n if in_memory else 0))


def rmat_bytes(scale: int, ef: int, feat: int, in_memory: bool = True) -> int:
    """About the peak bytes :func:`write_rmat` needs (an estimate, checked against peak RSS):
    the streamed CSR (:func:`_streaming_bytes`, both directions of every sample), and per
    vertex the permutation, ``y``, the masks and their shuffle; ``in_memory`` also holds
    ``x`` (float32) and the result, a cache only one block of ``x``."""
    n = 1 << int(scale)
    entries = 2 * int(ef) * n
    return _streaming_bytes(entries, n, in_memory, 4 * int(feat)) + n * (4 + 8 + 3 + 8)


def sbm_bytes(n: int, blocks: int, p_in: float, p_out: float, feat: int, directed: bool,
              in_memory: bool = True) -> int:
    """About the peak bytes :func:`write_sbm` needs (an estimate): the streamed CSR of the
    expected edge count (:func:`_streaming_bytes`), the block-pair tables, and ``x`` (built
    in float64 a block at a time; held as float32 in memory)."""
    n, blocks = int(n), int(blocks)
    size = n / blocks
    inside = blocks * size * (size - 1) * p_in
    across = (n * n - blocks * size * size) * p_out
    entries = int(inside + across)  # both directions when undirected: the same count
    return (_streaming_bytes(entries, n, in_memory, 4 * int(feat)) + 48 * blocks * blocks
            + n * (8 * 4 + 3))


def rmat(scale: int, ef: int, feat: int = 128, classes: int = 16, seed: int = 0,
         a: float = 0.57, b: float = 0.19, c: float = 0.19, directed: bool = False,
         permute: bool = True, progress: Optional[Callable[[str], None]] = None) -> Graph:
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
    out = MemoryWriter()
    write_rmat(out, scale, ef, feat, classes, seed, a, b, c, directed, permute, progress)
    return out.finish()


def write_rmat(out, scale: int, ef: int, feat: int = 128, classes: int = 16, seed: int = 0,
               a: float = 0.57, b: float = 0.19, c: float = 0.19, directed: bool = False,
               permute: bool = True, progress: Optional[Callable[[str], None]] = None) -> None:
    """:func:`rmat` written into ``out`` (:mod:`.ingest`); the caller finishes ``out``."""
    _check(isinstance(scale, (int, np.integer)) and 2 <= scale <= 31,
           f"rmat scale must be an integer in [2, 31], got {scale!r}")
    _check(isinstance(ef, (int, np.integer)) and ef >= 1,
           f"rmat ef must be an integer >= 1, got {ef!r}")
    _check(isinstance(feat, (int, np.integer)) and feat >= 1,
           f"rmat feat must be an integer >= 1, got {feat!r}")
    _check(isinstance(classes, (int, np.integer)) and classes >= 1,
           f"rmat classes must be an integer >= 1, got {classes!r}")
    for name, p in (("a", a), ("b", b), ("c", c)):
        _check(0.0 <= p <= 1.0, f"rmat {name} must be a probability in [0, 1], got {p!r}")
    _check(a + b + c <= 1.0, f"rmat needs a + b + c <= 1, got {a + b + c:.6g}")
    scale, feat = int(scale), int(feat)
    n, samples = 1 << scale, int(ef) << scale
    check_num_classes(int(classes), n, "rmat classes", "most classes would have no node")
    check_memory(rmat_bytes(scale, ef, feat, out.holds_arrays),
                 f"rmat scale={scale} ({n:,} nodes, {samples:,} edge samples, {feat:,} features)")
    say = throttled(progress)
    edge_rng, perm_rng, x_rng, y_rng, mask_rng = _streams(seed, 5)
    # cumulative quadrant bounds in float32 so that the comparisons stay in float32
    t_a, t_ab, t_abc = (np.float32(v) for v in (a, a + b, a + b + c))
    perm = perm_rng.permutation(n).astype(np.uint32) if permute else None
    def sample_chunks():
        for start in range(0, samples, _CHUNK):
            size = min(_CHUNK, samples - start)
            src = np.zeros(size, dtype=np.uint32)
            dst = np.zeros(size, dtype=np.uint32)
            for _ in range(scale):
                r = edge_rng.random(size, dtype=np.float32)
                # quadrant q in 0..3 (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right)
                q = ((r >= t_a).view(np.uint8) + (r >= t_ab).view(np.uint8)
                     + (r >= t_abc).view(np.uint8))
                src <<= 1
                src |= q >> 1
                dst <<= 1
                dst |= q & 1
            if perm is not None:
                src, dst = perm[src], perm[dst]
            say(f"rmat: {start + size:,} of {samples:,} edge samples")
            yield src, dst

    say(f"rmat scale={scale}: {n:,} nodes, {samples:,} edge samples", force=True)
    write_csr(out, *build_csr(sample_chunks(), n, directed, edge_spill(out), drop_loops=True,
                              progress=say))
    say(f"rmat: features ({n:,} x {feat})", force=True)
    write_rows(out, "x", np.float32, (n, feat),
               lambda lo, hi: x_rng.standard_normal((hi - lo, feat), dtype=np.float32))
    out.write("y", y_rng.integers(0, int(classes), size=n, dtype=np.int64))
    for name, mask in zip(("train_mask", "val_mask", "test_mask"), split_masks(n, mask_rng)):
        out.write(name, mask)
    out.name, out.num_classes = f"rmat-s{scale}-ef{ef}", int(classes)
    out.meta = {"generator": "rmat", "scale": int(scale), "ef": int(ef), "a": a, "b": b, "c": c,
                "seed": int(seed), "directed": bool(directed), "permute": bool(permute)}


def sbm(n: int, blocks: int, p_in: float, p_out: float, feat: int = 32, noise: float = 1.0,
        seed: int = 0, directed: bool = False,
        progress: Optional[Callable[[str], None]] = None) -> Graph:
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
    out = MemoryWriter()
    write_sbm(out, n, blocks, p_in, p_out, feat, noise, seed, directed, progress)
    return out.finish()


def write_sbm(out, n: int, blocks: int, p_in: float, p_out: float, feat: int = 32,
              noise: float = 1.0, seed: int = 0, directed: bool = False,
              progress: Optional[Callable[[str], None]] = None) -> None:
    """:func:`sbm` written into ``out`` (:mod:`.ingest`); the caller finishes ``out``."""
    _check(isinstance(n, (int, np.integer)) and n >= 3, f"sbm n must be an integer >= 3, got {n!r}")
    _check(isinstance(blocks, (int, np.integer)) and 1 <= blocks <= n,
           f"sbm blocks must be an integer in [1, n={n}], got {blocks!r}")
    for name, p in (("p_in", p_in), ("p_out", p_out)):
        _check(0.0 <= p <= 1.0, f"sbm {name} must be a probability in [0, 1], got {p!r}")
    _check(isinstance(feat, (int, np.integer)) and feat >= 1,
           f"sbm feat must be an integer >= 1, got {feat!r}")
    _check(np.isfinite(noise) and noise >= 0,
           f"sbm noise must be a finite number >= 0, got {noise!r}")
    n, blocks, feat = int(n), int(blocks), int(feat)
    check_memory(sbm_bytes(n, blocks, p_in, p_out, feat, directed, out.holds_arrays),
                 f"sbm n={n:,} ({blocks:,} blocks, {feat:,} features)")
    say = throttled(progress)
    member_rng, edge_rng, x_rng, mask_rng = _streams(seed, 4)
    sizes = np.full(blocks, n // blocks, dtype=np.int64)
    sizes[: n % blocks] += 1
    y = member_rng.permutation(np.repeat(np.arange(blocks, dtype=np.int64), sizes))
    # vertices of block k: members[first[k]:first[k] + sizes[k]]
    members = np.argsort(y, kind="stable")
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
    ends = np.cumsum(edge_rng.binomial(pairs, np.where(same, p_in, p_out)))
    total = int(ends[-1]) if ends.size else 0
    def edge_chunks():
        for start in range(0, total, _CHUNK):
            # block pair of each edge: the run-length expansion of the counts, one chunk of it
            w = np.searchsorted(ends, np.arange(start, min(total, start + _CHUNK)), side="right")
            size_i = sizes[bi[w]]
            # floor(r * s) with r < 1 can still round up to s: clip to the last member
            u = np.minimum(np.floor(edge_rng.random(w.size) * size_i).astype(np.int64), size_i - 1)
            # inside a block draw the second end among the other s - 1 vertices: never a self loop
            other = sizes[bj[w]] - same[w]
            v = np.minimum(np.floor(edge_rng.random(w.size) * other).astype(np.int64), other - 1)
            v += same[w] & (v >= u)
            say(f"sbm: {start + w.size:,} of {total:,} edges")
            yield members[first[bi[w]] + u], members[first[bj[w]] + v]

    say(f"sbm n={n:,}: {blocks:,} blocks, {total:,} edge draws", force=True)
    write_csr(out, *build_csr(edge_chunks(), n, directed, edge_spill(out), drop_loops=True,
                              progress=say))
    mu = x_rng.standard_normal((blocks, feat))
    mu /= np.linalg.norm(mu, axis=1, keepdims=True)
    write_rows(out, "x", np.float32, (n, feat), lambda lo, hi: (
        mu[y[lo:hi]] + noise * x_rng.standard_normal((hi - lo, feat))).astype(np.float32))
    out.write("y", y)
    for name, mask in zip(("train_mask", "val_mask", "test_mask"), split_masks(n, mask_rng)):
        out.write(name, mask)
    out.name, out.num_classes = f"sbm-n{n}-b{blocks}", blocks
    out.meta = {"generator": "sbm", "p_in": float(p_in), "p_out": float(p_out),
                "noise": float(noise), "seed": int(seed), "directed": bool(directed)}
