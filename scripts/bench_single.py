#!/usr/bin/env python
"""Single-process full-batch GCN epoch: gnnpar vs PyG, side by side on one graph.

    python scripts/bench_single.py --dataset rmat:scale=16,ef=16 --threads 2
    python scripts/bench_single.py --dataset rmat:scale=20,ef=16 --device cuda
    python scripts/bench_single.py --model gat ...   # GAT: runs scripts/bench_gat.py

An epoch is forward + backward + Adam step (3 layers, hidden 256 by default). Each of
``--rounds`` rounds runs every variant in turn (a fresh model, ``--warmup`` untimed epochs,
then ``--repeats`` timed ones), so load from other processes hits all of them alike; a
variant's figure is the median over rounds of its round medians, shown with each round's
median and the 1-minute load average. Variants:

- ``gnnpar``       — our serial trainer step (CSR SpMM with a stored transpose), fp32, with
  CUDA products on the default GPU kernel (``kernels/triton_spmm.py``'s ``DEFAULT``) and, on
  CUDA, bias + ReLU + dropout in one Triton pass (``kernels/triton_epilogue.py``), on the graph
  in the vertex order ``gnnpar-train`` uses for this run (``--reorder``; ``auto``: degree
  order, hubs first, as for any single-process full-batch run). Each layer multiplies by Â at
  the narrower of its two widths (``gnnpar.nn.models.GCNLayer``): with 128 → 256 → 256 → classes
  that is Â·X (128 wide), Â·H (256) and Â·(H·W) (classes) forward, and two transposed products
  backward (256, classes; X needs no gradient): 5 sparse products an epoch;
- ``--variants`` names more, each a dash-joined set of: ``fp32``/``bf16``/``tf32``
  (``--precision bf16``: bf16 dense layers and SpMM features, fp32 sums and master weights;
  ``tf32``: fp32 with the dense layers' products on TF32 tensor cores; ``gnnpar/nn/precision.py``),
  ``triton``/``cusparse`` (the GPU SpMM kernel, by ``GNNPAR_SPMM_GPU``), ``unfused`` (torch's
  bias, ReLU and dropout ops: ``GNNPAR_EPILOGUE_GPU=torch``), ``natural`` (the dataset's own
  vertex order, as PyG gets it). ``auto``: fp32, natural and bf16, and on CUDA also the other
  GPU kernel, ``unfused``, ``natural-bf16`` and ``tf32``;
- ``pyg_adj_t``    — PyG ``GCNConv(cached=True)`` on a torch sparse CSR ``adj_t``, on the
  dataset's own order, the loss over ``out[train_mask]`` (boolean indexing: a host sync on
  CUDA), as PyG's examples write it. ``GCNConv`` multiplies by W before it aggregates, so
  every product with Â is at the layer's output width: 256, 256, classes forward and, since
  H·W needs its gradient in every layer, 256, 256, classes backward: 6 products, four of them
  256 wide;
- ``pyg_adj_t_idx`` — the same with the loss over precomputed integer train indices
  (``index_select``, no host sync): the loss as gnnpar computes it on CUDA;
- ``pyg_aggr_first`` — PyG's own operators in gnnpar's order: Â normalised once by PyG's
  ``gcn_norm`` (as ``GCNConv(cached=True)`` does), each layer ``spmm(Â, H)`` then the Linear
  where the input is the narrower (``torch_geometric.utils.spmm``, the product ``GCNConv``
  calls), else the Linear first: gnnpar's 5 products. Integer-index loss;
- ``pyg_adj_t_bf16`` — ``pyg_adj_t_idx`` under ``torch.autocast(bfloat16)`` (CUDA; reported
  as failed where PyG's path refuses it), and ``pyg_adj_t_tf32`` with TF32 matmuls (CUDA; the
  like-for-like partner of gnnpar's ``tf32``);
- ``pyg_edge_index`` — PyG ``GCNConv(cached=True)`` on ``edge_index`` (scatter path),
  integer-index loss.

The ratio PyG / gnnpar (fp32) is printed as a product of factors, each one change:
the loss (``pyg_adj_t`` / ``pyg_adj_t_idx``), the operation order (``pyg_adj_t_idx`` /
``pyg_aggr_first``: same kernels, one product fewer and two narrower), gnnpar's kernels and
step on the same order and vertex order (``pyg_aggr_first`` / ``gnnpar_natural``: the SpMM
kernel, the stored transpose in the backward, ReLU + dropout in one pass, the loss), and
gnnpar's vertex order (``gnnpar_natural`` / ``gnnpar``). A factor whose rows were skipped is
left out.

Peak memory per variant: CUDA peak allocated bytes, or on CPU the peak RSS growth over the
variant (sampled every 2 ms). Prints a table, the factors, the 1-minute load average at start
and end, and one JSON line with every figure.
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
from gnnpar.nn.models import GNN  # noqa: E402
from gnnpar.nn.precision import PRECISIONS, matmuls  # noqa: E402
from gnnpar.training.serial import SerialRuntime  # noqa: E402
from gnnpar.training.trainer import train_step  # noqa: E402


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


def pyg_model(f_in, hidden, f_out, layers, dropout, order="weights_first"):
    """PyG's GCN: ``GCNConv`` layers (``weights_first``, PyG's order), or the same maths in
    gnnpar's order with PyG's operators (``aggregate_first``)."""
    from torch_geometric.nn import GCNConv
    from torch_geometric.nn.conv.gcn_conv import gcn_norm
    from torch_geometric.utils import spmm

    widths = [f_in] + [hidden] * (layers - 1) + [f_out]

    class PygGCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList(GCNConv(a, b, cached=True)
                                             for a, b in zip(widths[:-1], widths[1:]))

        def forward(self, x, adj):
            for i, conv in enumerate(self.convs):
                x = torch.nn.functional.dropout(x, dropout, self.training)
                x = conv(x, adj)
                if i < len(self.convs) - 1:
                    x = x.relu()
            return x

    class AggregateFirstGCN(torch.nn.Module):
        """Z = Â·H·W + b with Â·H first where f_in <= f_out (gnnpar's ``GCNLayer``); Â from
        PyG's ``gcn_norm`` on the first call and kept, as ``GCNConv(cached=True)`` keeps it."""

        def __init__(self):
            super().__init__()
            self.lins = torch.nn.ModuleList(torch.nn.Linear(a, b, bias=False)
                                            for a, b in zip(widths[:-1], widths[1:]))
            self.biases = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(b))
                                                 for b in widths[1:])
            self._adj = None

        def forward(self, x, adj):
            if self._adj is None:
                self._adj = gcn_norm(adj, None, x.size(0), False, True, "source_to_target",
                                     x.dtype)[0]
            for i, (lin, b) in enumerate(zip(self.lins, self.biases)):
                x = torch.nn.functional.dropout(x, dropout, self.training)
                if lin.in_features <= lin.out_features:
                    x = lin(spmm(self._adj, x, reduce="sum"))
                else:
                    x = spmm(self._adj, lin(x), reduce="sum")
                x = x + b
                if i < len(self.lins) - 1:
                    x = x.relu()
            return x

    return {"weights_first": PygGCN, "aggregate_first": AggregateFirstGCN}[order]()


def pyg_step(model, x, adj, y, mask, opt, precision="fp32", loss_rows="mask"):
    """One PyG epoch. ``loss_rows``: ``mask`` takes the train rows by boolean indexing (a host
    sync on CUDA: the count of selected rows decides the result's shape), ``index`` by
    ``index_select`` with train indices computed once here (no sync)."""
    if loss_rows == "index":
        idx = torch.nonzero(mask).flatten()
        y_train = y.index_select(0, idx)

    def step():
        model.train()
        opt.zero_grad(set_to_none=True)
        with matmuls(precision):
            with (torch.autocast(x.device.type, dtype=torch.bfloat16) if precision == "bf16"
                  else contextlib.nullcontext()):
                out = model(x, adj)
            if loss_rows == "index":
                loss = torch.nn.functional.cross_entropy(out.index_select(0, idx).float(),
                                                         y_train)
            else:
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
        spec = "fp32,natural,bf16" if device.type == "cpu" else ",".join(
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


def measure(name, make_step, device, args, round_=0):
    """One round of one variant: a fresh model, ``--warmup`` epochs, then ``--repeats``."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with PeakRSS() as rss:
        step = make_step()
        med, times = time_epochs(step, device, args.warmup, args.repeats)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else rss.bytes
    load = os.getloadavg()[0]
    print(f"  round {round_}: {name:<22} {med:8.3f} s/epoch  load {load:.2f}  "
          f"(runs: {', '.join(f'{t:.3f}' for t in times)})", file=sys.stderr)
    return {"epoch_s": med, "peak_mem_bytes": int(peak), "load": load, "epochs_s": times}


def combine(rounds: list) -> dict:
    """A variant's rounds: the median of the round medians, the largest peak, the loads."""
    return {"epoch_s": statistics.median(r["epoch_s"] for r in rounds),
            "peak_mem_bytes": max(r["peak_mem_bytes"] for r in rounds),
            "load": statistics.median(r["load"] for r in rounds),
            "rounds_s": [r["epoch_s"] for r in rounds]}


def main():
    if "--model" in sys.argv[1:]:  # --model gat: the GAT comparison, scripts/bench_gat.py
        at = sys.argv.index("--model")
        model = sys.argv[at + 1] if at + 1 < len(sys.argv) else ""
        if model != "gcn":
            if model != "gat":
                sys.exit(f"bench_single.py: --model is gcn (this script) or gat "
                         f"(scripts/bench_gat.py), got {model!r}")
            gat = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_gat.py")
            rest = sys.argv[1:at] + sys.argv[at + 2:]
            os.execv(sys.executable, [sys.executable, gat] + rest)
        del sys.argv[at:at + 2]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default="rmat:scale=16,ef=16", help="dataset spec")
    p.add_argument("--layers", type=int, default=3, help="GCN layers")
    p.add_argument("--hidden", type=int, default=256, help="hidden width")
    p.add_argument("--dropout", type=float, default=0.5, help="dropout probability")
    p.add_argument("--warmup", type=int, default=2, help="untimed epochs first")
    p.add_argument("--repeats", type=int, default=5, help="timed epochs per round (median)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds; each runs every variant once, in turn (median of rounds)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device")
    p.add_argument("--skip", default="", help="comma list of variants to skip")
    p.add_argument("--variants", default="auto",
                   help="gnnpar's variants: comma list, each a dash-joined set of fp32|bf16, "
                        "triton|cusparse, unfused, natural (module docstring; auto: fp32, "
                        "natural, bf16 and on CUDA the other GPU kernel in both, unfused)")
    p.add_argument("--reorder", default="auto", choices=("auto",) + ORDERS,
                   help="vertex order of gnnpar's variants (auto: degree, as gnnpar-train "
                        "for a single-process full-batch run); PyG gets the dataset's own")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load0 = os.getloadavg()[0]
    skip = set(filter(None, args.skip.split(",")))

    t = time.perf_counter()
    g = load_dataset(args.dataset)
    print(f"{g.summary()}  (loaded in {time.perf_counter() - t:.1f} s)", file=sys.stderr)
    f_in, f_out = g.num_features, g.num_classes
    x = torch.as_tensor(np.asarray(g.x, np.float32)).to(device)
    y = torch.as_tensor(np.asarray(g.y, np.int64)).to(device)
    mask = torch.as_tensor(np.asarray(g.train_mask)).to(device)
    failed = set()
    order = "degree" if args.reorder == "auto" else args.reorder
    t = time.perf_counter()
    ordered = reorder(g, order)
    if order != "none":
        print(f"gnnpar's vertex order: {order} ({time.perf_counter() - t:.1f} s)",
              file=sys.stderr)

    variants = {}  # name -> (make a step, environment)
    for name, (env, precision, natural) in gnnpar_variants(args.variants, device).items():
        def ours(precision=precision, natural=natural):
            torch.manual_seed(0)
            model = GNN("gcn", f_in, args.hidden, f_out, args.layers, args.dropout).to(device)
            rt = SerialRuntime(g if natural else ordered, "gcn", device)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            count = float(rt.masks["train"].sum())
            return lambda: train_step(model, opt, rt, count, precision)
        variants[name] = (ours, env)

    src, dst = g.edges()
    n = g.num_nodes

    def pyg(order, loss_rows, precision="fp32", edge_index=False):
        def make():
            torch.manual_seed(0)
            model = pyg_model(f_in, args.hidden, f_out, args.layers, args.dropout,
                              order).to(device)
            if edge_index:
                adj = torch.stack([torch.as_tensor(src), torch.as_tensor(dst)]).to(device)
            else:  # adj_t[i, j] != 0 means i aggregates from j: exactly our CSR rows
                adj = torch.sparse_csr_tensor(torch.as_tensor(np.asarray(g.indptr)),
                                              torch.as_tensor(np.asarray(g.indices)),
                                              torch.ones(g.num_edges), (n, n),
                                              check_invariants=False).to(device)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            return pyg_step(model, x, adj, y, mask, opt, precision, loss_rows)
        return make

    pyg_rows = {"pyg_adj_t": pyg("weights_first", "mask"),
                "pyg_adj_t_idx": pyg("weights_first", "index"),
                "pyg_aggr_first": pyg("aggregate_first", "index")}
    if device.type == "cuda":  # PyG's path may refuse bf16: say so
        pyg_rows.update({f"pyg_adj_t_{p}": pyg("weights_first", "index", p)
                         for p in ("bf16", "tf32")})
    pyg_rows["pyg_edge_index"] = pyg("weights_first", "index", edge_index=True)
    variants.update({name: (make, {}) for name, make in pyg_rows.items()})
    runs = {}
    for r in range(args.rounds):
        for name, (make, env) in variants.items():
            if name in skip or name in failed:
                continue
            try:
                with environ(env):
                    runs.setdefault(name, []).append(measure(name, make, device, args, r))
            except Exception as e:  # noqa: BLE001 - PyG may refuse bf16: a line of the report
                if not name.endswith(("_bf16", "_tf32")) or not name.startswith("pyg"):
                    raise
                failed.add(name)
                print(f"  {name:<22} failed: {type(e).__name__}: {e}"[:300], file=sys.stderr)
    results = {name: combine(rounds) for name, rounds in runs.items()}

    print(f"\n{'variant':<22} {'s/epoch':>9} {'rounds':>22} {'peak MiB':>10} {'vs gnnpar':>10} "
          f"{'load':>6}")
    base = results.get("gnnpar", {}).get("epoch_s")
    for name, r in results.items():
        ratio = f"{r['epoch_s'] / base:9.2f}x" if base else "-"
        spread = "/".join(f"{v:.3f}" for v in r["rounds_s"])
        print(f"{name:<22} {r['epoch_s']:9.3f} {spread:>22} {r['peak_mem_bytes'] / 2**20:10.1f} "
              f"{ratio:>10} {r['load']:6.2f}")
    factors = ratio_factors(results)
    if factors:
        print("\nPyG / gnnpar epoch time (fp32), one change at a time:")
        for f in factors:
            print(f"  {f['what']:<72} {f['num']} / {f['den']} = {f['ratio']:.2f}")
    load1 = os.getloadavg()[0]
    print(f"load average {load0:.2f} at start, {load1:.2f} at end"
          + (f" (more than {os.cpu_count()} runnable: noisy)"
             if max(load0, load1) > (os.cpu_count() or 1) else ""))
    summary = {"dataset": args.dataset, "n": g.num_nodes, "m": g.num_edges, "reorder": order,
               "layers": args.layers, "hidden": args.hidden, "threads": args.threads,
               "device": args.device, "load_average": [load0, load1],
               **{k: v for k, v in results.items()}, "factors": factors}
    for mine in [k for k in results if k.startswith("gnnpar")]:
        for other in [k for k in results if k.startswith("pyg")]:
            summary[f"{mine}_over_{other}"] = (results[mine]["epoch_s"]
                                              / results[other]["epoch_s"])
    print(json.dumps(summary))


#: (what changes, numerator row, denominator row): their product is pyg_adj_t / gnnpar
FACTORS = (
    ("loss: boolean mask -> integer indices", "pyg_adj_t", "pyg_adj_t_idx"),
    ("operation order: weights first -> aggregate first (6 -> 5 products)", "pyg_adj_t_idx",
     "pyg_aggr_first"),
    ("kernels: PyG's ops -> gnnpar's step, same order, dataset's vertex order",
     "pyg_aggr_first", "gnnpar_natural"),
    ("vertex order: dataset's -> gnnpar's", "gnnpar_natural", "gnnpar"),
)


def ratio_factors(results) -> list:
    """The factors of :data:`FACTORS` whose two rows were measured."""
    return [{"what": what, "num": a, "den": b,
             "ratio": results[a]["epoch_s"] / results[b]["epoch_s"]}
            for what, a, b in FACTORS if a in results and b in results]

if __name__ == "__main__":
    main()
