"""Cost model of full-batch epochs: bytes and messages per rank, memory per rank, time.

Two modes, same formulas:

- *exact*: given the graph's structure (Â's union structure, self loops included) and the
  ownership of every vertex (the partition), :func:`epoch_traffic` returns per-rank bytes and
  messages of one training epoch (forward + backward SpMMs + the gradient all-reduce) that
  equal :class:`gnnpar.kernels.comm.Comm`'s counters exactly for every algorithm (the counting
  rules of comm.py's docstring are reproduced here collective by collective);
- *estimate*: with only n, m and an optional ``cut_fraction`` (share of non-zeros whose column
  another rank owns; default 1 − 1/p, a random partition), :func:`estimate_traffic` models the
  average rank with the same collectives. Distinct halo rows are estimated as
  w·(1 − e^(−e/w)) for e non-zeros spread over w candidate rows (uniform random graph).

An epoch per layer l with SpMM width f_l: the forward SpMM, and its backward when the SpMM's
input needs a gradient (not the first layer's when it aggregates the raw features, see
:func:`spmm_widths`). Evaluation passes (phase ``eval``) are not part of an epoch.

Time model (:class:`Machine`, every field settable): latency·messages + bytes/bandwidth +
SpMM and dense flops / rates. Defaults (documented in the fields) are a 2020s GPU cluster:
25 GB/s per rank, 5 µs per message, 2e11 sparse and 5e13 dense flop/s.

Each algorithm's formulas are the ``cost`` of its registry entry (at the end of its
``kernels/spmm_*.py``, written with :mod:`gnnpar.kernels.cost_terms`); this module only sums
them over an epoch and ranks them. An algorithm without one is refused here and never chosen.

:func:`rank_algorithms` enumerates every algorithm and grid for a world size and returns them
ranked by modelled epoch time under a per-rank memory cap (``--algo auto``, ``gnnpar-plan``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from gnnpar.datasets import InputError

from .algorithms import ALGORITHMS, cost_names, get
from .cost_terms import (F32, Cost, Sizes, Structure, allreduce_bytes, coll, param_count,
                         spmm_widths)

__all__ = ["Structure", "Machine", "spmm_widths", "param_count", "allreduce_bytes",
           "epoch_traffic", "estimate_traffic", "memory_bytes", "epoch_time", "candidates",
           "rank_algorithms"]


def __getattr__(name: str):
    """``ALGOS``: the algorithms with a cost-model entry, read from the registry."""
    if name == "ALGOS":
        return cost_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _cost(algo: str) -> Cost:
    entry = get(algo)
    if entry.cost is None:
        raise InputError(f"--algo {algo} has no cost-model entry; the cost model and --algo "
                         f"auto know {', '.join(cost_names())}")
    return entry.cost


# ----------------------------------------------------------------- exact per-rank traffic
def epoch_traffic(structure: Structure, algo: str, kind: str, widths: Sequence[int], dims=None,
                  variant: str = "halo", layers: int = 0, rotate: bool = True) -> Dict[str, np.ndarray]:
    """Exact per-rank ``bytes`` and ``messages`` of one epoch (``dims``: (pr, pc) for 2d, c for
    1.5d, (px, py, pz) for 3d/4d; ``layers``/``rotate`` as the 3d builder)."""
    p = structure.p
    counts = _cost(algo).exact(structure, dims, variant, layers, rotate)
    nbytes = np.zeros(p, np.int64)
    msgs = np.zeros(p, np.int64)
    for l, (f, back) in enumerate(spmm_widths(kind, widths)):
        fb, fm, bb, bm = counts.spmm(f, l)
        nbytes += fb + (bb if back else 0)
        msgs += fm + (bm if back else 0)
    P = param_count(kind, widths)
    nbytes += allreduce_bytes(P, p)
    msgs += 2 * coll(p)
    return {"bytes": nbytes, "messages": msgs}


# ----------------------------------------------------------------- estimates (no partition)
def estimate_traffic(n: int, m: int, p: int, algo: str, kind: str, widths: Sequence[int],
                     dims=None, variant: str = "halo", cut_fraction: Optional[float] = None
                     ) -> Dict[str, float]:
    """Average-rank ``bytes``, ``messages`` per epoch and ``recv_rows`` (rows of H a rank holds
    beyond its own, for memory) from n, m and the share of non-zeros with a remote column."""
    spmm = _cost(algo).estimate(Sizes.of(n, m, p, cut_fraction), dims, variant)
    nbytes = msgs = 0.0
    recv_rows = 0.0
    for f, back in spmm_widths(kind, widths):
        b, k, rows = spmm(f, back)
        nbytes += b
        msgs += k
        recv_rows = max(recv_rows, rows)
    nbytes += float(allreduce_bytes(param_count(kind, widths), p).mean())
    msgs += 2 * coll(p)
    return {"bytes": nbytes, "messages": msgs, "recv_rows": recv_rows}


# ----------------------------------------------------------------- memory and time
@dataclass
class Machine:
    """Figures of the time model (override any).

    bandwidth: bytes/s a rank sends (default 25e9, ≈ 200 Gb/s InfiniBand per GPU).
    latency: seconds per message (default 5e-6).
    spmm_rate: sparse multiply-adds/s ×2, i.e. flop/s of SpMM (default 2e11, memory-bound).
    dense_rate: flop/s of the dense layers (default 5e13).
    """

    bandwidth: float = 25e9
    latency: float = 5e-6
    spmm_rate: float = 2e11
    dense_rate: float = 5e13


def memory_bytes(n: int, m: int, p: int, algo: str, widths: Sequence[int], recv_feat_rows: float,
                 dims=None, layers: int = 0) -> float:
    """Approximate peak bytes per rank: Â and Âᵀ as CSR (12 bytes a non-zero, 8 a row pointer;
    3d: one piece per orientation used plus the gathered block), owned activations and their
    gradients for every layer, and the received H rows of the widest SpMM."""
    nr, mr = n / p, m / p
    a = 2 * (12 * mr + 8 * nr)
    matrix = _cost(algo).matrix_bytes
    if matrix is not None:
        a = matrix(a, n, m, dims, layers)
    acts = 2 * F32 * nr * sum(fi + fo for fi, fo in zip(widths[:-1], widths[1:]))
    return a + acts + F32 * recv_feat_rows


def epoch_time(nbytes: float, msgs: float, n: int, m: int, p: int, kind: str,
               widths: Sequence[int], machine: Machine) -> float:
    spmm = sum(2 * (m / p) * f * (2 if back else 1) for f, back in spmm_widths(kind, widths))
    dense = sum(6 * (n / p) * fi * fo for fi, fo in zip(widths[:-1], widths[1:]))
    return (msgs * machine.latency + nbytes / machine.bandwidth + spmm / machine.spmm_rate
            + dense / machine.dense_rate)


def candidates(p: int):
    """(algo, dims, variant) for every algorithm ``--algo auto`` considers, at world size p
    (in registry order; an entry without ``candidates`` is never chosen automatically)."""
    for name, entry in ALGORITHMS.items():
        if entry.cost is not None and entry.cost.candidates is not None:
            for dims, variant in entry.cost.candidates(p):
                yield name, dims, variant


def rank_algorithms(n: int, m: int, widths: Sequence[int], world: int, kind: str = "gcn",
                    mem_cap: Optional[float] = None, machine: Optional[Machine] = None,
                    cut_fraction: Optional[float] = None, layers: Optional[int] = None) -> List[dict]:
    """Every (algorithm, grid, variant) at ``world`` ranks with modelled bytes, messages, memory
    and epoch time per (average) rank, best first; rows over ``mem_cap`` bytes come last with
    ``fits`` False. Needs only n, m (and optionally the cut fraction): works for any world."""
    machine = machine or Machine()
    layers = len(widths) - 1 if layers is None else layers
    rows = []
    for algo, dims, variant in candidates(world):
        t = estimate_traffic(n, m, world, algo, kind, widths, dims, variant, cut_fraction)
        mem = memory_bytes(n, m, world, algo, widths, t["recv_rows"], dims, layers)
        secs = epoch_time(t["bytes"], t["messages"], n, m, world, kind, widths, machine)
        grid = ("x".join(map(str, dims)) if isinstance(dims, tuple)
                else (f"{world // dims}x{dims}" if dims else str(world)))
        rows.append({"algo": algo, "grid": grid, "variant": variant, "replication":
                     dims if "replication" in ALGORITHMS[algo].flags else 1, "bytes": t["bytes"],
                     "messages": t["messages"], "memory": mem, "time_s": secs,
                     "fits": bool(mem_cap is None or mem <= mem_cap)})
    rows.sort(key=lambda r: (not r["fits"], r["time_s"]))
    return rows
