"""Calibrate the cost model's time figures on the machine at hand (``gnnpar-plan --calibrate``).

A probe of a few seconds measures the figures of :class:`~gnnpar.kernels.cost_model.Machine`
the way an epoch uses them:

- ``spmm_rate``: flop/s (2 × multiply-adds) of this project's local SpMM
  (:func:`gnnpar.kernels.cpu_spmm.csr_mm`) on a random sparse matrix with ~16 non-zeros a row;
- ``dense_rate``: flop/s of a dense ``(n × f) @ (f × f)`` product (the layers' weights);
- ``step_overhead`` and ``layer_overhead``: the fixed costs of an epoch — one-process
  training (:func:`gnnpar.training.trainer.fit` on :class:`gnnpar.training.serial.SerialRuntime`)
  of a graph so small that its epoch is nearly all Python, autograd and kernel launches, at 2
  and at 4 layers: a layer's cost is half the difference, the step's what is left of the
  2-layer epoch;
- ``elementwise_rate``: a few epochs of the same training on a small R-MAT graph; what the two
  rates above and the fixed costs do not explain of its fastest epoch, per owned row × Σ
  layer widths;
- ``latency`` and ``bandwidth``: two local ranks (:func:`gnnpar.launcher.spawn.spawn`, gloo)
  exchange by :meth:`gnnpar.kernels.comm.Comm.all_to_all` one small and one large message per rank;
  latency = the small exchange's seconds (one message each way), bandwidth = the large one's
  extra bytes over its extra seconds.

Each figure is the best of several repetitions after a warm-up (a shared machine only adds
time; the fastest repetition is the least disturbed one), with ``threads`` torch
threads per process (default 1: the one-thread-per-rank layout of a strong-scaling sweep; a
run with all cores in one process wants ``--threads`` = cores). The result is a JSON object
with the figures (read by :meth:`Machine.load`) and what was measured, where, when.
"""
from __future__ import annotations

import json
import os
import platform
import time
from typing import Callable, Optional

import numpy as np
import torch

from gnnpar.datasets import InputError, load_dataset
from gnnpar.datasets.owned import check_writable_folder
from gnnpar.kernels.comm import Comm
from gnnpar.kernels.cost_model import Machine, Structure, epoch_work
from gnnpar.kernels.cpu_spmm import csr_mm
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.kernels.local import csr_tensor

from gnnpar.nn.models import GNN
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn
from gnnpar.training.trainer import TrainConfig, fit

#: environment variable naming a calibration file where ``--calibration`` names none
CALIBRATION_ENV = "GNNPAR_CALIBRATION"
#: where ``--calibrate`` writes when ``--calibration`` names no file
DEFAULT_PATH = "gnnpar-calibration.json"


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` timed calls after a warm-up (allocations, thread pools,
    kernel compilation): other work on a shared machine only ever adds time."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def spmm_rate(rows: int = 1 << 15, degree: int = 16, f: int = 64, repeats: int = 5,
              seed: int = 0) -> float:
    """flop/s of :func:`csr_mm` on a random ``rows × rows`` matrix, ``degree`` non-zeros a row."""
    rng = np.random.default_rng(seed)
    indptr = np.arange(0, rows * degree + 1, degree, dtype=np.int64)
    indices = np.sort(rng.integers(0, rows, (rows, degree)), axis=1).reshape(-1)
    A = csr_tensor(indptr, indices, rng.random(rows * degree, dtype=np.float32), (rows, rows))
    h = torch.randn(rows, f)
    return 2.0 * rows * degree * f / _best_seconds(lambda: csr_mm(A, h), repeats)


def dense_rate(rows: int = 1 << 14, f: int = 128, repeats: int = 5) -> float:
    """flop/s of a ``(rows × f) @ (f × f)`` product."""
    x, w = torch.randn(rows, f), torch.randn(f, f)
    return 2.0 * rows * f * f / _best_seconds(lambda: x @ w, repeats)


def _fastest_epoch(g, hidden: int, layers: int, epochs: int) -> float:
    """The fastest epoch (after the warm-up, before the evaluating last one) of one-process
    GCN training of ``g``."""
    torch.manual_seed(0)
    model = GNN("gcn", g.num_features, hidden, g.num_classes, layers, 0.5)
    hist = fit(model, SerialRuntime(g, model.norm, "cpu"),
               TrainConfig(epochs=epochs, eval_every=10 ** 9))
    return min(r["epoch_s"] for r in (hist[1:-1] or hist))


def fixed_costs(scale: int = 4, hidden: int = 8, epochs: int = 12) -> dict:
    """``step_overhead`` and ``layer_overhead`` (seconds): epochs of ``rmat:scale=S,ef=8``
    (2^S vertices: the work is negligible) at 2 and 4 layers. A layer costs half the
    difference (at least 0), the step what is left of the 2-layer epoch (at least 0)."""
    g = load_dataset(f"rmat:scale={scale},ef=8")
    two, four = (_fastest_epoch(g, hidden, k, epochs) for k in (2, 4))
    layer = max((four - two) / 2, 0.0)
    return {"step_overhead": max(two - 2 * layer, 0.0), "layer_overhead": layer,
            "epoch_2_layers_s": two, "epoch_4_layers_s": four,
            "dataset": f"rmat:scale={scale},ef=8"}


def elementwise_rate(spmm: float, dense: float, scale: int = 12, hidden: int = 64,
                     layers: int = 3, epochs: int = 10, fixed_s: float = 0.0) -> dict:
    """Row-features/s of the rest of an epoch: one-process GCN training on
    ``rmat:scale=S,ef=8``; the fastest epoch minus the SpMM and dense time the rates ``spmm``
    and ``dense`` give it and the fixed cost ``fixed_s`` of its layers (at least a tenth of the
    epoch is left to the elementwise term, so the rate stays finite)."""
    g = load_dataset(f"rmat:scale={scale},ef=8")
    epoch = _fastest_epoch(g, hidden, layers, epochs)
    widths = [g.num_features] + [hidden] * (layers - 1) + [g.num_classes]
    w = epoch_work(Structure.from_graph(g, np.zeros(g.num_nodes, np.int64), 1), "1d", "gcn",
                   widths)
    rest = max(epoch - w["spmm_flops"][0] / spmm - w["dense_flops"][0] / dense - fixed_s,
               epoch / 10)
    return {"elementwise_rate": float(w["elementwise"][0]) / rest, "epoch_s": epoch,
            "rest_s": rest, "dataset": f"rmat:scale={scale},ef=8", "widths": widths}


def _exchange_seconds(comm: Comm, numel: int, repeats: int) -> float:
    send = torch.ones(2 * numel)
    return _best_seconds(lambda: comm.all_to_all(send, [numel, numel], [numel, numel], "row"),
                           repeats)


def comm_probe(rank: int, world: int, small: int, large: int, repeats: int) -> dict:
    """Rank body: seconds of a small and a large 2-rank all-to-all (each rank sends one
    message of ``small`` / ``large`` float32 to the other)."""
    grid = ProcessGrid.create({"row": world}, world_size=world, rank=rank)
    comm = Comm(grid)
    with comm.in_phase("setup"):
        return {"small_s": _exchange_seconds(comm, small, repeats),
                "large_s": _exchange_seconds(comm, large, repeats)}


def link_rates(small: int = 1, large: int = 1 << 21, repeats: int = 9) -> dict:
    """``latency`` (s per message) and ``bandwidth`` (bytes/s a rank sends) between two local
    gloo ranks, one thread each."""
    out = spawn(comm_probe, 2, args=(small, large, repeats), threads=1, timeout_s=120)
    small_s = max(o["small_s"] for o in out)
    large_s = max(o["large_s"] for o in out)
    extra = 4.0 * (large - small)
    return {"latency": small_s, "bandwidth": extra / max(large_s - small_s, 1e-9),
            "small_s": small_s, "large_s": large_s, "large_bytes": 4 * large}


def calibrate(threads: int = 1, quick: bool = False) -> dict:
    """Run the probe; returns the calibration record (the :class:`Machine` figures and what
    was measured). ``quick``: smaller problems (tests)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        scale = 4 if quick else 1
        s = spmm_rate(rows=(1 << 15) // scale)
        d = dense_rate(rows=(1 << 14) // scale)
        fixed = fixed_costs(epochs=6 if quick else 12)
        layers = 3
        rest = elementwise_rate(s, d, scale=9 if quick else 12, layers=layers,
                                epochs=4 if quick else 10,
                                fixed_s=fixed["step_overhead"]
                                + layers * fixed["layer_overhead"])
    finally:
        torch.set_num_threads(old)
    link = link_rates(large=(1 << 21) // scale, repeats=5 if quick else 9)
    machine = Machine(bandwidth=link["bandwidth"], latency=link["latency"], spmm_rate=s,
                      dense_rate=d, elementwise_rate=rest["elementwise_rate"],
                      step_overhead=fixed["step_overhead"],
                      layer_overhead=fixed["layer_overhead"])
    return {**machine.to_dict(), "threads": threads, "host": platform.node(),
            "cpus": os.cpu_count(), "torch": torch.__version__,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "probe_s": round(time.perf_counter() - t0, 3), "link": link, "epoch": rest,
            "fixed": fixed}


def check_target(path: str) -> None:
    """Refuse to write the record over anything but an earlier calibration file (a user's
    file at that path is kept), into a folder, or where it cannot be written."""
    if os.path.isdir(path):
        raise InputError(f"--calibration {path} is a folder; give a file path")
    if os.path.exists(path):
        try:
            Machine.load(path)
        except InputError:
            raise InputError(f"--calibration {path} exists and is not a calibration file; "
                             "it is kept: give another path") from None
    check_writable_folder(os.path.dirname(os.path.abspath(path)), "--calibration",
                          f"--calibration {path}")


def save(record: dict, path: str) -> None:
    """Write the record whole or not at all (a temporary file renamed over ``path``)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            json.dump(record, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def machine_for(path: Optional[str]) -> Optional[Machine]:
    """The calibrated :class:`Machine` of ``path``, else of ``$GNNPAR_CALIBRATION``, else None."""
    path = path or os.environ.get(CALIBRATION_ENV) or None
    return Machine.load(path) if path else None
