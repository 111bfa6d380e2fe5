"""Distributed full-batch training from the CLI: local spawn or an external launcher.

- ``--nprocs N``: this process loads and partitions the graph (or uses ``--partition-dir``),
  writes the shards once, and spawns N local ranks that each memory-map only their shard.
- ``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set): every rank joins the process
  group; with ``--partition-dir`` it loads only its shard, otherwise each rank builds its own
  shard from the dataset (fine for small graphs; partition large ones with
  ``gnnpar-partition`` first).
"""
from __future__ import annotations

import datetime
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist

from gnnpar.datasets import DEFAULT_SPEC, InputError, load_dataset

from .logged import train_logged
from .models import build_model
from .trainer import TrainConfig, fit

def grid_dims(args):
    """``--grid`` as a tuple of ints (None when not given)."""
    from gnnpar.kernels.grid import parse_grid
    return parse_grid(args.grid) if args.grid else None


def make_run_grid(args, world: int):
    """The process grid of ``--algo`` (validated against the world size before any group)."""
    from gnnpar.kernels.build import grid_shape, make_grid
    shape = grid_shape(args.algo, world, grid_dims(args), args.replication or 1)
    ranks = int(np.prod(list(shape.values())))
    if ranks != world:
        raise InputError(f"--grid {args.grid} gives {ranks} ranks but the world size is {world}")
    return shape, (lambda: make_grid(args.algo, world, grid_dims(args), args.replication or 1))


def algo_kwargs(args) -> dict:
    """3d/4d take the layer count to rotate their axes per layer; 1.5d/2d a variant."""
    if args.algo in ("3d", "4d"):
        return {"layers": args.layers}
    if args.algo in ("1.5d", "2d") and args.variant:
        return {"variant": args.variant}
    return {}


def resolve_auto(args, world: int) -> None:
    """``--algo auto``: take the cost model's best algorithm, grid and variant that fits."""
    from .plan_cli import plan
    from gnnpar.partitioners.shards import read_meta
    if args.partition_dir and os.path.exists(os.path.join(args.partition_dir, "meta.json")):
        meta = read_meta(args.partition_dir)
        n, m, f_in, classes = meta["n"], meta["nnz"], meta["num_features"], meta["num_classes"]
    else:
        g = load_dataset(args.dataset or DEFAULT_SPEC, directed=args.directed,
                         cache_dir=args.cache_dir)
        n, m, f_in, classes = g.num_nodes, g.num_edges + g.num_nodes, g.num_features, g.num_classes
    rows = plan(n, m, f_in, args.hidden, classes, args.layers, world, args.model, args)
    best = rows[0]
    if not best["fits"]:
        lean = min(rows, key=lambda r: r["memory"])
        raise InputError(f"no algorithm fits --mem-cap {args.mem_cap} on {world} ranks (the "
                         f"leanest, {lean['algo']} {lean['grid']}, needs "
                         f"{lean['memory'] / 2**20:.1f} MiB per rank)")
    args.algo = best["algo"]
    args.grid = best["grid"] if best["algo"] in ("2d", "3d") else None
    args.replication = best["replication"] if best["algo"] == "1.5d" else None
    args.variant = best["variant"] if best["variant"] in ("halo", "bcast") else None
    if not args.quiet:
        print(f"--algo auto chose {args.algo} grid {best['grid']} ({best['variant']}): modelled "
              f"{best['time_s']:.4f} s/epoch, {best['memory'] / 2**20:.1f} MiB/rank", file=sys.stderr)


def pick_backend(choice: str, device: torch.device) -> str:
    if choice == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if choice == "mpi" and not dist.is_mpi_available():
        raise InputError("--backend mpi: this torch build has no MPI backend; use gloo (or nccl)")
    if choice not in ("gloo", "nccl", "mpi"):
        raise InputError(f"unknown --backend {choice!r}; choose auto, gloo, nccl or mpi")
    return choice


def prepare_shards(args, world: int) -> str:
    """Write shards for ``world`` ranks unless ``--partition-dir`` already holds them."""
    from gnnpar.partitioners import partition_graph, write_shards
    from gnnpar.partitioners.shards import read_meta
    out = args.partition_dir
    if out and os.path.exists(os.path.join(out, "meta.json")):
        meta = read_meta(out)
        if int(meta["parts"]) != world:
            raise InputError(f"the shards in {out} are for {meta['parts']} ranks but --nprocs is "
                             f"{world}; rerun gnnpar-partition with --parts {world}")
        return out
    out = out or tempfile.mkdtemp(prefix="gnnpar-shards-")
    graph = load_dataset(args.dataset or DEFAULT_SPEC, directed=args.directed,
                         cache_dir=args.cache_dir)
    if not args.quiet:
        print(graph.summary(), file=sys.stderr)
    part = partition_graph(graph, world, args.partitioner or "metis", seed=args.seed)
    write_shards(graph, part, out, norms=("gcn", "mean"))
    return out


def rank_body(rank: int, world: int, args, shard_dir) -> dict:
    """Everything one rank does once the process group exists; returns the final metrics."""
    from gnnpar.partitioners.shards import load_shard
    from .distributed import DistRuntime
    device = torch.device(args.device_resolved)
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if args.mode == "minibatch":
        from .sampling.run import minibatch_rank
        return minibatch_rank(rank, world, args, shard_dir, device)
    shape, build_grid = make_run_grid(args, world)
    grid = build_grid()
    if shard_dir is not None:
        shard = load_shard(shard_dir, rank, world_size=world)
    else:
        from gnnpar.partitioners import partition_graph
        from gnnpar.partitioners.shard_build import build_shard
        graph = load_dataset(args.dataset or DEFAULT_SPEC, directed=args.directed)
        shard = build_shard(graph, partition_graph(graph, world, args.partitioner or "block",
                                                   seed=args.seed), rank)
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    f_in = int(shard.x.shape[1])
    model = build_model(args.model, f_in, args.hidden, int(shard.num_classes), args.layers,
                        args.dropout).to(device)
    torch.manual_seed(args.seed * 1000003 + rank)  # dropout masks differ between ranks' rows
    rt = DistRuntime(grid, shard, args.algo, model.norm, device, **algo_kwargs(args))
    cfg = TrainConfig(epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay)
    fields = {"algo": args.algo, "world_size": world, "grid": list(shape.values())}
    final = train_logged(lambda on_epoch: fit(model, rt, cfg, on_epoch), model, args, fields,
                         rank == 0, f"train[{args.algo} x{world}]",
                         {"f_in": f_in, "f_out": int(shard.num_classes)})
    return final


def _spawned(rank, world, args, shard_dir):
    return rank_body(rank, world, args, shard_dir)


def run_distributed(args) -> dict:
    """Entry from ``gnnpar-train``: spawn locally or join the launcher's world."""
    from .spawn import SpawnError, spawn
    device = torch.device(args.device_resolved)
    backend = pick_backend(args.backend, device)
    if args.algo == "auto":
        resolve_auto(args, args.nprocs or int(os.environ["WORLD_SIZE"]))
    if args.nprocs:
        if backend == "nccl" and args.nprocs > max(torch.cuda.device_count(), 1):
            raise InputError(f"NCCL needs one GPU per rank: {args.nprocs} ranks, "
                             f"{torch.cuda.device_count()} GPUs; use --backend gloo")
        if args.mode != "minibatch":
            make_run_grid(args, args.nprocs)  # fail before spawning
        shard_dir = prepare_shards(args, args.nprocs)
        try:
            return spawn(_spawned, args.nprocs, args=(args, shard_dir), backend=backend,
                         timeout_s=args.timeout)[0]
        except SpawnError as e:
            first = str(e).splitlines()[0]
            if "InputError" in str(e):
                raise InputError(first.split("InputError: ", 1)[-1])
            raise RuntimeError(first) from None
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        return rank_body(rank, world, args, args.partition_dir)
    finally:
        dist.destroy_process_group()


def launched_externally() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ
