#!/usr/bin/env python
"""Full-batch link prediction (``gnnpar-train --task link``) against the same model written
with PyG: test AUC on a real graph, and the time of one training step.

    python scripts/planetoid_npz.py DIR cora cora.npz       # DIR: the Planetoid files
    python scripts/bench_link.py accuracy --npz cora.npz --seeds 0,1,2
    python scripts/bench_link.py speed --dataset rmat:scale=16,ef=16 --rounds 7

``accuracy``: for each seed, ``gnnpar-train --task link`` (the installed console script;
serial, 2-rank ``1d-halo`` and 2-rank ``2d``) and PyG: a 2-layer ``GCNConv`` encoder (input
dropout, ReLU and dropout between the layers, as gnnpar's GCN), the dot decoder, the mean
binary cross-entropy, Adam with a link run's default learning rate and weight decay (0), the
same epochs —
trained on **the same split** (the training graph and held-out pairs
:func:`gnnpar.training.shard_source.load_graph` makes for that seed, which the gnnpar run makes too)
with **the same negatives** (:func:`gnnpar.link.negatives.negatives` of each epoch), and
scored by the same AUC (:func:`gnnpar.link.metrics.auc`) on the same test pairs after the
last epoch. PyG's initial weights are its own (glorot), gnnpar's its own (torch's
``nn.Linear``): the comparison is of each framework as a user gets it, averaged over seeds.

``speed``: one training step (encode the whole training graph, score every training positive
and its negatives, backward, Adam) of gnnpar's serial runtime (:func:`gnnpar.link.loop.
link_step`, what ``gnnpar-train --task link`` runs on one process) and of the PyG model
(``GCNConv(cached=True, normalize=False)`` on a torch sparse CSR ``adj_t`` of the same Â, as
PyG's full-batch examples do), interleaved round by round after one untimed step each, the
same graph, split, negatives, widths and torch threads; medians, each round's times and the
1-minute load average printed, and one JSON line with the commit.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench_common import commit, load  # noqa: E402
from gnnpar.datasets.normalize import propagation_matrix  # noqa: E402
from gnnpar.link.decoders import DotDecoder, summed_link_loss  # noqa: E402
from gnnpar.link.loop import LocalPairs, link_modules, link_step  # noqa: E402
from gnnpar.link.metrics import auc  # noqa: E402
from gnnpar.link.negatives import negatives  # noqa: E402
from gnnpar.nn.models import build_model  # noqa: E402
from gnnpar.training.rows import fullbatch_runtime  # noqa: E402
from gnnpar.training.shard_source import load_graph  # noqa: E402
from gnnpar.cli.spec import RunSpec  # noqa: E402
from gnnpar.training.trainer import TrainConfig, default_weight_decay, make_optimizer  # noqa: E402




class PygEncoder(torch.nn.Module):
    """gnnpar's GCN written with PyG: dropout, GCNConv, ReLU, dropout, GCNConv."""

    def __init__(self, f_in: int, hidden: int, dropout: float, **conv):
        super().__init__()
        from torch_geometric.nn import GCNConv
        self.convs = torch.nn.ModuleList([GCNConv(f_in, hidden, **conv),
                                          GCNConv(hidden, hidden, **conv)])
        self.p = dropout

    def forward(self, x, edges):
        x = torch.nn.functional.dropout(x, self.p, self.training)
        x = self.convs[0](x, edges).relu()
        x = torch.nn.functional.dropout(x, self.p, self.training)
        return self.convs[1](x, edges)


def pyg_step(model, opt, x, edges, split, n, ratio, seed, epoch) -> float:
    """One PyG training step on gnnpar's positives and negatives of ``epoch``."""
    model.train()
    opt.zero_grad(set_to_none=True)
    pos = split.train_pos
    neg = negatives(pos, np.arange(pos.shape[1]), n, ratio, seed, epoch)
    z = model(x, edges)
    dec = DotDecoder()
    loss = summed_link_loss(dec(z[pos[0]], z[pos[1]]), dec(z[neg[0]], z[neg[1]]))
    loss = loss / float(pos.shape[1] + neg.shape[1])
    loss.backward()
    opt.step()
    return loss.item()


def graph_and_split(dataset: str, seed: int):
    """The training graph (held-out edges out) and the split gnnpar-train makes for ``seed``."""
    g = load_graph(RunSpec.of(task="link", dataset=dataset, seed=seed, reorder="none"))
    return g, g.meta["link_split"]


def edge_index(g) -> torch.Tensor:
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    return torch.as_tensor(np.stack([rows, np.asarray(g.indices)]), dtype=torch.int64)


def pyg_accuracy(dataset: str, seed: int, epochs: int, hidden: int, dropout: float,
                 ratio: int) -> float:
    g, split = graph_and_split(dataset, seed)
    torch.manual_seed(seed)
    cfg = TrainConfig(weight_decay=default_weight_decay("link"))  # gnnpar-train's link defaults
    model = PygEncoder(g.num_features, hidden, dropout)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    x, edges = torch.as_tensor(np.asarray(g.x)), edge_index(g)
    for epoch in range(epochs):
        pyg_step(model, opt, x, edges, split, g.num_nodes, ratio, seed, epoch)
    model.eval()
    with torch.no_grad():
        z = model(x, edges)
        score = lambda p: DotDecoder()(z[p[0]], z[p[1]]).double().numpy()  # noqa: E731
        return auc(score(split.test_pos), score(split.test_neg))


def gnnpar_accuracy(dataset: str, seed: int, epochs: int, hidden: int, dropout: float,
                    ratio: int, extra, folder: str) -> float:
    log = os.path.join(folder, f"log-{seed}-{len(extra)}-{'-'.join(extra)}.jsonl")
    beside = os.path.join(os.path.dirname(sys.executable), "gnnpar-train")  # this venv's
    cmd = [beside if os.path.exists(beside) else "gnnpar-train", "--task", "link",
           "--dataset", dataset, "--seed", str(seed),
           "--epochs", str(epochs), "--hidden", str(hidden), "--dropout", str(dropout),
           "--neg-ratio", str(ratio), "--log-json", log,
           "--quiet", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=folder)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
    return float(json.loads(open(log).read().splitlines()[-1])["test_auc"])


def accuracy(args) -> dict:
    dataset = f"npz:{os.path.abspath(args.npz)}"
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {"gnnpar": [], "gnnpar_1d-halo_2": [], "gnnpar_2d_2": [], "pyg": []}
    variants = {"gnnpar": [], "gnnpar_1d-halo_2": ["--algo", "1d-halo", "--nprocs", "2"],
                "gnnpar_2d_2": ["--algo", "2d", "--grid", "2x1", "--nprocs", "2"]}
    with tempfile.TemporaryDirectory() as folder:
        for seed in seeds:
            for name, extra in variants.items():
                runs[name].append(gnnpar_accuracy(dataset, seed, args.epochs, args.hidden,
                                                  args.dropout, args.neg_ratio, extra,
                                                  folder))
            runs["pyg"].append(pyg_accuracy(dataset, seed, args.epochs, args.hidden,
                                            args.dropout, args.neg_ratio))
            print(f"seed {seed}: " + " ".join(f"{k}={v[-1]:.4f}" for k, v in runs.items()),
                  flush=True)
    means = {k: statistics.mean(v) for k, v in runs.items()}
    print(f"\n{dataset}, 2-layer GCN (hidden {args.hidden}, dropout {args.dropout}), dot "
          f"decoder, neg-ratio {args.neg_ratio}, {args.epochs} epochs, seeds {args.seeds}, "
          f"commit {commit()}")
    print(f"{'run':<20}{'mean test AUC':>14}  per seed")
    for k, v in runs.items():
        print(f"{k:<20}{means[k]:>14.4f}  " + " ".join(f"{x:.4f}" for x in v))
    gaps = {"gnnpar-pyg": means["gnnpar"] - means["pyg"],
            "1d-halo_2-serial": means["gnnpar_1d-halo_2"] - means["gnnpar"],
            "2d_2-serial": means["gnnpar_2d_2"] - means["gnnpar"]}
    print("gaps (points): " + " ".join(f"{k}={100 * v:+.2f}" for k, v in gaps.items()))
    return {"runs": runs, "means": means, "gaps": gaps}


def speed(args) -> dict:
    torch.set_num_threads(args.threads)
    g, split = graph_and_split(args.dataset, args.seed)
    n = g.num_nodes
    cfg = TrainConfig(weight_decay=default_weight_decay("link"))
    spec = RunSpec.of(task="link", dataset=args.dataset, seed=args.seed, reorder="none")
    torch.manual_seed(args.seed)
    encoder = build_model("gcn", g.num_features, args.hidden, args.hidden, 2, args.dropout)
    decoder = DotDecoder()
    runtime = fullbatch_runtime(spec, 1, g, encoder.norm, torch.device("cpu"))
    opt = make_optimizer(link_modules(encoder, decoder), cfg)
    indptr, indices, values = propagation_matrix(g, "gcn")
    adj_t = torch.sparse_csr_tensor(torch.as_tensor(indptr), torch.as_tensor(indices),
                                    torch.as_tensor(values), (n, n))
    pyg = PygEncoder(g.num_features, args.hidden, args.dropout, cached=True, normalize=False)
    pyg_opt = torch.optim.Adam(pyg.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    x = torch.as_tensor(np.asarray(g.x))
    steps = {
        "gnnpar": lambda e: link_step(encoder, decoder, opt, runtime, LocalPairs(), split, n,
                                      args.neg_ratio, args.seed, e),
        "pyg": lambda e: pyg_step(pyg, pyg_opt, x, adj_t, split, n, args.neg_ratio,
                                  args.seed, e),
    }
    start = load()
    times = {k: [] for k in steps}
    loads = []
    for name, fn in steps.items():
        fn(0)  # untimed: first-call setup (PyG's cache, gnnpar's buffers)
    for r in range(args.rounds):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn(r + 1)
            times[name].append(time.perf_counter() - t0)
        loads.append(load())
        print(f"round {r}: " + " ".join(f"{k}={1000 * v[-1]:.1f}ms" for k, v in times.items())
              + f" load={loads[-1]:.2f}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{args.dataset}: n={n:,}, {split.train_pos.shape[1]:,} training positives x "
          f"(1 + {args.neg_ratio}), GCN {g.num_features}->{args.hidden}->{args.hidden}, "
          f"{args.threads} threads, {args.rounds} rounds, commit {commit()}, load "
          f"{start:.2f} at start, {min(loads):.2f}-{max(loads):.2f} during")
    for k, v in med.items():
        print(f"{k:<8} median {1000 * v:8.1f} ms")
    ratio = med["gnnpar"] / med["pyg"]
    print(f"gnnpar/pyg {ratio:.3f}")
    return {"median_s": med, "times_s": times, "ratio": ratio, "load_start": start,
            "loads": loads}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("accuracy", help="test AUC on an npz graph, gnnpar against PyG")
    a.add_argument("--npz", required=True, help="the graph (scripts/planetoid_npz.py)")
    a.add_argument("--seeds", default="0,1,2")
    a.add_argument("--epochs", type=int, default=100)
    s = sub.add_parser("speed", help="one training step, gnnpar against PyG")
    s.add_argument("--dataset", default="rmat:scale=16,ef=16")
    s.add_argument("--rounds", type=int, default=7)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--seed", type=int, default=0)
    for q in (a, s):
        q.add_argument("--hidden", type=int, default=64)
        q.add_argument("--dropout", type=float, default=0.5)
        q.add_argument("--neg-ratio", type=int, default=1)
    args = p.parse_args(argv)
    out = accuracy(args) if args.what == "accuracy" else speed(args)
    print(json.dumps({"what": args.what, "commit": commit(), **vars(args), **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
