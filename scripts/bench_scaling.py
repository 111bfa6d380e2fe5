#!/usr/bin/env python
"""Strong scaling of full-batch training: every algorithm at every world size, one thread per rank.

    python scripts/bench_scaling.py                                # the issue's sweep (R-MAT 18)
    python scripts/bench_scaling.py --scale 12 --ef 8 --hidden 32 --epochs 4   # a quick run

One graph (``rmat:scale=S,ef=E``, METIS by default), a ``--layers``-layer GCN of width
``--hidden``; world sizes 1, 2, 4, … up to this machine's cores (or ``--worlds``); algorithms
1d, 1d-halo, 1.5d (c = 2), 2d (near-square grid), 3d (near-cubic grid), each rank a local
gloo process with one torch thread; and the two baselines: one rank with one thread and one
rank with every core. Each run's epoch time is the median of its timed epochs (after one
warm-up, before the last, which also evaluates).

Prints one JSON object per run, then a table: epoch seconds, speedup over 1 rank × 1 thread
and over 1 rank × all threads, the share of the epoch blocked in communication, the busiest
rank's bytes, the fastest timed epoch (on a shared machine the least disturbed one), and the
cost model's prediction for the same algorithm, grid, partition and block layout
(:func:`gnnpar.kernels.cost_model.predict`, with figures from ``--calibration`` or, without it,
a probe run here first: :mod:`gnnpar.cli.calibrate`): the busiest rank's bytes, and the epoch's
seconds against the measured median (``pred/med``) and fastest (``pred/min``) epoch; the last
line counts the runs whose predicted time is within 25 % of the measured median.
``--plot PATH`` draws speedup and communication share against ranks (skipped, with a note,
when matplotlib is missing).
Runs are from :func:`bench_fullbatch.bench`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # run from a checkout without installing
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_fullbatch, here and in ranks

from bench_fullbatch import bench, grids_for  # noqa: E402

from gnnpar.cli.calibrate import calibrate, dense_rate, elementwise_rate, spmm_rate  # noqa: E402
from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.kernels.cost_model import Machine, Structure, predict  # noqa: E402
from gnnpar.kernels.grid import parse_grid  # noqa: E402
from gnnpar.partitioners import partition_graph  # noqa: E402

ALGOS = "1d,1d-halo,1.5d,2d,3d"


def world_sizes(cores: int):
    """1, 2, 4, … up to ``cores``, and ``cores`` itself."""
    out, p = [], 1
    while p <= cores:
        out.append(p)
        p *= 2
    return out if out[-1] == cores else out + [cores]


def model_dims(algo: str, world: int, grid, replication: int):
    """The cost model's ``dims`` for a run's grid (see :mod:`gnnpar.kernels.cost_terms`)."""
    if algo == "1.5d":
        return replication
    return parse_grid(grid) if grid and algo in ("2d", "3d") else None


def widths_of(graph, hidden: int, layers: int):
    return [graph.num_features] + [hidden] * (layers - 1) + [graph.num_classes]


def runs(worlds, algos, replication, cores):
    """(label, algo, world, threads, grid, replication) of every run of the sweep."""
    yield "1 rank x 1 thread", "1d", 1, 1, None, 1
    if cores > 1:
        yield f"1 rank x {cores} threads", "1d", 1, cores, None, 1
    for P in worlds:
        if P == 1:
            continue
        grids = grids_for(P)
        for algo in algos:
            if algo == "1.5d" and P % replication:
                continue
            yield algo, algo, P, 1, grids.get(algo), replication if algo == "1.5d" else 1


def machines(args, cores: int):
    """Time figures for one thread per rank, and for one rank with every core (the compute
    rates measured again with that many threads; the link is not used by one rank)."""
    if args.calibration:
        one = Machine.load(args.calibration)
    else:
        print("calibrating (a few seconds) ...", file=sys.stderr, flush=True)
        one = Machine.from_dict(calibrate(threads=1))
    if cores == 1:
        return {1: one}
    import torch
    old = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        s, d = spmm_rate(), dense_rate()
        rest = elementwise_rate(s, d, fixed_s=one.fixed_s(3))["elementwise_rate"]
    finally:
        torch.set_num_threads(old)
    return {1: one, cores: dataclasses.replace(one, spmm_rate=s, dense_rate=d,
                                               elementwise_rate=rest)}  # fixed costs: one's


#: the time model's goal: a prediction within this share of the measured epoch
TIME_GOAL = 0.25


def table(rows) -> str:
    """One line per run (measured against predicted seconds and bytes), then how many runs'
    predicted time is within :data:`TIME_GOAL` of the measured (median) epoch."""
    out = [f"{'run':<20} {'ranks':>5} {'grid':<7} {'epoch s':>8} {'min s':>7} {'x 1x1':>6} "
           f"{'x 1xall':>7} {'comm %':>6} {'MB max':>8} {'pred MB':>8} {'pred s':>8} "
           f"{'pred/med':>8} {'pred/min':>8}"]
    for r in rows:
        out.append(f"{r['run']:<20} {r['world_size']:>5} {r['grid']:<7} {r['epoch_s']:8.3f} "
                   f"{r['epoch_min_s']:7.3f} {r['speedup_1x1']:6.2f} {r['speedup_1xall']:7.2f} "
                   f"{100 * r['comm_share']:6.1f} {r['bytes_max_rank'] / 1e6:8.2f} "
                   f"{r['predicted_bytes_max_rank'] / 1e6:8.2f} {r['predicted_s']:8.3f} "
                   f"{r['predicted_over_measured']:8.2f} "
                   f"{r['predicted_s'] / r['epoch_min_s']:8.2f}")
    good = sum(abs(r["predicted_over_measured"] - 1) <= TIME_GOAL for r in rows)
    out.append(f"predicted time within {TIME_GOAL:.0%} of the measured epoch: {good} of "
               f"{len(rows)} runs")
    return "\n".join(out)


def plot(rows, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot ({path})", file=sys.stderr)
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for algo in dict.fromkeys(r["algo"] for r in rows if r["world_size"] > 1):
        mine = sorted((r for r in rows if r["algo"] == algo and r["world_size"] > 1),
                      key=lambda r: r["world_size"])
        ranks = [1] + [r["world_size"] for r in mine]
        a.plot(ranks, [1.0] + [r["speedup_1x1"] for r in mine], marker="o", label=algo)
        b.plot([r["world_size"] for r in mine], [100 * r["comm_share"] for r in mine],
               marker="o", label=algo)
    base = [r for r in rows if r["world_size"] == 1 and r["threads"] > 1]
    if base:
        a.axhline(base[0]["speedup_1x1"], ls="--", c="grey", label="1 rank, all threads")
    a.set(xlabel="ranks (1 thread each)", ylabel="speedup over 1 rank x 1 thread")
    b.set(xlabel="ranks (1 thread each)", ylabel="communication share of the epoch (%)")
    ranks = sorted({r["world_size"] for r in rows})
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(r) for r in ranks])
    a.legend()
    b.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}", file=sys.stderr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--scale", type=int, default=18, help="R-MAT scale (2^scale nodes)")
    p.add_argument("--ef", type=int, default=16, help="R-MAT edge factor")
    p.add_argument("--hidden", type=int, default=128, help="hidden width")
    p.add_argument("--layers", type=int, default=3, help="GCN layers")
    p.add_argument("--epochs", type=int, default=5, help="epochs per run (first: warm-up)")
    p.add_argument("--partitioner", default="metis", help="vertex partitioner")
    p.add_argument("--algos", default=ALGOS, help="comma list")
    p.add_argument("--replication", type=int, default=2, help="1.5D replication factor")
    p.add_argument("--worlds", default=None,
                   help="comma list of world sizes (default: 1, 2, 4, ... up to the cores)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="threads of the one-rank baseline (default: this machine's cores)")
    p.add_argument("--calibration", default=None,
                   help="figures from `gnnpar-plan --calibrate` (default: probe here first)")
    p.add_argument("--plot", default="scaling.png", help="plot file ('' for none)")
    p.add_argument("--json-out", default=None, help="also write the JSON lines to this file")
    p.add_argument("--seed", type=int, default=0, help="seed")
    args = p.parse_args(argv)
    cores = max(1, args.cores)
    worlds = ([int(w) for w in args.worlds.split(",")] if args.worlds else world_sizes(cores))
    algos = [a for a in args.algos.split(",") if a]
    dataset = f"rmat:scale={args.scale},ef={args.ef}"
    graph = load_dataset(dataset)
    widths = widths_of(graph, args.hidden, args.layers)
    rates = machines(args, cores)
    structures = {}
    rows = []
    sink = open(args.json_out, "w") if args.json_out else None
    for label, algo, P, threads, grid, c in runs(worlds, algos, args.replication, cores):
        print(f"running {label} on {P} rank(s) ...", file=sys.stderr, flush=True)
        try:
            row = bench(dataset, algo, P, grid, c, args.partitioner, args.epochs, args.hidden,
                        args.layers, args.seed, threads)
        except Exception as e:  # report and go on with the other runs
            print(f"  {label} failed: {str(e).splitlines()[0]}", file=sys.stderr)
            continue
        if P not in structures:
            part = partition_graph(graph, P, args.partitioner, seed=args.seed)
            structures[P] = Structure.from_graph(graph, part.owner, P)
        # bench_fullbatch builds as gnnpar-train does: balanced blocks seeded with --seed
        model = predict(structures[P], algo, "gcn", widths, rates[threads if P == 1 else 1],
                        model_dims(algo, P, grid, c), "halo", args.layers,
                        SimpleNamespace(seed=args.seed, block_layout="balanced"))
        row.update(run=label, dataset=dataset, hidden=args.hidden, layers=args.layers,
                   comm_share=row["comm_s"] / row["epoch_s"],
                   bytes_max_rank=row["bytes_per_rank_max"],
                   predicted_bytes_max_rank=model["comm_bytes_max_rank"],
                   predicted_s=model["time_s"],
                   predicted_compute_s=model["compute_s"], predicted_comm_s=model["comm_s"],
                   predicted_fixed_s=model["fixed_s"],
                   predicted_over_measured=model["time_s"] / row["epoch_s"],
                   predicted_bytes_max_padded=model["bytes"])
        rows.append(row)
        print(f"  {label} on {P}: epoch {row['epoch_s']:.3f} s, comm {row['comm_share']:.0%}, "
              f"predicted {model['time_s']:.3f} s ({row['predicted_over_measured']:.2f} x)",
              file=sys.stderr, flush=True)
    base = {r["threads"]: r["epoch_s"] for r in rows if r["world_size"] == 1}
    for r in rows:
        r["speedup_1x1"] = base.get(1, float("nan")) / r["epoch_s"]
        r["speedup_1xall"] = base.get(cores, base.get(1, float("nan"))) / r["epoch_s"]
        line = json.dumps(r)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
    if sink:
        sink.close()
    print()
    print(table(rows))
    if args.plot and rows:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
