"""Partition quality: what a partition costs the distributed kernels.

All counts are over the propagation structure S = A' + I (the matrix every kernel multiplies;
its self loops never cross parts) unless said otherwise. For a partition into P parts:

- ``edge_cut`` / ``edge_cut_fraction``: off-diagonal non-zeros of S whose row and column have
  different owners, and their share of all off-diagonal non-zeros;
- ``vertex_balance`` = max / mean of part sizes; ``edge_balance`` = max / mean of the non-zeros
  of each part's rows of S (a local SpMM's work); ``nodes_max``/``nodes_mean`` and
  ``nnz_max``/``nnz_mean``: what the busiest part holds against the mean, the part that sets a
  synchronous epoch's time (its features and dense layers scale with nodes, its SpMM with
  non-zeros);
- ``halo`` per part: the number of distinct columns of the part's rows owned by other parts, i.e.
  the H rows sparsity-aware 1D must receive per SpMM; ``halo_total`` and ``halo_max``;
- ``bytes_allgather`` = (P-1) * n * f * 4: every rank receives every other rank's H rows (the
  1D all-gather, all ranks together, one SpMM, float32); ``bytes_halo`` = halo_total * f * 4;
- with a grid: max/mean non-zeros per rank of the 2D/3D kernels' blocks on that grid, under the
  partition's parts and under the balanced layout ``gnnpar-train`` runs (:mod:`grid`).

:func:`halo_counts` is the single definition of the halo used by the shards' tests and the
benchmark.
"""
from __future__ import annotations

import numpy as np

from gnnpar.datasets import Graph
from gnnpar.datasets.normalize import union_structure

from .grid import GridSpec, nnz_balance
from .partition import Partition

FLOAT_BYTES = 4


def halo_counts(indptr, indices, owner: np.ndarray, parts: int) -> np.ndarray:
    """Distinct remote columns of each part's rows, (parts,) int64."""
    n = owner.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(np.asarray(indptr)))
    cols = np.asarray(indices, dtype=np.int64)
    row_part = owner[rows].astype(np.int64)
    remote = row_part != owner[cols]
    keys = np.unique(row_part[remote] * n + cols[remote])
    return np.bincount(keys // max(n, 1), minlength=parts).astype(np.int64)


def _ratio(values: np.ndarray) -> float:
    mean = float(values.mean()) if values.size else 0.0
    return float(values.max() / mean) if mean > 0 else 1.0


def structure_counts(indptr, indices, owner: np.ndarray, parts: int) -> dict:
    """What the report needs from a whole S: non-zeros, cut entries, non-zeros and halo of each
    part, off-diagonal non-zeros (``ShardBuilder.quality_counts`` gives the same without S)."""
    n = owner.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    cross = owner[rows] != owner[indices]
    return {"nnz": int(indices.shape[0]), "edge_cut": int(np.count_nonzero(cross)),
            "part_nnz": np.bincount(owner[rows], minlength=parts).astype(np.int64),
            "halo": halo_counts(indptr, indices, owner, parts),
            "off_diagonal": int(np.count_nonzero(rows != indices))}


def report(graph: Graph, partition: Partition, feat_width: int = 128, grid=None,
           structure=None, counts=None) -> dict:
    """Quality figures of ``partition`` on ``graph`` (see module docstring); JSON-ready dict.

    ``counts`` (:func:`structure_counts`, or ``ShardBuilder.quality_counts()`` made without
    S) spares building S; ``structure`` passes an already built ``union_structure(graph)``.
    ``grid`` (a :class:`GridSpec`, or dims like ``(2, 3)``) adds non-zeros per grid rank, which
    needs S whole.
    """
    P = partition.num_parts
    if counts is None or grid is not None:
        structure = structure if structure is not None else union_structure(graph)
    if counts is None:
        counts = structure_counts(structure[0], structure[1], partition.owner, P)
    n = graph.num_nodes
    cut, off, part_nnz, halo = (counts["edge_cut"], counts["off_diagonal"], counts["part_nnz"],
                                counts["halo"])
    f = int(feat_width)
    out = {
        "method": partition.method, "seed": partition.seed, "parts": P, "n": n,
        "nnz": int(counts["nnz"]), "edge_cut": cut,
        "edge_cut_fraction": cut / off if off else 0.0,
        "vertex_balance": _ratio(partition.sizes.astype(np.float64)),
        "edge_balance": _ratio(part_nnz.astype(np.float64)),
        "sizes_min": int(partition.sizes.min()), "sizes_max": int(partition.sizes.max()),
        "nodes_max": int(partition.sizes.max()), "nodes_mean": float(partition.sizes.mean()),
        "nnz_max": int(part_nnz.max()), "nnz_mean": float(part_nnz.mean()),
        "halo": [int(h) for h in halo], "halo_total": int(halo.sum()), "halo_max": int(halo.max()),
        "feat_width": f,
        "bytes_allgather": (P - 1) * n * f * FLOAT_BYTES,
        "bytes_halo": int(halo.sum()) * f * FLOAT_BYTES,
        "bytes_halo_max_rank": int(halo.max()) * f * FLOAT_BYTES,
    }
    out["halo_over_allgather"] = (out["bytes_halo"] / out["bytes_allgather"]
                                  if out["bytes_allgather"] else 0.0)
    if grid is not None:
        spec = grid if isinstance(grid, GridSpec) else GridSpec(tuple(grid))
        out["grid"] = spec.text
        out["grid_nnz"] = nnz_balance(structure[0], structure[1], spec, partition)
    return out


def format_report(rep: dict) -> str:
    """Human-readable lines of a :func:`report` dict."""
    mib = 1 << 20
    lines = [
        f"method={rep['method']} parts={rep['parts']} seed={rep['seed']} n={rep['n']:,} "
        f"nnz(A'+I)={rep['nnz']:,}",
        f"edge cut: {rep['edge_cut']:,} ({100 * rep['edge_cut_fraction']:.2f}% "
        f"of off-diagonal non-zeros)",
        f"balance (max/mean): vertices {rep['vertex_balance']:.3f}, edges {rep['edge_balance']:.3f}"
        f" (part sizes {rep['sizes_min']:,}..{rep['sizes_max']:,})",
        f"max per part: {rep['nodes_max']:,} nodes ({rep['vertex_balance']:.2f}x the mean "
        f"{rep['nodes_mean']:,.0f}: features, dense layers), {rep['nnz_max']:,} non-zeros of A'+I "
        f"({rep['edge_balance']:.2f}x the mean {rep['nnz_mean']:,.0f}: local SpMM work)",
        f"halo rows: total {rep['halo_total']:,}, max per part {rep['halo_max']:,}",
        f"bytes per SpMM at f={rep['feat_width']}: "
        f"1D all-gather {rep['bytes_allgather'] / mib:,.1f} MiB, "
        f"halo exchange {rep['bytes_halo'] / mib:,.1f} MiB "
        f"({100 * rep['halo_over_allgather']:.1f}%)",
    ]
    if "grid_nnz" in rep:
        g = rep["grid_nnz"]
        lines.append(f"grid {rep['grid']} non-zeros per rank max/mean: "
                     f"{g['balanced']['max_over_mean']:.3f} "
                     f"in the balanced layout gnnpar-train runs, {g['parts']['max_over_mean']:.3f} "
                     f"with blocks cut along the parts")
    return "\n".join(lines)
