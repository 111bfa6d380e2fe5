#!/usr/bin/env python
"""Whole-graph inference on one process: gnnpar against the same model written in PyG, and
against one gnnpar training step, side by side in one run.

    python scripts/bench_predict.py --dataset rmat:scale=18,ef=16 --threads 2 --rounds 5

One GCN (``--layers``, ``--hidden``; gnnpar-train's defaults) with one set of weights, the
graph in the dataset's own order for every variant, the same torch threads. Each round runs
every variant once in turn (after one untimed warm-up call each), so load from other
processes hits all of them alike; a variant's figure is the median over rounds, printed with
each round's time and the 1-minute load average. Variants:

- ``gnnpar``: :func:`gnnpar.infer.inference.forward_rows` — the forward pass ``gnnpar-predict``
  runs without ``--batch-size`` (``torch.inference_mode``, evaluation mode), each layer's
  product with Â at the narrower of its widths (:class:`gnnpar.nn.models.GCNLayer`);
- ``gnnpar_fresh``: the same on a runtime that makes its SpMM outputs anew on every call, as
  the first (and, in ``gnnpar-predict``, only) pass does; ``gnnpar`` reuses them from one
  call to the next, as the serial runtime does for every training and evaluation pass, while
  PyG allocates its outputs on each call: this row gives both sides the same allocation;
- ``gnnpar_degree``: the same on the graph renumbered by degree (hubs first), the order
  ``gnnpar-predict`` loads a graph in on one process (``--reorder auto``): the same products
  on another vertex order, so **not** the like-for-like row; shown for what a user runs;
- ``gnnpar_layerwise``: :func:`gnnpar.infer.inference.layerwise` in chunks of ``--batch-size``
  rows (``gnnpar-predict --batch-size``): the same products, plus each chunk's gather of its
  neighbourhood's rows;
- ``pyg``: PyG ``GCNConv(cached=True, normalize=False)`` layers with gnnpar's weights on a
  torch sparse CSR ``adj_t`` of the same Â, ReLU between, under ``torch.inference_mode`` in
  evaluation mode (PyG's examples' ``model.inference`` on a graph that fits). ``GCNConv``
  multiplies by W before it aggregates, so each product with Â is at the layer's output
  width: where that is wider than the input (the first layer when ``--hidden`` exceeds the
  features) PyG does more sparse work than gnnpar; the widths are printed;
- ``pyg_aggr_first``: the same PyG operator (``torch_geometric.utils.spmm``) in gnnpar's
  order, Â·H before the Linear where the input is narrower: the same operation count as
  gnnpar's;
- ``products``: the dense and sparse products of ``gnnpar``'s forward pass alone, in its
  order, into outputs allocated once (no bias, ReLU or allocation): the floor any
  implementation of the same products pays on this machine (``products/pyg`` bounds the
  ratio ``gnnpar/pyg`` can reach without a faster product);
- ``train_step``: one gnnpar training step on the same graph and model (forward, backward,
  Adam; :func:`gnnpar.training.trainer.train_step`; a runtime of its own, as inference's product
  outputs are made under ``inference_mode``), the unit of "one training epoch" (an epoch of
  ``gnnpar-train`` adds an evaluation forward to it).

The outputs of ``gnnpar_fresh``, ``gnnpar_layerwise``, ``pyg`` and ``pyg_aggr_first`` are
checked against ``gnnpar``'s (relative difference printed). Prints a table, the ratios
gnnpar / pyg and gnnpar / train_step, and one JSON line with every figure, the commit and
the load averages.
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

from bench_common import commit  # noqa: E402
from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.datasets.normalize import propagation_matrix  # noqa: E402
from gnnpar.datasets.reorder import reorder  # noqa: E402
from gnnpar.infer.inference import forward_rows, layerwise  # noqa: E402
from gnnpar.kernels.cpu_spmm import csr_mm  # noqa: E402
from gnnpar.nn.models import GNN  # noqa: E402
from gnnpar.nn.product_order import aggregate_first_op  # noqa: E402
from gnnpar.training.serial import SerialRuntime  # noqa: E402
from gnnpar.training.trainer import TrainConfig, make_optimizer, train_step  # noqa: E402



def pyg_variants(model: GNN, indptr, indices, values, n):
    """PyG's forward passes of ``model``'s weights: GCNConv (weights first) and PyG's spmm in
    gnnpar's order; each a function of x."""
    from torch_geometric.nn import GCNConv
    from torch_geometric.utils import spmm
    adj_t = torch.sparse_csr_tensor(torch.as_tensor(indptr), torch.as_tensor(indices),
                                    torch.as_tensor(values), (n, n))
    convs = []
    for layer in model.layers:
        conv = GCNConv(layer.lin.in_features, layer.lin.out_features, cached=True,
                       normalize=False)
        conv.lin.weight.data.copy_(layer.lin.weight.data)
        conv.bias.data.copy_(layer.bias.data)
        convs.append(conv.eval())

    def weights_first(x):
        for i, conv in enumerate(convs):
            x = conv(x, adj_t)
            x = x.relu() if i < len(convs) - 1 else x
        return x

    def aggregate_first(x):
        for i, conv in enumerate(convs):
            if conv.in_channels < conv.out_channels:
                x = conv.lin(spmm(adj_t, x)) + conv.bias
            else:
                x = spmm(adj_t, conv.lin(x)) + conv.bias
            x = x.relu() if i < len(convs) - 1 else x
        return x
    return weights_first, aggregate_first


def products_only(model: GNN, op):
    """The products of ``model``'s forward on ``op`` (a serial runtime's Â) alone, in
    :class:`~gnnpar.nn.models.GCNLayer`'s order, each into an output made on the first call and
    reused; a function of x."""
    outs = {}

    def into(key, shape):
        if key not in outs:
            outs[key] = torch.empty(shape)
        return outs[key]

    def run(x):
        h = x
        with torch.inference_mode():
            for i, layer in enumerate(model.layers):
                w = layer.lin.weight
                n, (f_out, f_in) = op.num_dst, w.shape
                if aggregate_first_op(op, f_in, f_out):
                    a = csr_mm(op.A, h, into((i, 0), (n, f_in)))
                    h = torch.mm(a, w.t(), out=into((i, 1), (n, f_out)))
                else:
                    t = torch.mm(h, w.t(), out=into((i, 0), (h.shape[0], f_out)))
                    h = csr_mm(op.A, t, into((i, 1), (n, f_out)))
        return h
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="rmat:scale=18,ef=16")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=65536)
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    g = load_dataset(args.dataset, cache_dir=args.cache_dir)
    print(g.summary(), file=sys.stderr)
    torch.manual_seed(0)
    model = GNN("gcn", g.num_features, args.hidden, g.num_classes, args.layers, 0.5)
    rt = SerialRuntime(g, model.norm)
    structure = propagation_matrix(g, model.norm)
    weights_first, aggregate_first = pyg_variants(model, *structure, g.num_nodes)
    opt = make_optimizer(model, TrainConfig())
    train_count = float(rt.masks["train"].sum())
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def infer_pyg(fn):
        with torch.inference_mode():
            return fn(rt.x)

    def step():
        train_step(model, opt, rt, train_count)
        model.load_state_dict(state)  # every variant sees the same weights
    # inference's own runtime: its reused product outputs are made under inference_mode,
    # which training's autograd may not write into
    rt_infer = SerialRuntime(g, model.norm)
    rt_fresh = SerialRuntime(g, model.norm)
    rt_fresh.op.fwd_buffers = rt_fresh.op.bwd_buffers = None  # every output made anew
    rt_degree = SerialRuntime(reorder(g, "degree"), model.norm)
    products = products_only(model, rt_infer.op)
    variants = {
        "gnnpar": lambda: forward_rows(model, rt_infer)[0],
        "gnnpar_fresh": lambda: forward_rows(model, rt_fresh)[0],
        "gnnpar_degree": lambda: forward_rows(model, rt_degree)[0],
        "gnnpar_layerwise": lambda: layerwise(model, structure, rt.x, args.batch_size)[0],
        "pyg": lambda: infer_pyg(weights_first),
        "pyg_aggr_first": lambda: infer_pyg(aggregate_first),
        "products": lambda: products(rt.x),
        "train_step": step,
    }
    ref = variants["gnnpar"]()
    checks = {}
    for name in ("gnnpar_fresh", "gnnpar_layerwise", "pyg", "pyg_aggr_first"):
        out = variants[name]()
        checks[name] = float((out - ref).abs().max() / ref.abs().max())
    variants["train_step"]()  # warm-up
    times = {name: [] for name in variants}
    loads = []
    for r in range(args.rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        loads.append(os.getloadavg()[0])
        print(f"round {r}: " + " ".join(f"{k}={v[-1] * 1e3:.1f}ms" for k, v in times.items())
              + f" load={loads[-1]:.2f}", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    widths = [(layer.lin.in_features, layer.lin.out_features) for layer in model.layers]
    print(f"\n{args.dataset}, GCN {widths}, {args.threads} threads, {args.rounds} rounds, "
          f"commit {commit()}, load {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print(f"{'variant':18s} {'median ms':>10s}  rounds (ms)")
    for k, v in times.items():
        print(f"{k:18s} {med[k] * 1e3:10.1f}  " + " ".join(f"{t * 1e3:.1f}" for t in v))
    ratios = {"gnnpar/pyg": med["gnnpar"] / med["pyg"],
              "gnnpar_fresh/pyg": med["gnnpar_fresh"] / med["pyg"],
              "gnnpar/pyg_aggr_first": med["gnnpar"] / med["pyg_aggr_first"],
              "gnnpar_degree/pyg": med["gnnpar_degree"] / med["pyg"],
              "products/pyg": med["products"] / med["pyg"],
              "gnnpar/train_step": med["gnnpar"] / med["train_step"],
              "gnnpar_layerwise/train_step": med["gnnpar_layerwise"] / med["train_step"]}
    for k, v in ratios.items():
        print(f"{k:28s} {v:.3f}")
    print("max relative difference to gnnpar's logits: "
          + " ".join(f"{k}={v:.2e}" for k, v in checks.items()))
    print(json.dumps({"dataset": args.dataset, "widths": widths, "threads": args.threads,
                      "batch_size": args.batch_size, "commit": commit(),
                      "median_s": med, "times_s": times, "ratios": ratios, "checks": checks,
                      "load_start": load0, "loads": loads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
