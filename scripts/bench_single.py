#!/usr/bin/env python
"""Single-process full-batch GCN epoch: gnnpar vs PyG, side by side on one graph.

    python scripts/bench_single.py --dataset rmat:scale=16,ef=16 --threads 2
    python scripts/bench_single.py --dataset rmat:scale=20,ef=16 --device cuda

An epoch is forward + backward + Adam step (3 layers, hidden 256 by default), timed as the
median of ``--repeats`` epochs after ``--warmup`` epochs. Variants:

- ``gnnpar``       — our serial trainer step (CSR SpMM with a stored transpose), fp32, with
  CUDA products on the default GPU kernel (``kernels/triton_spmm.py``'s ``DEFAULT``) and, on
  CUDA, bias + ReLU + dropout in one Triton pass (``kernels/triton_epilogue.py``), on the graph
  in the vertex order ``gnnpar-train`` uses for this run (``--reorder``; ``auto``: degree
  order, hubs first, as for any single-process full-batch run);
- ``--variants`` names more, each a dash-joined set of: ``fp32``/``bf16``/``tf32``
  (``--precision bf16``: bf16 dense layers and SpMM features, fp32 sums and master weights;
  ``tf32``: fp32 with the dense layers' products on TF32 tensor cores; ``gnnpar/precision.py``),
  ``triton``/``cusparse`` (the GPU SpMM kernel, by ``GNNPAR_SPMM_GPU``), ``unfused`` (torch's
  bias, ReLU and dropout ops: ``GNNPAR_EPILOGUE_GPU=torch``), ``natural`` (the dataset's own
  vertex order, as PyG gets it). ``auto``: fp32 and bf16, and on CUDA also the other GPU kernel,
  ``unfused``, ``natural`` and ``tf32``;
- ``pyg_adj_t``    — PyG ``GCNConv(cached=True)`` on a torch sparse CSR ``adj_t``, on the
  dataset's own order;
- ``pyg_adj_t_bf16`` — the same under ``torch.autocast(bfloat16)`` (CUDA; reported as failed
  where PyG's path refuses it), and ``pyg_adj_t_tf32`` with TF32 matmuls (CUDA; the
  like-for-like partner of gnnpar's ``tf32``);
- ``pyg_edge_index`` — PyG ``GCNConv(cached=True)`` on ``edge_index`` (scatter path).

Peak memory per variant: CUDA peak allocated bytes, or on CPU the peak RSS growth over the
variant (sampled every 2 ms). Prints a table and one JSON line with the ratios.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import threading
import time

import numpy as np
import psutil
import torch

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # run from a checkout without installing

from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.datasets.reorder import ORDERS, reorder  # noqa: E402
from gnnpar.kernels import triton_epilogue, triton_spmm  # noqa: E402
from gnnpar.models import GNN  # noqa: E402
from gnnpar.precision import PRECISIONS, matmuls  # noqa: E402
from gnnpar.serial import SerialRuntime  # noqa: E402
from gnnpar.trainer import train_step  # noqa: E402


class PeakRSS:
    """Peak resident-set growth while the context is open (CPU)."""

    def __enter__(self):
        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._watch, daemon=True)
        self.t.start()
        return self

    def _watch(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()
        self.bytes = self.peak - self.base


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_epochs(step, device, warmup, repeats):
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def pyg_model(f_in, hidden, f_out, layers, dropout):
    from torch_geometric.nn import GCNConv

    class PygGCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            widths = [f_in] + [hidden] * (layers - 1) + [f_out]
            self.convs = torch.nn.ModuleList(GCNConv(a, b, cached=True)
                                             for a, b in zip(widths[:-1], widths[1:]))

        def forward(self, x, adj):
            for i, conv in enumerate(self.convs):
                x = torch.nn.functional.dropout(x, dropout, self.training)
                x = conv(x, adj)
                if i < len(self.convs) - 1:
                    x = x.relu()
            return x

    return PygGCN()


def pyg_step(model, x, adj, y, mask, opt, precision="fp32"):
    def step():
        model.train()
        opt.zero_grad(set_to_none=True)
        with matmuls(precision):
            with (torch.autocast(x.device.type, dtype=torch.bfloat16) if precision == "bf16"
                  else contextlib.nullcontext()):
                out = model(x, adj)
            loss = torch.nn.functional.cross_entropy(out[mask].float(), y[mask])
            loss.backward()
        opt.step()
    return step


@contextlib.contextmanager
def environ(settings):
    """The environment variables ``settings`` (name -> value) for the block."""
    old = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


TOKENS = PRECISIONS + ("unfused", "natural") + triton_spmm.MODES


def gnnpar_variants(spec, device):
    """``--variants``' gnnpar entries: name -> (environment, precision, natural order)."""
    if spec == "auto":
        other = [m for m in triton_spmm.MODES if m != triton_spmm.DEFAULT]
        spec = "fp32,bf16" if device.type == "cpu" else ",".join(
            ["fp32", "bf16"] + [f"{m}{p}" for m in other for p in ("", "-bf16")]
            + ["unfused", "natural", "natural-bf16", "tf32"])
    out = {}
    for v in filter(None, spec.split(",")):
        tokens = v.split("-")
        unknown = [t for t in tokens if t not in TOKENS]
        kernels = [t for t in tokens if t in triton_spmm.MODES]
        precisions = [t for t in tokens if t in PRECISIONS]
        if unknown or len(kernels) > 1 or len(precisions) > 1:
            raise SystemExit(f"bench_single: unknown variant {v!r}: a dash-joined set of "
                             f"{', '.join(TOKENS)} (one precision, one kernel)")
        env = {triton_spmm.ENV: kernels[0]} if kernels else {}
        if "unfused" in tokens:
            env[triton_epilogue.ENV] = "torch"
        precision = precisions[0] if precisions else "fp32"
        name = "_".join(["gnnpar"] + [t for t in tokens if t != "fp32"])
        out[name] = (env, precision, "natural" in tokens)
    return out


def measure(name, make_step, device, args):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with PeakRSS() as rss:
        step = make_step()
        med, times = time_epochs(step, device, args.warmup, args.repeats)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else rss.bytes
    print(f"  {name:<22} {med:8.3f} s/epoch  (runs: {', '.join(f'{t:.3f}' for t in times)})",
          file=sys.stderr)
    return {"epoch_s": med, "peak_mem_bytes": int(peak)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default="rmat:scale=16,ef=16", help="dataset spec")
    p.add_argument("--layers", type=int, default=3, help="GCN layers")
    p.add_argument("--hidden", type=int, default=256, help="hidden width")
    p.add_argument("--dropout", type=float, default=0.5, help="dropout probability")
    p.add_argument("--warmup", type=int, default=2, help="untimed epochs first")
    p.add_argument("--repeats", type=int, default=5, help="timed epochs (median reported)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device")
    p.add_argument("--skip", default="", help="comma list of variants to skip")
    p.add_argument("--variants", default="auto",
                   help="gnnpar's variants: comma list, each a dash-joined set of fp32|bf16, "
                        "triton|cusparse, unfused, natural (module docstring; auto: fp32,bf16 "
                        "and on CUDA the other GPU kernel in both, unfused, natural)")
    p.add_argument("--reorder", default="auto", choices=("auto",) + ORDERS,
                   help="vertex order of gnnpar's variants (auto: degree, as gnnpar-train "
                        "for a single-process full-batch run); PyG gets the dataset's own")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    skip = set(filter(None, args.skip.split(",")))

    t = time.perf_counter()
    g = load_dataset(args.dataset)
    print(f"{g.summary()}  (loaded in {time.perf_counter() - t:.1f} s)", file=sys.stderr)
    f_in, f_out = g.num_features, g.num_classes
    x = torch.as_tensor(np.asarray(g.x, np.float32)).to(device)
    y = torch.as_tensor(np.asarray(g.y, np.int64)).to(device)
    mask = torch.as_tensor(np.asarray(g.train_mask)).to(device)
    results = {}
    order = "degree" if args.reorder == "auto" else args.reorder
    t = time.perf_counter()
    ordered = reorder(g, order)
    if order != "none":
        print(f"gnnpar's vertex order: {order} ({time.perf_counter() - t:.1f} s)",
              file=sys.stderr)

    for name, (env, precision, natural) in gnnpar_variants(args.variants, device).items():
        if name in skip:
            continue

        def ours():
            torch.manual_seed(0)
            model = GNN("gcn", f_in, args.hidden, f_out, args.layers, args.dropout).to(device)
            rt = SerialRuntime(g if natural else ordered, "gcn", device)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            count = float(rt.masks["train"].sum())
            return lambda: train_step(model, opt, rt, count, precision)
        with environ(env):
            results[name] = measure(name, ours, device, args)

    src, dst = g.edges()
    if "pyg_adj_t" not in skip:
        def pyg_adj(precision="fp32"):
            torch.manual_seed(0)
            model = pyg_model(f_in, args.hidden, f_out, args.layers, args.dropout).to(device)
            n = g.num_nodes
            # adj_t[i, j] != 0 means i aggregates from j: exactly our CSR rows
            adj_t = torch.sparse_csr_tensor(torch.as_tensor(np.asarray(g.indptr)),
                                            torch.as_tensor(np.asarray(g.indices)),
                                            torch.ones(g.num_edges), (n, n),
                                            check_invariants=False).to(device)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            return pyg_step(model, x, adj_t, y, mask, opt, precision)
        results["pyg_adj_t"] = measure("pyg_adj_t", pyg_adj, device, args)
        for precision in ("bf16", "tf32") if device.type == "cuda" else ():
            name = f"pyg_adj_t_{precision}"
            if name in skip:
                continue
            try:
                results[name] = measure(name, lambda: pyg_adj(precision), device, args)
            except Exception as e:  # noqa: BLE001 - PyG's path may refuse bf16: say so
                print(f"  {name:<22} failed: {type(e).__name__}: {e}"[:300], file=sys.stderr)

    if "pyg_edge_index" not in skip:
        def pyg_ei():
            torch.manual_seed(0)
            model = pyg_model(f_in, args.hidden, f_out, args.layers, args.dropout).to(device)
            ei = torch.stack([torch.as_tensor(src), torch.as_tensor(dst)]).to(device)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            return pyg_step(model, x, ei, y, mask, opt)
        results["pyg_edge_index"] = measure("pyg_edge_index", pyg_ei, device, args)

    print(f"\n{'variant':<22} {'s/epoch':>9} {'peak MiB':>10} {'vs gnnpar':>10}")
    base = results.get("gnnpar", {}).get("epoch_s")
    for name, r in results.items():
        ratio = f"{r['epoch_s'] / base:9.2f}x" if base else "-"
        print(f"{name:<22} {r['epoch_s']:9.3f} {r['peak_mem_bytes'] / 2**20:10.1f} {ratio:>10}")
    summary = {"dataset": args.dataset, "n": g.num_nodes, "m": g.num_edges, "reorder": order,
               "layers": args.layers, "hidden": args.hidden, "threads": args.threads,
               "device": args.device, **{k: v for k, v in results.items()}}
    for mine in [k for k in results if k.startswith("gnnpar")]:
        for other in ("pyg_adj_t", "pyg_adj_t_bf16", "pyg_adj_t_tf32", "pyg_edge_index"):
            if other in results:
                summary[f"{mine}_over_{other}"] = (results[mine]["epoch_s"]
                                                  / results[other]["epoch_s"])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
