#!/usr/bin/env python
"""A custom GNN (GIN) trained through ``gnnpar-train`` on every algorithm and in mini batch.

    python scripts/custom_gnn.py                     # every run of RUNS on a small SBM graph
    PYTHONPATH=scripts gnnpar-train --model custom_gnn:gin --algo 2d --nprocs 4 --grid 2x2

``gin(f_in, hidden, f_out, layers, dropout)`` is the factory ``--model custom_gnn:gin``
names (``gnnpar/nn/custom_model.py``): it returns a ``torch.nn.Module`` whose
``forward(ops, x)`` reads layer i's operator as ``ops[i]``. That is all a model needs to
know: ``ops`` is a ``gnnpar.interfaces.LayerOps`` whatever the run, one operator for every
layer (1d, 1d-halo, 1.5d, 2d), one a layer (3d, 4d, sampled mini-batch blocks). A layer
calls ``op(h)`` (Â·h with autograd, for this rank's rows) and ``op.num_dst`` (how many
leading rows of ``h`` are the destination nodes); ``norm = "sum"`` asks for the plain
adjacency (GIN's sum aggregation).

Each run is one ``python -m gnnpar.train`` command, printed before it runs with its final
loss and test accuracy after (3 epochs: a check that it trains, not a benchmark); the script
exits 1 if any fails.
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

#: the runs of ``python scripts/custom_gnn.py``: every full-batch algorithm and mini batch
RUNS = (
    ["--algo", "serial"],
    ["--algo", "1d", "--nprocs", "2"],
    ["--algo", "1d-halo", "--nprocs", "3"],
    ["--algo", "1.5d", "--nprocs", "4", "--replication", "2"],
    ["--algo", "2d", "--nprocs", "4", "--grid", "2x2"],
    ["--algo", "3d", "--nprocs", "2", "--grid", "1x1x2"],
    ["--algo", "4d", "--nprocs", "2", "--grid", "1x1x1x2"],
    ["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "32"],
    ["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "32", "--nprocs", "2"],
)


class GINLayer(torch.nn.Module):
    """h' = MLP((1 + eps)·h_dst + Σ_neighbours h)."""

    def __init__(self, f_in, f_out):
        super().__init__()
        self.eps = torch.nn.Parameter(torch.zeros(1))
        self.mlp = torch.nn.Sequential(torch.nn.Linear(f_in, f_out), torch.nn.ReLU(),
                                       torch.nn.Linear(f_out, f_out))

    def forward(self, op, h):
        # op(h) includes the self loop the union structure carries (weight 0 for "sum" unless
        # the graph has loops), so the root term is added explicitly
        return self.mlp(op(h) + (1 + self.eps) * h[:op.num_dst])


class GIN(torch.nn.Module):
    norm = "sum"

    def __init__(self, f_in, hidden, f_out, layers, dropout):
        super().__init__()
        widths = [f_in] + [hidden] * layers
        self.layers = torch.nn.ModuleList(GINLayer(a, b) for a, b in zip(widths, widths[1:]))
        self.out = torch.nn.Linear(hidden, f_out)
        self.dropout = dropout

    def forward(self, ops, x):
        h = x
        for i, layer in enumerate(self.layers):
            h = torch.relu(layer(ops[i], F.dropout(h, self.dropout, self.training)))
        return self.out(h)


def gin(f_in, hidden, f_out, layers, dropout):
    """The factory: ``--model custom_gnn:gin`` (with ``scripts/`` on PYTHONPATH)."""
    return GIN(f_in, hidden, f_out, layers, dropout)


def main() -> int:
    base = [sys.executable, "-m", "gnnpar.train", "--model", "custom_gnn:gin",
            "--dataset", "sbm:n=240,blocks=3,p_in=0.08,p_out=0.01", "--layers", "2",
            "--hidden", "16", "--epochs", "3", "--quiet"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH")) if p))
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, run in enumerate(RUNS):
            log = os.path.join(tmp, f"run{i}.jsonl")
            cmd = base + run
            print("$ PYTHONPATH=scripts python " + " ".join(cmd[1:]), flush=True)
            res = subprocess.run(cmd + ["--log-json", log], env=env, capture_output=True,
                                 text=True)
            if res.returncode:
                print(f"  exit {res.returncode}\n{res.stderr[-1500:]}", file=sys.stderr)
                failed.append(" ".join(run))
                continue
            final = json.loads(open(log).read().splitlines()[-1])
            print(f"  exit 0: loss {final['loss']:.4f}, test accuracy {final['test_acc']:.3f}")
    print(f"{len(RUNS) - len(failed)}/{len(RUNS)} runs trained" +
          (f"; failed: {'; '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
