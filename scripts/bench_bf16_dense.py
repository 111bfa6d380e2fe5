#!/usr/bin/env python
"""bf16 dense products on this CPU: torch's bf16 GEMM against float32 GEMMs of the same bf16
values (gnnpar/nn/bf16_dense.py), as products and as whole ``--precision bf16`` training runs.

    python scripts/bench_bf16_dense.py --dataset rmat:scale=14,ef=8 --epochs 20 --rounds 3

Each round times, in alternating order: the probe's products (``bf16_dense.measure``, one
round each) and one serial GCN training run (gnnpar-train's defaults: 2 layers, hidden 64,
``--epochs``, one model seed) in bf16 with the choice pinned to ``bf16`` and to ``fp32``
(``GNNPAR_BF16_DENSE``), and the same run in fp32 for reference. Same graph, model, seed and
threads on every side; only the dense products differ. Prints each round with the 1-minute
load average, the medians, the final test accuracies, and one JSON line with the commit.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench_common import commit, load  # noqa: E402
from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.nn import bf16_dense  # noqa: E402
from gnnpar.nn.models import build_model  # noqa: E402
from gnnpar.training.serial import SerialRuntime  # noqa: E402
from gnnpar.training.trainer import TrainConfig, fit  # noqa: E402


def train(g, precision: str, epochs: int, choice: str) -> tuple:
    """Seconds and final test accuracy of one serial training run."""
    os.environ[bf16_dense.ENV] = choice
    torch.manual_seed(0)
    model = build_model("gcn", g.num_features, 64, g.num_classes, 2, 0.5)
    rt = SerialRuntime(g, model.norm, torch.device("cpu"))
    cfg = TrainConfig(epochs=epochs, precision=precision, eval_every=epochs)
    t = time.perf_counter()
    acc = fit(model, rt, cfg)[-1]["test_acc"]
    return time.perf_counter() - t, acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="rmat:scale=14,ef=8")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    g = load_dataset(a.dataset)
    sides = {"train_bf16_gemm": ("bf16", "bf16"), "train_fp32_gemms": ("bf16", "fp32"),
             "train_fp32_run": ("fp32", "bf16")}
    times = {k: [] for k in sides}
    accs = {}
    probes = []
    train(g, "bf16", 1, "fp32")  # warm-up: the kernels' first load
    print(f"commit {commit()}, {a.dataset}, {torch.get_num_threads()} threads, "
          f"load {load():.2f}")
    for r in range(a.rounds):
        probes.append(bf16_dense.measure(rounds=1))
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            precision, choice = sides[name]
            t, accs[name] = train(g, precision, a.epochs, choice)
            times[name].append(t)
        print(f"round {r}: " + ", ".join(f"{k} {times[k][-1]:.2f} s" for k in sides)
              + f"; load {load():.2f}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("probe products (bf16 GEMM s, float32 GEMMs s): "
          + "; ".join(f"{shape} " + ", ".join(f"{p[shape][0] * 1e3:.1f}/{p[shape][1] * 1e3:.1f}"
                                              " ms" for p in probes) for shape in probes[0]))
    for k in sides:
        print(f"{k:18s} median {med[k]:.2f} s  test_acc {accs[k]:.4f}")
    print(f"train_fp32_gemms / train_bf16_gemm = "
          f"{med['train_fp32_gemms'] / med['train_bf16_gemm']:.3f}")
    print(json.dumps({"commit": commit(), "dataset": a.dataset, "epochs": a.epochs,
                      "threads": torch.get_num_threads(), "times_s": times, "test_acc": accs,
                      "probes": probes, "load_end": load()}))


if __name__ == "__main__":
    main()
