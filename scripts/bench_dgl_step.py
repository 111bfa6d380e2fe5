#!/usr/bin/env python
"""Issue 25's bound side by side in one run: DGL's mini-batch epoch, gnnpar's, and the dense
products of one step alone, alternating round by round on one machine, with the load average
beside every figure.

    bash scripts/bench_dgl.sh --setup                 # once: the DGL side venv (a few GB)
    python scripts/bench_dgl_step.py --dry-run        # what it would run; needs no DGL
    python scripts/bench_dgl_step.py --threads 2,1 --rounds 5 --epochs 4

Why one run: ``docs/performance.md`` compared the products alone, timed one day, with DGL's
epoch, timed another; on the shared 2-core machines a day's load moves every figure more than
the comparison can bear. Here the three are timed within the same minutes.

Each round, for each of ``--threads`` T, runs these three in an order that rotates from round
to round (so no side always runs first, or right after another):

- ``gnnpar``: one ``gnnpar-train`` process, ``scripts/bench_dgl.py``'s ``train`` measure (the
  plain command: ``--mode minibatch --model sage --layers 3 --hidden 256 --fanouts 15,10,5
  --batch-size 1024 --dropout 0.5 --device cpu --threads T``, plus ``--gnnpar-flags``),
  ``--epochs`` epochs; each epoch's ``train_s``.
- ``dgl``: DGL 2.1.0's own loop in the side venv (``scripts/bench_dgl_side.py``'s ``train``
  request: ``NeighborSampler`` + ``DataLoader(num_workers=0)``, ``SAGEConv('mean')``, the same
  model, fanouts and batch), ``--epochs`` epochs, T threads.
- ``products``: the dense products one step of that model must do, alone
  (``scripts/bench_step_products.py``'s products on its blocks, each layer in its faster
  arrangement), at T threads in this process, median of ``--repeats`` per product.

Both training sides drop their first epoch (a warm-up) and give the median of the others, per
minibatch (epoch / steps). The bound is issue 25's: gnnpar's epoch at most 0.5× DGL's at 2 or
more threads, 0.6× at 1 thread; ``share`` is the products' time over that bound's time a
minibatch (bound × DGL's minibatch, the same round): above 1, the products alone take longer
than the bound allows the whole step in that round. Every figure's line carries the 1-minute
load average read before and after it; with more runnable threads than cores the figures are
noise. The last line is JSON.

What it does not measure: whether DGL's step does the same dense products. That is read from
DGL's source (``SAGEConv('mean')`` aggregates before its neighbour projection when the input
is narrower than the output, as gnnpar does), not timed here.

The default product blocks are the mean blocks of ``rmat:scale=17,ef=16``, fanouts 15,10,5,
batch 1024 (``bench_step_products.DEFAULT_LAYERS``); for another scale, fanouts or batch give
``--product-layers`` (the mean shapes ``scripts/profile_epoch.py --mode minibatch`` prints).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_dgl  # noqa: E402  (its gnnpar and DGL sides; imports gnnpar and torch)
import bench_step_products as products_mod  # noqa: E402
import torch  # noqa: E402

SIDES = ("gnnpar", "dgl", "products")
DEFAULTS = {"scale": 17, "ef": 16, "fanouts": [15, 10, 5], "batch_size": 1024}


def bound_for(threads: int) -> float:
    """Issue 25's bound on gnnpar's epoch as a fraction of DGL's: 0.6 at 1 thread, else 0.5."""
    return 0.6 if threads == 1 else 0.5


def order_of(round_: int) -> list:
    """The sides in round ``round_``: rotated by one each round."""
    k = round_ % len(SIDES)
    return list(SIDES[k:] + SIDES[:k])


def load() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    p.add_argument("--venv", default=bench_dgl.DEFAULT_VENV,
                   help="the DGL side venv (default %(default)s; bench_dgl.sh --setup)")
    p.add_argument("--threads", type=ints, default=[2, 1],
                   help="thread counts, each side run at each in every round (default 2,1)")
    p.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--epochs", type=int, default=4,
                   help="epochs per training run, the first a warm-up (default 4, at least 2)")
    p.add_argument("--scale", type=int, default=DEFAULTS["scale"], help="rmat scale (17)")
    p.add_argument("--ef", type=int, default=DEFAULTS["ef"], help="rmat edge factor (16)")
    p.add_argument("--fanouts", type=ints, default=DEFAULTS["fanouts"],
                   help="input layer first (15,10,5)")
    p.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], help="(1024)")
    p.add_argument("--product-layers", default=None,
                   help="d,s,f_in,f_out per block, input layer first, ';' between (default: "
                        "the mean blocks of the default scale, fanouts and batch)")
    p.add_argument("--repeats", type=int, default=15,
                   help="products: timings per product, median (default 15)")
    p.add_argument("--gnnpar-flags", default="",
                   help="more gnnpar-train flags, space-separated (gnnpar's side only)")
    p.add_argument("--json", default=None, help="also write the JSON result to PATH")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    a = p.parse_args(argv)
    if not a.threads or min(a.threads) < 1:
        p.error("--threads: positive thread counts")
    if a.rounds < 1 or a.repeats < 1:
        p.error("--rounds and --repeats must be at least 1")
    if a.epochs < 2:
        p.error("--epochs must be at least 2 (the first is a warm-up)")
    if min(a.fanouts) < 1 or a.batch_size < 1 or a.scale < 1 or a.ef < 1:
        p.error("--fanouts, --batch-size, --scale and --ef must be positive")
    default_blocks = all(getattr(a, k) == v for k, v in DEFAULTS.items())
    if a.product_layers is None and not default_blocks:
        p.error("--product-layers: the default blocks are those of rmat:scale=17,ef=16, "
                "fanouts 15,10,5, batch 1024; give this run's mean blocks (scripts/"
                "profile_epoch.py --mode minibatch prints them)")
    spec = a.product_layers or products_mod.DEFAULT_LAYERS
    try:
        a.layers = [tuple(int(x) for x in block.split(",")) for block in spec.split(";")]
    except ValueError:
        a.layers = None
    if not a.layers or any(len(b) != 4 or min(b) < 1 for b in a.layers):
        p.error("--product-layers: four positive integers d,s,f_in,f_out per block")
    if len(a.layers) != len(a.fanouts):
        p.error(f"--product-layers gives {len(a.layers)} blocks for {len(a.fanouts)} layers")
    return a


def bench_args(a) -> SimpleNamespace:
    """The settings ``bench_dgl.GnnparSide`` and ``train_flags`` read."""
    return SimpleNamespace(fanouts=a.fanouts, batch_size=a.batch_size, macrobatch=4)


def dgl_request(a, threads: int) -> dict:
    return dict(measure="train", threads=threads, epochs=a.epochs, fanouts=list(a.fanouts),
                batch_size=a.batch_size, hidden=bench_dgl.TRAIN_HIDDEN,
                dropout=bench_dgl.TRAIN_DROPOUT)


def dry_run(a) -> int:
    spec = f"rmat:scale={a.scale},ef={a.ef}"
    have = os.path.exists(os.path.join(a.venv, "bin", "python"))
    print(f"side venv {a.venv}: " + ("present" if have else
                                     "MISSING, make it with: bash scripts/bench_dgl.sh --setup "
                                     f"--venv {a.venv}"))
    print(f"build {spec} (gnnpar), export TMP/graph.npz; start {a.venv}/bin/python "
          f"scripts/bench_dgl_side.py TMP/graph.npz")
    for r in range(a.rounds):
        for t in a.threads:
            for side in order_of(r):
                if side == "gnnpar":
                    what = "gnnpar-train " + " ".join(bench_dgl.train_flags(
                        spec, bench_args(a), a.epochs, t, None, a.gnnpar_flags.split()))
                elif side == "dgl":
                    what = "DGL " + json.dumps(dgl_request(a, t))
                else:
                    what = (f"products alone, blocks {a.layers}, {a.repeats} repeats, "
                            f"{t} threads")
                print(f"round {r} threads {t} {side}: {what}; load average before and after")
    return 0


def time_products(plan, threads: int, repeats: int) -> float:
    """ms of one step's dense products at ``threads`` threads, each layer in its faster
    arrangement (as ``bench_step_products.py`` times them)."""
    torch.set_num_threads(threads)
    total = 0.0
    for ways in plan:
        total += min(1e3 * sum(products_mod.time_product(*ops, repeats) for ops in prods)
                     for prods in ways.values())
    return total


def main(argv=None) -> int:
    a = parse(argv)
    if a.dry_run:
        return dry_run(a)
    if not os.path.exists(os.path.join(a.venv, "bin", "python")):
        print(f"no DGL side venv at {a.venv}; make it (torch 2.2.1 + dgl 2.1.0, never gnnpar's "
              f"own venv) with:\n    bash scripts/bench_dgl.sh --setup --venv {a.venv}",
              file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(0)
    plan = [{how: [products_mod.operands(*p, gen) for p in prods]
             for how, prods in products_mod.arrangements(layer, i == 0).items()}
            for i, layer in enumerate(a.layers)]
    load0 = load()
    print(f"cpus {os.cpu_count()}, load average {load0}; torch {torch.__version__}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gnnpar-bench-dgl-step-") as tmp:
        ours = bench_dgl.GnnparSide(a.scale, a.ef, bench_args(a), tmp)
        npz = os.path.join(tmp, "graph.npz")
        ours.export(npz)
        theirs = bench_dgl.DglSide(a.venv, npz, max(a.threads))
        print(f"DGL side: {theirs.hello}", flush=True)
        try:
            for r in range(a.rounds):
                for t in a.threads:
                    row = {"round": r, "threads": t, "order": order_of(r)}
                    for side in order_of(r):
                        before, t0 = load(), time.perf_counter()
                        if side == "products":
                            ms = time_products(plan, t, a.repeats)
                            fig = {"ms": ms}
                        else:
                            out = (ours.train(a.epochs, t, None, a.gnnpar_flags.split())
                                   if side == "gnnpar" else theirs(**dgl_request(a, t)))
                            epochs = out["epochs_s"][1:]
                            ms = 1e3 * statistics.median(epochs) / out["steps"]
                            fig = {"ms": ms, "epochs_s": out["epochs_s"], "steps": out["steps"]}
                        fig.update(load_before=before, load_after=load(),
                                   wall_s=round(time.perf_counter() - t0, 2))
                        row[side] = fig
                        print(f"round {r} threads {t} {side}: {ms:.1f} ms a minibatch"
                              + (f" (epochs {' '.join(f'{e:.3f}' for e in fig['epochs_s'])} s, "
                                 f"{fig['steps']} steps, the first a warm-up)"
                                 if "epochs_s" in fig else " (the step's dense products alone)")
                              + f"; load {before} -> {fig['load_after']}", flush=True)
                    bound_ms = bound_for(t) * row["dgl"]["ms"]
                    row.update(bound_ms=bound_ms, share=row["products"]["ms"] / bound_ms,
                               ratio=row["gnnpar"]["ms"] / row["dgl"]["ms"])
                    print(f"round {r} threads {t}: gnnpar / DGL {row['ratio']:.2f}; bound "
                          f"{bound_for(t)} x DGL = {bound_ms:.1f} ms a minibatch; products "
                          f"alone {row['share']:.2f} of it", flush=True)
                    rows.append(row)
        finally:
            theirs.close()
    summary = {}
    print("\n| threads | gnnpar ms/minibatch | DGL ms/minibatch | gnnpar / DGL | bound ms | "
          "products ms | products / bound (rounds) | load |\n|---|---|---|---|---|---|---|---|")
    for t in a.threads:
        mine = [r for r in rows if r["threads"] == t]
        med = {k: statistics.median(r[k]["ms"] for r in mine) for k in SIDES}
        shares = [r["share"] for r in mine]
        loads = [v for r in mine for k in SIDES for v in (r[k]["load_before"],
                                                          r[k]["load_after"])]
        summary[str(t)] = {**{f"{k}_ms": v for k, v in med.items()},
                           "ratio": statistics.median(r["ratio"] for r in mine),
                           "bound": bound_for(t), "shares": shares,
                           "rounds_over_bound": sum(s > 1 for s in shares),
                           "load_min": min(loads), "load_max": max(loads)}
        print(f"| {t} | {med['gnnpar']:.1f} | {med['dgl']:.1f} | "
              f"{summary[str(t)]['ratio']:.2f} | {bound_for(t) * med['dgl']:.1f} | "
              f"{med['products']:.1f} | {statistics.median(shares):.2f} "
              f"({' '.join(f'{s:.2f}' for s in shares)}; over 1 in "
              f"{summary[str(t)]['rounds_over_bound']} of {len(shares)}) | "
              f"{min(loads)}–{max(loads)} |")
    out = {"args": {k: v for k, v in vars(a).items() if k != "layers"}, "layers": a.layers,
           "dgl": theirs.hello, "rounds": rows, "summary": summary,
           "load_average": [load0, load()]}
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
