#!/usr/bin/env python
"""Mini-batch link prediction: one ``gnnpar-train --task link --mode minibatch`` epoch
against DGL 2.1.0's ``as_edge_prediction_sampler`` loop, side by side on the same graph.

    bash scripts/bench_dgl.sh --setup                       # once: the side venv
    python scripts/bench_link_dgl.py --dataset rmat:scale=16,ef=16 --rounds 3 --epochs 3

Both sides train on **the same training graph and positives**: the link split
:func:`gnnpar.training.shard_source.load_graph` makes for ``--seed`` (the one ``gnnpar-train`` makes
for itself), exported to an npz the DGL side reads (``scripts/bench_dgl_side.py``,
``link_train``; the positives as the edge ids of one direction each). The model: GraphSAGE
(mean), ``len(--fanouts)`` layers, hidden and output width ``--hidden``, dropout 0.5, the dot
product of a pair's rows, the mean binary cross-entropy of every positive and its
``--neg-ratio`` uniform negatives, Adam (lr 0.01, no weight decay: a link run's defaults);
``--batch-size`` positives a step, every positive once an epoch, the same step count.

- gnnpar: the plain command a user would type (``python -m gnnpar.train --task link --mode
  minibatch --model sage ... --threads T``), one process per round; an epoch's time is its
  log's ``train_s`` (steps only; the sampler thread runs beside the trainer, as ever);
- DGL: its own loop in the side venv (``NeighborSampler`` + ``as_edge_prediction_sampler`` +
  ``DataLoader``, ``num_workers=0``; T threads for its sampling and torch ops).

What differs: gnnpar evaluates after each epoch (full-graph inference, not in ``train_s``),
and its sampler may prepare the next epoch's first macrobatches during that evaluation (at
most ``--prefetch`` × K minibatches; ``scripts/bench_dgl.py`` bounds that head start for node
training); DGL's negatives are drawn by its sampler, gnnpar's by its counter-based draw (the
same count and distribution, other pairs). Round r runs gnnpar, then DGL; each side's first
epoch of a round is a warm-up and its figure is the median of the others; the per-round
ratios, their median, the load average and the commit are printed, and one JSON line.
"""
from __future__ import annotations

import os

USER_ENV = dict(os.environ)  # before gnnpar's import adds its own defaults (bench_dgl.py)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import bench_dgl  # noqa: E402
from bench_common import commit  # noqa: E402
from gnnpar.training.shard_source import load_graph  # noqa: E402
from gnnpar.cli.spec import RunSpec  # noqa: E402

bench_dgl.USER_ENV = USER_ENV


def positive_edge_ids(graph, train_pos: np.ndarray) -> np.ndarray:
    """The CSR entry (DGL's edge id: entry k is the edge indices[k] → its row) of each
    training positive (u, v), u < v, as the edge u → v."""
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    n = graph.num_nodes
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    keys = rows * n + indices  # sorted: rows ascend, columns ascend within a row
    want = train_pos[1] * n + train_pos[0]
    at = np.searchsorted(keys, want)
    if not np.array_equal(keys[np.minimum(at, keys.size - 1)], want):
        raise RuntimeError("a training positive is not an edge of the training graph")
    return at.astype(np.int64)


def export(path: str, spec: RunSpec) -> dict:
    graph = load_graph(spec)
    split = graph.meta["link_split"]
    np.savez(path, indptr=np.asarray(graph.indptr, np.int64),
             indices=np.asarray(graph.indices, np.int64), x=np.asarray(graph.x, np.float32),
             y=np.asarray(graph.y, np.int64), train_mask=np.asarray(graph.train_mask, bool),
             num_classes=graph.num_classes,
             train_eids=positive_edge_ids(graph, split.train_pos))
    return {"nodes": graph.num_nodes, "entries": int(np.asarray(graph.indices).shape[0]),
            "positives": int(split.train_pos.shape[1])}


def gnnpar_epochs(args, tmp: str) -> dict:
    """One ``gnnpar-train`` process of ``--epochs`` epochs: each epoch's ``train_s``."""
    log = os.path.join(tmp, "link.jsonl")
    if os.path.exists(log):
        os.remove(log)
    cmd = [sys.executable, "-m", "gnnpar.train", "--task", "link", "--mode", "minibatch",
           "--dataset", args.dataset, "--cache-dir", os.path.join(tmp, "cache"), "--model",
           "sage", "--layers", str(len(args.fanouts)), "--hidden", str(args.hidden),
           "--fanouts", ",".join(map(str, args.fanouts)), "--batch-size", str(args.batch_size),
           "--neg-ratio", str(args.neg_ratio), "--dropout", "0.5", "--epochs", str(args.epochs),
           "--seed", str(args.seed), "--device", "cpu", "--threads", str(args.threads),
           "--log-json", log, "--quiet"]
    env = dict(USER_ENV, OMP_NUM_THREADS=str(args.threads), CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [USER_ENV.get("PYTHONPATH")]
                                                    if p]))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {res.returncode}:\n{res.stderr}")
    recs = [json.loads(line) for line in open(log) if '"final"' not in line]
    return {"epochs_s": [r["train_s"] for r in recs], "steps": recs[-1]["steps"],
            "loss": recs[-1]["loss"], "test_auc": recs[-1]["test_auc"],
            "cmd": " ".join(cmd[1:])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="rmat:scale=16,ef=16")
    p.add_argument("--fanouts", type=lambda s: [int(v) for v in s.split(",")],
                   default=[15, 10])
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--neg-ratio", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3, help="per round; the first a warm-up")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--venv", default=bench_dgl.DEFAULT_VENV)
    args = p.parse_args(argv)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="gnnpar-link-dgl-") as tmp:
        npz = os.path.join(tmp, "graph.npz")
        spec = RunSpec.of(task="link", dataset=args.dataset, seed=args.seed, reorder="none",
                       cache_dir=os.path.join(tmp, "cache"))
        sizes = export(npz, spec)
        print(f"{args.dataset}: training graph {sizes}", flush=True)
        side = bench_dgl.DglSide(args.venv, npz, args.threads)
        req = dict(measure="link_train", threads=args.threads, epochs=args.epochs,
                   fanouts=args.fanouts, batch_size=args.batch_size, hidden=args.hidden,
                   dropout=0.5, neg_ratio=args.neg_ratio)
        rounds = []
        try:
            for r in range(args.rounds):
                ours, theirs = gnnpar_epochs(args, tmp), side(**req)
                load = os.getloadavg()[0]
                a = statistics.median(bench_dgl.timed_epochs(ours))
                b = statistics.median(bench_dgl.timed_epochs(theirs))
                rounds.append({"gnnpar": ours, "dgl": theirs, "load": load,
                               "gnnpar_s": a, "dgl_s": b, "ratio": a / b})
                fmt = lambda out: " ".join(f"{t:.2f}" for t in out["epochs_s"])  # noqa: E731
                print(f"round {r}: gnnpar [{fmt(ours)}] s ({ours['steps']} steps, loss "
                      f"{ours['loss']:.4f}) DGL [{fmt(theirs)}] s ({theirs['steps']} steps, "
                      f"loss {theirs['loss']:.4f}): {a:.2f} / {b:.2f} = {a / b:.3f}, "
                      f"load {load:.2f}", flush=True)
        finally:
            side.close()
    ratios = [r["ratio"] for r in rounds]
    print(f"\nmini-batch link epoch, {args.dataset}, SAGE {args.fanouts} hidden {args.hidden}, "
          f"batch {args.batch_size} positives, {args.neg_ratio} negative(s) each, "
          f"{args.threads} threads, commit {commit()}, torch/dgl {side.hello['torch']}/"
          f"{side.hello['dgl']} on the DGL side; load {load0:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end")
    print(f"gnnpar/DGL per round: {' '.join(f'{v:.3f}' for v in ratios)}; median "
          f"{statistics.median(ratios):.3f}")
    print(json.dumps({"dataset": args.dataset, "fanouts": args.fanouts, "commit": commit(),
                      "threads": args.threads, "batch_size": args.batch_size,
                      "sizes": sizes, "load_start": load0, "rounds": rounds,
                      "median_ratio": statistics.median(ratios)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
