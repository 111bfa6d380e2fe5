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
:func:`spmm_widths`). A GAT layer (``kind`` ``"gat:H"``) makes no product: its edge-valued
operations gather and reduce rows over the operator's axes, H and z wide
(:mod:`~gnnpar.kernels.cost_attention`, each algorithm's ``Cost.moves``).
Evaluation passes (phase ``eval``) are not part of an epoch.

**The run's own blocks and wire.** :func:`predict` and :func:`rank_algorithms` model what
``gnnpar-train`` builds, not a second idea of it: the algorithm's own option rule (its registry
entry's, the call :mod:`gnnpar.training.rank` makes) turns the run's settings into builder options
(:func:`run_options`), and :func:`~gnnpar.kernels.blocks.layout_owner`, the code the builders
lay their blocks out with, turns the partition into the ownership the blocks are built on —
the seeded balanced layout for 2d/3d/4d under ``--block-layout balanced``, the partition for
the others (:func:`run_structure`). :func:`wire_bytes` sizes the exchanged features
(``--comm-dtype``, ``--precision bf16``), :func:`score_wire_bytes` a GAT's heads-wide
exchanges (float32 under ``--precision bf16``); the weights' gradient all-reduce and 3d's Â
pieces stay as they are. The logical busiest-rank bytes (``comm_bytes_max_rank``) are then exactly
what the run logs under that name (``tests/test_cost_exact.py``).

**The critical path.** An epoch runs at the pace of its busiest rank: every collective waits
for its slowest member. So the ranking uses, per candidate, the *busiest* rank's *padded*
bytes (``all_gather``/``reduce_scatter`` pad every member's chunk to the group's largest, see
:mod:`gnnpar.kernels.comm`) and messages, and the busiest rank's compute. With the graph's
structure and a partition (``structure=`` in :func:`rank_algorithms`, ``gnnpar-plan
--partitioner``) these are exact per-rank figures and their maximum; with n and m alone the
estimate is the average rank of even blocks, whose busiest rank is the average one.

Time model (:class:`Machine`, every field settable, or calibrated on the machine at hand by
``gnnpar-plan --calibrate``, :mod:`gnnpar.cli.calibrate`): epoch seconds ≈
max over ranks of (SpMM multiply-adds × 2 / ``spmm_rate`` + dense flops / ``dense_rate`` +
owned rows × Σ widths / ``elementwise_rate``) + max over ranks of (``latency`` × messages +
padded bytes / ``bandwidth``) + the fixed cost ``step_overhead`` + layers ×
``layer_overhead``, no overlap assumed. The elementwise term is everything else an epoch does
per row and feature (bias, activation, dropout, loss, their backward, zeroing gradients): on a
CPU it is most of a small model's epoch. The fixed cost is what an epoch costs whatever its
size, the same on every rank: Python, building and walking the autograd graph, launching
kernels, the optimiser's step (a collective's own launch is in ``latency``, which is measured
as a one-message collective through :class:`~gnnpar.kernels.comm.Comm`). Defaults
(documented in the fields) are a 2020s GPU cluster: 25 GB/s per rank, 5 µs per message, 2e11
sparse and 5e13 dense flop/s, 1e11 row-features/s, 1 ms a step and 0.3 ms a layer.

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
import torch

from gnnpar.datasets import InputError

from .algorithms import ALGORITHMS, cost_names, get
from .blocks import layout_owner
from .comm import WIRE_DTYPES
from .cost_attention import estimated_moves, exact_moves
from .cost_terms import (F32, Cost, Sizes, Structure, allreduce_bytes, coll, gat_heads, gat_kind,
                         gat_z_width, layer_exchanges, no_padding, owned_rows_work, param_count,
                         spmm_widths)

__all__ = ["Structure", "Machine", "spmm_widths", "param_count", "allreduce_bytes",
           "epoch_traffic", "estimate_traffic", "memory_bytes", "epoch_time", "candidates",
           "rank_algorithms", "epoch_work", "predict", "wire_bytes", "score_wire_bytes",
           "run_options", "run_structure"]


def _cost(algo: str) -> Cost:
    entry = get(algo)
    if entry.cost is None:
        raise InputError(f"--algo {algo} has no cost-model entry; the cost model and --algo "
                         f"auto know {', '.join(cost_names())}")
    return entry.cost


# ----------------------------------------------------------------- the run's own layout
def wire_bytes(settings=None) -> int:
    """Bytes an element of the SpMM exchanges' floating tensors travels at in a run with
    ``settings`` (``comm_dtype``, ``precision``; absent = gnnpar-train's defaults): the
    ``--comm-dtype`` when it is not fp32 (:data:`~gnnpar.kernels.comm.WIRE_DTYPES`), else
    the features' own dtype — bf16 under ``--precision bf16`` (autocast hands the SpMM bf16
    features) — else float32. The weights' gradient all-reduce, index plans and 3d's Â pieces
    keep their dtype whatever this is (:mod:`gnnpar.kernels.cost_terms`)."""
    wire = WIRE_DTYPES[getattr(settings, "comm_dtype", None) or "fp32"]
    if wire is None and (getattr(settings, "precision", None) or "fp32") == "bf16":
        wire = torch.bfloat16
    return F32 if wire is None else int(wire.itemsize)


def score_wire_bytes(settings=None) -> int:
    """Bytes an element of a GAT's heads-wide exchanges (its scores, the softmax's row maxima
    and sums, their gradients) travels at: the ``--comm-dtype`` when it is not fp32, else
    float32 — under ``--precision bf16`` too, where the scores are a bf16 z times a float32
    attention vector, which torch promotes to float32 (:mod:`gnnpar.nn.attention`)."""
    wire = WIRE_DTYPES[getattr(settings, "comm_dtype", None) or "fp32"]
    return F32 if wire is None else int(wire.itemsize)


class _Candidate:
    """The run's ``settings`` with one candidate's values in front (``variant``, ``layers``):
    what an algorithm's option rule reads when the cost model asks how the run would build it."""

    def __init__(self, settings, **values):
        self._settings, self._values = settings, values

    def __getattr__(self, name: str):
        if name in self._values:
            return self._values[name]
        return getattr(self._settings, name)


def run_options(algo: str, settings=None, variant: Optional[str] = "halo",
                layers: int = 0) -> dict:
    """The builder options ``gnnpar-train`` gives ``algo`` (its entry's option rule — the call
    :mod:`gnnpar.training.rank` makes —, full batch) for a run with ``settings`` (``block_layout``,
    ``seed``; absent = the defaults: the balanced block layout, seed 0), grid variant
    ``variant`` (None or ``"-"``: the builder's default) and ``layers`` layers."""
    variant = variant if variant in ("halo", "bcast") else None
    return get(algo).options(_Candidate(settings, variant=variant, layers=layers))


def run_structure(structure: Structure, options: dict) -> Structure:
    """``structure`` (Â and the run's partition) with the ownership the algorithm's blocks
    are built on under its builder ``options`` (:func:`run_options`): the balanced layout's
    or the partition's, by :func:`~gnnpar.kernels.blocks.layout_owner`, the code the builders
    lay their blocks out with."""
    owner = layout_owner(options, structure.owner, structure.p)
    if owner is structure.owner:
        return structure
    return Structure(structure.rows, structure.cols, owner, structure.p)


# ----------------------------------------------------------------- exact per-rank traffic
def epoch_traffic(structure: Structure, algo: str, kind: str, widths: Sequence[int], dims=None,
                  variant: str = "halo", layers: int = 0, rotate: bool = True,
                  wire: int = F32, score_wire: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Exact per-rank ``bytes`` (logical, as :attr:`Comm.bytes` counts them), ``padded``
    (what really moves, as :attr:`Comm.padded` counts it) and ``messages`` of one epoch
    (``dims``: (pr, pc) for 2d, c for 1.5d, (px, py, pz) for 3d/4d; ``layers``/``rotate`` as
    the 3d builder; ``wire``: bytes an element of the exchanged features, :func:`wire_bytes`;
    ``score_wire``: a GAT's heads-wide exchanges', :func:`score_wire_bytes`, default ``wire``).
    ``structure.owner`` is the ownership the blocks are built on (:func:`run_structure` turns
    a partition into the run's)."""
    p = structure.p
    # a low-precision reduce-scatter travels as an all-to-all: no padding (comm.py)
    reduce = wire >= F32
    heads = gat_heads(kind)
    if heads is not None:
        return _attention_traffic(structure, algo, heads, widths, dims, variant, layers, rotate,
                                  wire, wire if score_wire is None else score_wire)
    counts = _cost(algo).exact(structure, dims, variant, layers, rotate)
    pad_fwd, pad_bwd = _padding(algo)(structure, dims, variant, reduce=reduce)
    # counts whose padding is not rows × f (3d: feature slices and Â pieces) give it in bytes
    pad_bytes = getattr(counts, "padding_bytes", None)
    nbytes = np.zeros(p, np.int64)
    padded = np.zeros(p, np.int64)
    msgs = np.zeros(p, np.int64)
    for l, f, back in layer_exchanges(kind, widths):
        fb, fm, bb, bm = counts.spmm(f, l, wire)
        nbytes += fb + (bb if back else 0)
        if pad_bytes is not None:
            pf, pb = pad_bytes(f, l, wire, reduce)
            padded += pf + (pb if back else 0)
        else:
            padded += (pad_fwd + (pad_bwd if back else 0)) * f * wire
        msgs += fm + (bm if back else 0)
    P = param_count(kind, widths)
    nbytes += allreduce_bytes(P, p)
    msgs += 2 * coll(p)
    return {"bytes": nbytes, "padded": nbytes + padded, "messages": msgs}


def _attention_traffic(structure, algo, heads, widths, dims, variant, layers, rotate, wire,
                       score_wire) -> Dict[str, np.ndarray]:
    """:func:`epoch_traffic` of a GAT: each layer's moves (:mod:`.cost_attention`); a
    reduction pads unless its dtype is narrower than float32, so the heads-wide moves take
    their padding from moves of their own wire's rule."""
    moves, scores = (exact_moves(_cost(algo), structure, dims, variant, layers, rotate, w >= F32)
                     for w in (wire, score_wire))
    pairs = list(zip(widths[:-1], widths[1:]))
    nbytes = padded = msgs = np.zeros(structure.p, np.int64)
    for l, (_, fo) in enumerate(pairs):
        b, pd, k = moves(l).gat_layer(heads, gat_z_width(heads, fo, l == len(pairs) - 1), wire,
                                      score_wire, scores(l))
        nbytes, padded, msgs = nbytes + b, padded + pd, msgs + k
    nbytes = nbytes + allreduce_bytes(param_count(gat_kind(heads), widths), structure.p)
    msgs = msgs + 2 * coll(structure.p)
    return {"bytes": nbytes, "padded": nbytes + padded, "messages": msgs}


# ----------------------------------------------------------------- padding and work
def _padding(algo: str) -> Callable:
    """The algorithm's padding rule (its entry's ``Cost.padding``), else none (3d/4d count
    theirs in their exact counts' ``padding_bytes``, since it is not rows × f)."""
    return _cost(algo).padding or no_padding


def epoch_work(structure: Structure, algo: str, kind: str, widths: Sequence[int], dims=None,
               variant: str = "halo", layers: int = 0,
               rotate: bool = True) -> Dict[str, np.ndarray]:
    """Per-rank ``spmm_flops`` (2 × multiply-adds of every SpMM of an epoch, backward ones
    included), ``dense_flops`` (each rank's own rows through every layer's weights: forward,
    and the input and weight gradients) and ``elementwise`` (owned rows × Σ widths)."""
    work = (_cost(algo).work or owned_rows_work)(structure, dims, variant, layers, rotate)
    spmm = np.zeros(structure.p, np.float64)
    for l, f, back in layer_exchanges(kind, widths):
        spmm += 2.0 * work(f, l) * (2 if back else 1)
    dense = 6.0 * structure.sizes * _dense_per_row(kind, widths)
    return {"spmm_flops": spmm, "dense_flops": dense,
            "elementwise": structure.sizes * float(sum(widths))}


def _dense_per_row(kind: str, widths: Sequence[int]) -> float:
    """Multiply-adds per row of one forward pass through the layers' weights (GAT: into its
    z, :func:`layer_exchanges`)."""
    heads = gat_heads(kind)
    pairs = list(zip(widths[:-1], widths[1:]))
    if heads is not None:
        return float(sum(fi * gat_z_width(heads, fo, l == len(pairs) - 1)
                         for l, (fi, fo) in enumerate(pairs)))
    per = 2 if kind == "sage" else 1
    return float(sum(per * fi * fo for fi, fo in pairs))


# ----------------------------------------------------------------- estimates (no partition)
def estimate_traffic(n: int, m: int, p: int, algo: str, kind: str, widths: Sequence[int],
                     dims=None, variant: str = "halo", cut_fraction: Optional[float] = None,
                     wire: int = F32, score_wire: Optional[int] = None) -> Dict[str, float]:
    """Average-rank ``bytes``, ``messages`` per epoch and ``recv_rows`` (rows of H a rank holds
    beyond its own, for memory) from n, m and the share of non-zeros with a remote column
    (``wire``, ``score_wire`` as :func:`epoch_traffic`)."""
    sizes = Sizes.of(n, m, p, cut_fraction)
    spmm = _cost(algo).estimate(sizes, dims, variant)
    nbytes = msgs = 0.0
    recv_rows = 0.0
    for f, back in spmm_widths(kind, widths):
        b, k, rows = spmm(f, back, wire)
        recv_rows = max(recv_rows, rows)
        nbytes += b
        msgs += k
    heads = gat_heads(kind)
    if heads is not None:  # the attention layers' own moves, not products'
        mv = estimated_moves(_cost(algo), sizes, dims, variant)
        pairs = list(zip(widths[:-1], widths[1:]))
        layer = [mv.gat_layer(heads, gat_z_width(heads, fo, l == len(pairs) - 1), wire,
                              score_wire)
                 for l, (_, fo) in enumerate(pairs)]
        nbytes, msgs = float(sum(x[0] for x in layer)), float(sum(x[2] for x in layer))
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
    step_overhead: seconds of an epoch's fixed cost per rank, whatever its size and depth
      (Python, the loss, zeroing gradients, the optimiser's step; default 1e-3).
    layer_overhead: seconds of each layer's fixed cost per rank, forward and backward
      (autograd nodes, kernel launches, the operator's Python; default 3e-4).
    """

    bandwidth: float = 25e9
    latency: float = 5e-6
    spmm_rate: float = 2e11
    dense_rate: float = 5e13
    elementwise_rate: float = 1e11
    step_overhead: float = 1e-3
    layer_overhead: float = 3e-4

    #: fields a calibration file may leave out (they take their defaults) and may set to 0
    FIXED = ("step_overhead", "layer_overhead")

    def to_dict(self) -> dict:
        return asdict(self)

    def fixed_s(self, layers: int) -> float:
        """Seconds of an epoch of ``layers`` layers that do not depend on its size."""
        return self.step_overhead + layers * self.layer_overhead

    @classmethod
    def from_dict(cls, d: dict, where: str = "calibration") -> "Machine":
        """The figures of ``d`` (other keys — what the probe measured, on which host — are
        ignored); every rate and the latency must be there, finite and > 0; the fixed costs
        (:attr:`FIXED`), when there, finite and >= 0."""
        values = {}
        for f in fields(cls):
            v = d.get(f.name) if isinstance(d, dict) else None
            fixed = f.name in cls.FIXED
            if fixed and v is None:
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (
                    math.isfinite(v) and (v >= 0 if fixed else v > 0)):
                raise InputError(f"{where}: {f.name} must be a finite number "
                                 f"{'>= 0' if fixed else '> 0'}, got {v!r}")
            values[f.name] = float(v)
        return cls(**values)

    @classmethod
    def load(cls, path: str) -> "Machine":
        """A calibration file written by ``gnnpar-plan --calibrate``
        (:mod:`gnnpar.cli.calibrate`)."""
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
    """The average rank of even blocks (estimate mode): its compute plus its communication
    plus the fixed cost of an epoch."""
    spmm = sum(2 * (m / p) * f * (2 if back else 1) for f, back in spmm_widths(kind, widths))
    dense = 6 * (n / p) * _dense_per_row(kind, widths)
    return (msgs * machine.latency + nbytes / machine.bandwidth + spmm / machine.spmm_rate
            + dense / machine.dense_rate + (n / p) * sum(widths) / machine.elementwise_rate
            + machine.fixed_s(len(widths) - 1))


def predict(structure: Structure, algo: str, kind: str, widths: Sequence[int], machine: Machine,
            dims=None, variant: str = "halo", layers: int = 0, settings=None) -> dict:
    """One algorithm and grid of a ``gnnpar-train`` run on a given partition (``structure``:
    Â and the run's partition), modelled on the blocks the run builds: the algorithm's option
    rule on ``settings`` (``block_layout``, ``seed``, ``comm_dtype``, ``precision``: a
    :class:`~gnnpar.cli.spec.RunSpec`, the plan's flags; absent = gnnpar-train's defaults) lays Â
    out (:func:`run_options`, :func:`run_structure`) and :func:`wire_bytes` sizes the
    exchanges.

    Returns the busiest rank's padded bytes (``bytes``) and logical bytes
    (``comm_bytes_max_rank``, what the run logs under that name), the mean logical bytes, the
    busiest rank's messages, and the modelled epoch seconds (``time_s`` = ``compute_s`` +
    ``comm_s``, each the busiest rank's, + ``fixed_s``, :meth:`Machine.fixed_s`)."""
    options = run_options(algo, settings, variant, layers)
    s = run_structure(structure, options)
    wire = wire_bytes(settings)
    shape = (dims, options.get("variant", variant), options.get("layers", 0),
             options.get("rotate", True))
    t = epoch_traffic(s, algo, kind, widths, *shape, wire=wire,
                      score_wire=score_wire_bytes(settings))
    w = epoch_work(s, algo, kind, widths, *shape)
    comm = machine.latency * t["messages"] + t["padded"] / machine.bandwidth
    compute = (w["spmm_flops"] / machine.spmm_rate + w["dense_flops"] / machine.dense_rate
               + w["elementwise"] / machine.elementwise_rate)
    fixed = machine.fixed_s(len(widths) - 1)
    return {"bytes": int(t["padded"].max()), "comm_bytes_max_rank": int(t["bytes"].max()),
            "bytes_mean": float(t["bytes"].mean()),
            "messages": int(t["messages"].max()), "compute_s": float(compute.max()),
            "comm_s": float(comm.max()), "fixed_s": fixed,
            "time_s": float(compute.max() + comm.max() + fixed)}


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
                    algos: Optional[Sequence[str]] = None, settings=None) -> List[dict]:
    """Every (algorithm, grid, variant) at ``world`` ranks (of ``algos``, default all) with
    modelled bytes, messages, memory and epoch time, best first; rows over ``mem_cap`` bytes
    come last with ``fits`` False. ``settings``: the run's flags, as :func:`predict` reads
    them (the block layout and its seed, the wire format).

    With ``structure`` (the graph's Â and a partition into ``world`` parts) bytes and messages
    are the busiest rank's, padded (``comm_bytes_max_rank``: logical, as the run logs them),
    on the blocks the run builds, and time is :func:`predict`'s critical path; without it they
    are the average rank's estimate from n, m (and the cut fraction), for any world."""
    machine = machine or Machine()
    layers = len(widths) - 1 if layers is None else layers
    if structure is not None and structure.p != world:
        raise InputError(f"the partition has {structure.p} parts but the world size is {world}")
    wire = wire_bytes(settings)
    rows = []
    for algo, dims, variant in candidates(world):
        if algos is not None and algo not in algos:
            continue
        t = estimate_traffic(n, m, world, algo, kind, widths, dims, variant, cut_fraction,
                             wire, score_wire_bytes(settings))
        mem = memory_bytes(n, m, world, algo, widths, t["recv_rows"], dims, layers)
        if structure is not None:
            t = predict(structure, algo, kind, widths, machine, dims, variant, layers, settings)
            secs = t["time_s"]
        else:
            secs = epoch_time(t["bytes"], t["messages"], n, m, world, kind, widths, machine)
        grid = ("x".join(map(str, dims)) if isinstance(dims, tuple)
                else (f"{world // dims}x{dims}" if dims else str(world)))
        rows.append({"algo": algo, "grid": grid, "variant": variant, "replication":
                     dims if "replication" in ALGORITHMS[algo].flags else 1, "bytes": t["bytes"],
                     "messages": t["messages"], "memory": mem, "time_s": secs,
                     **{k: t[k] for k in ("comm_bytes_max_rank", "bytes_mean", "compute_s",
                                          "comm_s", "fixed_s") if k in t},
                     "fits": bool(mem_cap is None or mem <= mem_cap)})
    rows.sort(key=lambda r: (not r["fits"], r["time_s"]))
    return rows
