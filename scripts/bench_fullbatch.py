#!/usr/bin/env python
"""Every distributed full-batch algorithm at one world size on one graph, side by side.

    python scripts/bench_fullbatch.py --dataset rmat:scale=15,ef=16 --nprocs 4

Per algorithm: median epoch time, its compute/communication split, bytes sent per rank
(mean and max) per epoch, and peak memory per rank (max), as a table and JSON lines. Ranks
are local gloo processes (``--threads`` each, default one); the partition is METIS unless
``--partitioner`` says otherwise. :func:`bench` (one algorithm at one world size) is what
``scripts/bench_scaling.py`` sweeps.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from types import SimpleNamespace

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # run from a checkout without installing


def factor(p: int, k: int):
    """A near-balanced k-way factorisation of p, largest first (2 -> (2, 1), 4 -> (2, 2))."""
    dims = [1] * k
    rest = p
    for f in range(2, p + 1):
        while rest % f == 0:
            dims[dims.index(min(dims))] *= f
            rest //= f
    return sorted(dims, reverse=True)


def rank_run(rank, world, spec, algo, grid_text, replication, partitioner, epochs, hidden,
             layers, seed):
    import torch
    from gnnpar.datasets import load_dataset
    from gnnpar.training.distributed import DistRuntime
    from gnnpar.kernels.algorithms import get as algorithm
    from gnnpar.kernels.algorithms import make_grid
    from gnnpar.kernels.grid import parse_grid
    from gnnpar.training.memory import local_peak_bytes
    from gnnpar.nn.models import GNN
    from gnnpar.partitioners import partition_graph
    from gnnpar.partitioners.shard_build import build_shard
    from gnnpar.training.trainer import TrainConfig, fit
    g = load_dataset(spec)
    shard = build_shard(g, partition_graph(g, world, partitioner, seed=seed), rank, norms=("gcn",))
    del g
    grid = make_grid(algo, world, parse_grid(grid_text) if grid_text else None, replication)
    torch.manual_seed(seed)
    model = GNN("gcn", int(shard.x.shape[1]), hidden, int(shard.num_classes), layers, 0.5)
    # the builder options gnnpar-train gives (3d/4d layers, the balanced 2d/3d/4d layout)
    settings = SimpleNamespace(layers=layers, variant=None, seed=seed, block_layout="balanced")
    rt = DistRuntime(grid, shard, algorithm(algo), "gcn", **algorithm(algo).options(settings))
    hist = fit(model, rt, TrainConfig(epochs=epochs, eval_every=10 ** 9))
    return {"hist": hist, "peak": local_peak_bytes()}


def grids_for(P: int) -> dict:
    """The grid each algorithm runs on at P ranks (near-square 2d, near-cubic 3d)."""
    return {"2d": "x".join(map(str, factor(P, 2))), "3d": "x".join(map(str, factor(P, 3))),
            "4d": "x".join(map(str, [1] + factor(P, 3)))}


def timed_epochs(hist):
    """The epochs to time: after the warm-up (the first) and before the last, which also
    evaluates (whatever is left when there are fewer than three)."""
    return hist[1:-1] or hist[1:] or hist


def bench(dataset, algo, P, grid, replication, partitioner, epochs, hidden, layers, seed,
          threads=1, timeout_s=900):
    """One algorithm on P local ranks of ``threads`` torch threads each: median epoch, compute
    and (exposed) communication seconds, bytes per rank (mean, max), peak memory (max)."""
    from gnnpar.launcher.spawn import spawn
    out = spawn(rank_run, P, args=(dataset, algo, grid, replication, partitioner, epochs, hidden,
                                   layers, seed), timeout_s=timeout_s, threads=threads,
                dynamo_first=True)
    hist = timed_epochs(out[0]["hist"])
    return {"algo": algo, "world_size": P, "threads": threads, "grid": grid or str(P),
            "epoch_s": statistics.median(r["epoch_s"] for r in hist),
            "epoch_min_s": min(r["epoch_s"] for r in hist),
            "compute_s": statistics.median(r["compute_s"] for r in hist),
            "comm_s": statistics.median(r["comm_s"] for r in hist),
            "bytes_per_rank_mean": hist[-1]["comm_bytes"] / P,
            "bytes_per_rank_max": hist[-1]["comm_bytes_max_rank"],
            "peak_mem_bytes_max": max(o["peak"] for o in out)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default="rmat:scale=15,ef=16", help="dataset spec")
    p.add_argument("--nprocs", type=int, default=4, help="world size")
    p.add_argument("--algos", default="1d,1d-halo,1.5d,2d,3d,4d", help="comma list")
    p.add_argument("--replication", type=int, default=2, help="1.5D replication factor")
    p.add_argument("--partitioner", default="metis", help="vertex partitioner")
    p.add_argument("--epochs", type=int, default=5, help="epochs (first one is warm-up)")
    p.add_argument("--hidden", type=int, default=128, help="hidden width")
    p.add_argument("--layers", type=int, default=3, help="GCN layers")
    p.add_argument("--seed", type=int, default=0, help="seed")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = p.parse_args()
    P = args.nprocs
    grids = grids_for(P)
    rows = []
    for algo in filter(None, args.algos.split(",")):
        if algo == "1.5d" and P % args.replication:
            print(f"skip 1.5d: c={args.replication} does not divide {P}", file=sys.stderr)
            continue
        print(f"running {algo} on {P} ranks ...", file=sys.stderr, flush=True)
        try:
            row = bench(args.dataset, algo, P, grids.get(algo), args.replication,
                        args.partitioner, args.epochs, args.hidden, args.layers, args.seed,
                        args.threads)
        except Exception as e:  # report and go on with the other algorithms
            print(f"  {algo} failed: {str(e).splitlines()[0]}", file=sys.stderr)
            continue
        rows.append(row)
        print(json.dumps({"dataset": args.dataset, **row}), flush=True)
    print(f"\n{'algo':<8} {'grid':<6} {'epoch s':>8} {'compute':>8} {'comm':>8} "
          f"{'MB/rank':>9} {'MB max':>8} {'peak MiB':>9}")
    for r in rows:
        print(f"{r['algo']:<8} {r['grid']:<6} {r['epoch_s']:8.3f} {r['compute_s']:8.3f} "
              f"{r['comm_s']:8.3f} {r['bytes_per_rank_mean'] / 1e6:9.2f} "
              f"{r['bytes_per_rank_max'] / 1e6:8.2f} {r['peak_mem_bytes_max'] / 2**20:9.1f}")


if __name__ == "__main__":
    main()
