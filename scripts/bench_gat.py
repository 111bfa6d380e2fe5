#!/usr/bin/env python
"""Single-process full-batch GAT training step: gnnpar vs PyG and DGL ``GATConv``, side by side.

    python scripts/bench_gat.py --dataset rmat:scale=15,ef=16 --threads 2
    python scripts/bench_single.py --model gat --dataset rmat:scale=20,ef=16 --device cuda

Both sides train the same model on the same graph in the same vertex order: ``--layers``
GAT layers, ``--heads`` heads of ``--width`` features each in the hidden layers
(concatenated), the output layer averaging ``--heads`` heads, LeakyReLU 0.2, ELU between
layers, dropout ``--dropout`` on every layer's input and on the attention coefficients,
self loops (gnnpar: the edges of A' + I; PyG: ``add_self_loops=True`` on the same graph),
Adam (lr 0.005, weight decay 5e-4), the loss over the training nodes. A step is forward +
backward + Adam step.

- ``gnnpar``: ``GNN("gat", ...)`` on ``SerialRuntime(graph, "gcn")`` with the trainer's
  ``train_step`` (``gnnpar/nn/attention.py``, ``kernels/edge_ops.py``);
- ``pyg``: ``torch_geometric.nn.GATConv`` on ``edge_index`` (its scatter path; PyG's fused
  sparse path needs ``torch-sparse``, which does not install from PyPI alone);
- ``dgl``: DGL 2.1.0's ``dgl.nn.GATConv`` in the side venv of ``scripts/bench_dgl.sh --setup``
  (``--dgl-venv``; ``scripts/bench_dgl_side.py``'s ``gat``: the same model, on DGL's
  ``add_self_loop`` of the same graph, torch 2.2.1 there), one subprocess for the whole run,
  sent one request a round; its peak is its own process's resident-set growth. Without the
  venv the row says "not measured".

Each of ``--rounds`` rounds runs both in turn (a fresh model, ``--warmup`` untimed steps,
then ``--repeats`` timed), so load hits both alike; the figure is the median over rounds of
each round's median, with the peak RSS growth (sampled every 2 ms) and the 1-minute load
average. Prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # run from a checkout without installing

import bench_dgl  # noqa: E402  (first: it keeps the environment as the user gave it)
from bench_single import combine, measure  # noqa: E402
from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.nn.models import GNN  # noqa: E402
from gnnpar.training.serial import SerialRuntime  # noqa: E402
from gnnpar.training.trainer import TrainConfig, make_optimizer, train_step  # noqa: E402

LR, WEIGHT_DECAY = 0.005, 5e-4


def pyg_gat(f_in, width, heads, f_out, layers, dropout):
    from torch_geometric.nn import GATConv

    class GAT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            widths = [f_in] + [width * heads] * (layers - 1)
            self.convs = torch.nn.ModuleList(
                [GATConv(a, width, heads=heads, dropout=dropout) for a in widths[:-1]]
                + [GATConv(widths[-1], f_out, heads=heads, concat=False, dropout=dropout)])

        def forward(self, x, edge_index):
            h = x
            for i, conv in enumerate(self.convs):
                h = conv(F.dropout(h, dropout, self.training), edge_index)
                if i < len(self.convs) - 1:
                    h = F.elu(h)
            return h

    return GAT()


def dgl_round(dgl, args, round_) -> dict:
    """One round of the DGL side, in the shape of ``bench_single.measure``'s."""
    out = dgl(measure="gat", threads=args.threads, warmup=args.warmup, steps=args.repeats,
              layers=args.layers, heads=args.heads, width=args.width, dropout=args.dropout)
    load = os.getloadavg()[0]
    print(f"  round {round_}: {'dgl':<22} {out['step_s']:8.3f} s/epoch  load {load:.2f}  "
          f"(runs: {', '.join(f'{t:.3f}' for t in out['steps_s'])})", file=sys.stderr)
    return {"epoch_s": out["step_s"], "peak_mem_bytes": int(out["peak_growth_bytes"]),
            "load": load, "epochs_s": out["steps_s"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="rmat:scale=15,ef=16", help="dataset spec")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=64, help="features per head (hidden layers)")
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="gnnpar's and PyG's device (DGL's side runs on the CPU only)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip", default="", help="comma list of sides to skip (gnnpar, pyg, dgl)")
    p.add_argument("--dgl-venv", default=bench_dgl.DEFAULT_VENV,
                   help="the DGL side venv (default: $GNNPAR_DGL_VENV or /tmp/gnnpar-dgl-venv)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    g = load_dataset(args.dataset)
    print(f"{g.summary()}; threads {args.threads}, load average {load0:.2f}", file=sys.stderr)
    device = torch.device(args.device)
    rt = SerialRuntime(g, "gcn", device)
    train = rt.masks["train"]
    idx = train.nonzero().view(-1)
    crow, col = rt.op.A.crow_indices(), rt.op.A.col_indices()
    rows = torch.repeat_interleave(torch.arange(g.num_nodes, device=device),
                                   crow[1:] - crow[:-1])
    keep = rows != col  # PyG adds the self loops itself
    edge_index = torch.stack([col[keep], rows[keep]])  # source -> target

    def ours():
        torch.manual_seed(0)
        model = GNN("gat", g.num_features, args.width * args.heads, g.num_classes,
                    args.layers, args.dropout, heads=args.heads).to(device)
        opt = make_optimizer(model, TrainConfig(lr=LR, weight_decay=WEIGHT_DECAY))
        count = float(train.sum())
        return lambda: train_step(model, opt, rt, count)

    def pyg():
        torch.manual_seed(0)
        model = pyg_gat(g.num_features, args.width, args.heads, g.num_classes, args.layers,
                        args.dropout).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        x, y = rt.x, rt.y

        def step():
            model.train()
            opt.zero_grad()
            loss = F.cross_entropy(model(x, edge_index).index_select(0, idx), y[idx])
            loss.backward()
            opt.step()
        return step

    skip = args.skip.split(",")
    sides = {k: v for k, v in (("gnnpar", ours), ("pyg", pyg)) if k not in skip}
    dgl = None
    if "dgl" not in skip and device.type != "cpu":
        print("dgl: not measured (its side venv runs on the CPU only)", file=sys.stderr)
    elif "dgl" not in skip:
        if os.path.exists(os.path.join(args.dgl_venv, "bin", "python")):
            tmp = tempfile.mkdtemp(prefix="bench-gat-")
            npz = os.path.join(tmp, "graph.npz")
            np.savez(npz, indptr=np.asarray(g.indptr, np.int64),
                     indices=np.asarray(g.indices, np.int64), x=np.asarray(g.x, np.float32),
                     y=np.asarray(g.y, np.int64), train_mask=np.asarray(g.train_mask, bool),
                     num_classes=g.num_classes)
            dgl = bench_dgl.DglSide(args.dgl_venv, npz, args.threads)
            os.remove(npz)
            os.rmdir(tmp)
        else:
            print(f"dgl: not measured (no side venv at {args.dgl_venv}; "
                  "bash scripts/bench_dgl.sh --setup)", file=sys.stderr)
    rounds = {k: [] for k in list(sides) + (["dgl"] if dgl else [])}
    for r in range(args.rounds):
        for name, make in sides.items():
            rounds[name].append(measure(name, make, device, args, r))
        if dgl:
            rounds["dgl"].append(dgl_round(dgl, args, r))
    if dgl:
        dgl.close()
    res = {k: combine(v) for k, v in rounds.items()}
    print("| side | step s | rounds | peak RSS growth MB | load |")
    print("|---|---|---|---|---|")
    for k, v in res.items():
        print(f"| {k} | {v['epoch_s']:.4f} | {' / '.join(f'{t:.4f}' for t in v['rounds_s'])} | "
              f"{v['peak_mem_bytes'] / 2**20:.0f} | {v['load']:.2f} |")
    for other, label in (("pyg", "PyG"), ("dgl", "DGL")):
        if "gnnpar" in res and other in res:
            ratio = res["gnnpar"]["epoch_s"] / res[other]["epoch_s"]
            print(f"gnnpar / {label} step time: {ratio:.2f}x; load average {load0:.2f} at "
                  f"start, {os.getloadavg()[0]:.2f} at end")
    print(json.dumps({"args": vars(args), "results": res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
