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

**The critical path.** An epoch runs at the pace of its busiest rank: every collective waits
for its slowest member. So the ranking uses, per candidate, the *busiest* rank's *padded*
bytes (``all_gather``/``reduce_scatter`` pad every member's chunk to the group's largest, see
:mod:`gnnpar.kernels.comm`) and messages, and the busiest rank's compute. With the graph's
structure and a partition (``structure=`` in :func:`rank_algorithms`, ``gnnpar-plan
--partitioner``) these are exact per-rank figures and their maximum; with n and m alone the
estimate is the average rank of even blocks, whose busiest rank is the average one.

Time model (:class:`Machine`, every field settable, or calibrated on the machine at hand by
``gnnpar-plan --calibrate``, :mod:`gnnpar.calibrate`): epoch seconds ≈
max over ranks of (SpMM multiply-adds × 2 / ``spmm_rate`` + dense flops / ``dense_rate`` +
owned rows × Σ widths / ``elementwise_rate``) + max over ranks of (``latency`` × messages +
padded bytes / ``bandwidth``), no overlap assumed. The elementwise term is everything else an
epoch does per row and feature (bias, activation, dropout, loss, their backward, zeroing
gradients): on a CPU it is most of a small model's epoch. Defaults (documented in the fields)
are a 2020s GPU cluster: 25 GB/s per rank, 5 µs per message, 2e11 sparse and 5e13 dense
flop/s, 1e11 row-features/s.

Each algorithm's formulas are the ``cost`` of its registry entry (at the end of its
``kernels/spmm_*.py``, written with :mod:`gnnpar.kernels.cost_terms`); this module only sums
them over an epoch and ranks them. An algorithm without one is refused here and never chosen.

:func:`rank_algorithms` enumerates every algorithm and grid for a world size and returns them
ranked by modelled epoch time under a per-rank memory cap (``--algo auto``, ``gnnpar-plan``);
:func:`predict` is the same model for one algorithm and grid on a given partition.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from gnnpar.datasets import InputError

from .algorithms import ALGORITHMS, cost_names, get
from .cost_terms import (F32, Cost, Sizes, Structure, allreduce_bytes, coll, no_padding,
                         owned_rows_work, param_count, spmm_widths)

__all__ = ["Structure", "Machine", "spmm_widths", "param_count", "allreduce_bytes",
           "epoch_traffic", "estimate_traffic", "memory_bytes", "epoch_time", "candidates",
           "rank_algorithms", "epoch_work", "predict"]


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
    """Exact per-rank ``bytes`` (logical, as :attr:`Comm.bytes` counts them), ``padded``
    (what really moves, as :attr:`Comm.padded` counts it) and ``messages`` of one epoch
    (``dims``: (pr, pc) for 2d, c for 1.5d, (px, py, pz) for 3d/4d; ``layers``/``rotate`` as
    the 3d builder)."""
    p = structure.p
    counts = _cost(algo).exact(structure, dims, variant, layers, rotate)
    pad_fwd, pad_bwd = _padding(algo)(structure, dims, variant)
    # counts whose padding is not rows × f (3d: feature slices and Â pieces) give it in bytes
    pad_bytes = getattr(counts, "padding_bytes", None)
    nbytes = np.zeros(p, np.int64)
    padded = np.zeros(p, np.int64)
    msgs = np.zeros(p, np.int64)
    for l, (f, back) in enumerate(spmm_widths(kind, widths)):
        fb, fm, bb, bm = counts.spmm(f, l)
        nbytes += fb + (bb if back else 0)
        if pad_bytes is not None:
            pf, pb = pad_bytes(f, l)
            padded += pf + (pb if back else 0)
        else:
            padded += (pad_fwd + (pad_bwd if back else 0)) * f * F32
        msgs += fm + (bm if back else 0)
    P = param_count(kind, widths)
    nbytes += allreduce_bytes(P, p)
    msgs += 2 * coll(p)
    return {"bytes": nbytes, "padded": nbytes + padded, "messages": msgs}


# ----------------------------------------------------------------- padding and work
def _padding(algo: str) -> Callable:
    """The algorithm's padding rule (its entry's ``Cost.padding``), else none (3d/4d count
    theirs in their exact counts' ``padding_bytes``, since it is not rows × f)."""
    return _cost(algo).padding or no_padding


def epoch_work(structure: Structure, algo: str, kind: str, widths: Sequence[int], dims=None,
               variant: str = "halo", layers: int = 0, rotate: bool = True) -> Dict[str, np.ndarray]:
    """Per-rank ``spmm_flops`` (2 × multiply-adds of every SpMM of an epoch, backward ones
    included), ``dense_flops`` (each rank's own rows through every layer's weights: forward,
    and the input and weight gradients) and ``elementwise`` (owned rows × Σ widths)."""
    work = (_cost(algo).work or owned_rows_work)(structure, dims, variant, layers, rotate)
    spmm = np.zeros(structure.p, np.float64)
    for l, (f, back) in enumerate(spmm_widths(kind, widths)):
        spmm += 2.0 * work(f, l) * (2 if back else 1)
    dense = 6.0 * structure.sizes * _dense_per_row(kind, widths)
    return {"spmm_flops": spmm, "dense_flops": dense,
            "elementwise": structure.sizes * float(sum(widths))}


def _dense_per_row(kind: str, widths: Sequence[int]) -> float:
    """Multiply-adds per row of one forward pass through the layers' weights."""
    per = 2 if kind == "sage" else 1
    return float(sum(per * fi * fo for fi, fo in zip(widths[:-1], widths[1:])))


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
    elementwise_rate: row-features/s of the rest of an epoch, counted as owned rows × the sum
      of the layer widths (input and output included; default 1e11).
    """

    bandwidth: float = 25e9
    latency: float = 5e-6
    spmm_rate: float = 2e11
    dense_rate: float = 5e13
    elementwise_rate: float = 1e11

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "calibration") -> "Machine":
        """The figures of ``d`` (other keys — what the probe measured, on which host — are
        ignored); every field must be there, finite and > 0."""
        values = {}
        for f in fields(cls):
            v = d.get(f.name) if isinstance(d, dict) else None
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (
                    math.isfinite(v) and v > 0):
                raise InputError(f"{where}: {f.name} must be a finite number > 0, got {v!r}")
            values[f.name] = float(v)
        return cls(**values)

    @classmethod
    def load(cls, path: str) -> "Machine":
        """A calibration file written by ``gnnpar-plan --calibrate`` (:mod:`gnnpar.calibrate`)."""
        try:
            with open(path) as fh:
                d = json.load(fh)
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read the calibration file {path}: {e}") from None
        return cls.from_dict(d, path)


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
    """The average rank of even blocks (estimate mode): its compute plus its communication."""
    spmm = sum(2 * (m / p) * f * (2 if back else 1) for f, back in spmm_widths(kind, widths))
    dense = 6 * (n / p) * _dense_per_row(kind, widths)
    return (msgs * machine.latency + nbytes / machine.bandwidth + spmm / machine.spmm_rate
            + dense / machine.dense_rate + (n / p) * sum(widths) / machine.elementwise_rate)


def predict(structure: Structure, algo: str, kind: str, widths: Sequence[int], machine: Machine,
            dims=None, variant: str = "halo", layers: int = 0, rotate: bool = True) -> dict:
    """One algorithm and grid on a given partition: the busiest rank's padded bytes and
    messages, the mean logical bytes, and the modelled epoch seconds (``time_s`` =
    ``compute_s`` + ``comm_s``, each the busiest rank's)."""
    t = epoch_traffic(structure, algo, kind, widths, dims, variant, layers, rotate)
    w = epoch_work(structure, algo, kind, widths, dims, variant, layers, rotate)
    comm = machine.latency * t["messages"] + t["padded"] / machine.bandwidth
    compute = (w["spmm_flops"] / machine.spmm_rate + w["dense_flops"] / machine.dense_rate
               + w["elementwise"] / machine.elementwise_rate)
    return {"bytes": int(t["padded"].max()), "bytes_mean": float(t["bytes"].mean()),
            "messages": int(t["messages"].max()), "compute_s": float(compute.max()),
            "comm_s": float(comm.max()), "time_s": float(compute.max() + comm.max())}


def candidates(p: int):
    """(algo, dims, variant) for every algorithm ``--algo auto`` considers, at world size p
    (in registry order; an entry without ``candidates`` is never chosen automatically)."""
    for name, entry in ALGORITHMS.items():
        if entry.cost is not None and entry.cost.candidates is not None:
            for dims, variant in entry.cost.candidates(p):
                yield name, dims, variant


def rank_algorithms(n: int, m: int, widths: Sequence[int], world: int, kind: str = "gcn",
                    mem_cap: Optional[float] = None, machine: Optional[Machine] = None,
                    cut_fraction: Optional[float] = None, layers: Optional[int] = None,
                    structure: Optional[Structure] = None,
                    algos: Optional[Sequence[str]] = None) -> List[dict]:
    """Every (algorithm, grid, variant) at ``world`` ranks (of ``algos``, default all) with
    modelled bytes, messages, memory and epoch time, best first; rows over ``mem_cap`` bytes
    come last with ``fits`` False.

    With ``structure`` (the graph's Â and a partition into ``world`` parts) bytes and messages
    are the busiest rank's, padded, and time is :func:`predict`'s critical path; without it
    they are the average rank's estimate from n, m (and the cut fraction), for any world."""
    machine = machine or Machine()
    layers = len(widths) - 1 if layers is None else layers
    if structure is not None and structure.p != world:
        raise InputError(f"the partition has {structure.p} parts but the world size is {world}")
    rows = []
    for algo, dims, variant in candidates(world):
        if algos is not None and algo not in algos:
            continue
        t = estimate_traffic(n, m, world, algo, kind, widths, dims, variant, cut_fraction)
        mem = memory_bytes(n, m, world, algo, widths, t["recv_rows"], dims, layers)
        if structure is not None:
            t = predict(structure, algo, kind, widths, machine, dims, variant, layers)
            secs = t["time_s"]
        else:
            secs = epoch_time(t["bytes"], t["messages"], n, m, world, kind, widths, machine)
        grid = ("x".join(map(str, dims)) if isinstance(dims, tuple)
                else (f"{world // dims}x{dims}" if dims else str(world)))
        rows.append({"algo": algo, "grid": grid, "variant": variant, "replication":
                     dims if "replication" in ALGORITHMS[algo].flags else 1, "bytes": t["bytes"],
                     "messages": t["messages"], "memory": mem, "time_s": secs,
                     **{k: t[k] for k in ("bytes_mean", "compute_s", "comm_s") if k in t},
                     "fits": bool(mem_cap is None or mem <= mem_cap)})
    rows.sort(key=lambda r: (not r["fits"], r["time_s"]))
    return rows
