#!/usr/bin/env python
"""Where a single-process full-batch GCN epoch spends its time, kernel by kernel.

    python scripts/profile_epoch.py --dataset rmat:scale=20,ef=16 --device cuda
    python scripts/profile_epoch.py --dataset rmat:scale=16,ef=16 --precision bf16 --threads 2
    GNNPAR_EPILOGUE_GPU=torch python scripts/profile_epoch.py --device cuda   # unfused epilogue

The step is ``scripts/bench_single.py``'s ``gnnpar`` variant (3-layer GCN, hidden 256, Adam, in
the vertex order ``gnnpar-train`` uses: degree order unless ``--reorder``). After
``--warmup`` epochs, ``--epochs`` epochs run under :mod:`torch.profiler`; printed are the
median epoch time of a separate timed run, the ``--top`` kernels (CUDA) or ops (CPU) by their
own time per epoch, and that time summed by kind: sparse products, dense products (GEMMs),
the bias/ReLU/dropout epilogue, reductions, and the rest. One JSON line at the end.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # run from a checkout without installing

from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.datasets.reorder import ORDERS, reorder  # noqa: E402
from gnnpar.models import GNN  # noqa: E402
from gnnpar.precision import PRECISIONS  # noqa: E402
from gnnpar.serial import SerialRuntime  # noqa: E402
from gnnpar.trainer import train_step  # noqa: E402

#: kind of a kernel or op, by the first pattern its name matches
KINDS = (("spmm", r"csrmm|cusparse|_row_split|LocalSpMM|addmm_out_sparse|sparse"),
         ("gemm", r"gemm|sgemm|xmma|cutlass|^aten::mm$|^aten::addmm$|matmul"),
         ("epilogue", r"_masked_scale|dropout|Dropout|threshold|relu|masked_scale"),
         ("reduce", r"reduce_kernel|^aten::sum$"))


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="rmat:scale=16,ef=16")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.add_argument("--reorder", default="degree", choices=ORDERS)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="profiled epochs")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    g = reorder(load_dataset(a.dataset), a.reorder)
    torch.manual_seed(0)
    model = GNN("gcn", g.num_features, a.hidden, g.num_classes, a.layers, 0.5).to(device)
    rt = SerialRuntime(g, "gcn", device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    count = float(rt.masks["train"].sum())

    def step():
        train_step(model, opt, rt, count, a.precision)

    for _ in range(a.warmup):
        step()
    sync(device)
    times = []
    for _ in range(max(a.epochs, 3)):
        t = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t)
    epoch_ms = statistics.median(times) * 1e3

    from torch.profiler import ProfilerActivity, profile
    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(a.epochs):
            step()
        sync(device)
    rows = []
    for e in prof.key_averages():
        own = (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
               if cuda else e.self_cpu_time_total)
        # on CUDA only kernels: a range (an autograd Function, the optimiser step) shows its
        # kernels' time too, under a name that also has host time
        if own > 0 and (not cuda or e.self_cpu_time_total == 0):
            rows.append((own / a.epochs / 1e3, e.count // a.epochs, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"{g.summary()}  {a.device} {a.precision}  epoch {epoch_ms:.2f} ms (median of "
          f"{len(times)}); profiled {'GPU' if cuda else 'CPU'} time {total:.2f} ms/epoch")
    print(f"{'ms/epoch':>9} {'calls':>6} {'kind':<9} name")
    for ms, calls, name in rows[:a.top]:
        print(f"{ms:9.3f} {calls:6d} {kind_of(name):<9} {name[:90]}")
    kinds = {}
    for ms, _, name in rows:
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + ms
    print("by kind: " + ", ".join(f"{k} {v:.2f} ms" for k, v in
                                  sorted(kinds.items(), key=lambda kv: -kv[1])))
    print(json.dumps({"dataset": a.dataset, "device": a.device, "precision": a.precision,
                      "reorder": a.reorder, "epoch_ms": epoch_ms, "profiled_ms": total,
                      "by_kind_ms": kinds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
