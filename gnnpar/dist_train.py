"""Distributed full-batch training from the CLI: local spawn or an external launcher.

- ``--nprocs N``: this process loads and partitions the graph (or uses ``--partition-dir``),
  writes the shards once, and spawns N local ranks that each memory-map only their shard.
- ``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set): every rank joins the process
  group; with ``--partition-dir`` it loads only its shard, otherwise each rank builds its own
  shard from the dataset (fine for small graphs; partition large ones with
  ``gnnpar-partition`` first).
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from contextlib import contextmanager

import numpy as np
import torch

from gnnpar.datasets import DEFAULT_SPEC, InputError, load_dataset

from .logged import train_logged
from .models import build_model
from .resume import Checkpointing, run_meta
from .scratch import make_scratch_dir, remove_stale_scratch_dirs
from .watchdog import EXIT_PREEMPTED
from .trainer import TrainConfig, fit, make_optimizer

DEFAULT_PARTITIONER = "metis"
SHARDS_PREFIX = "gnnpar-shards-"  # temporary shards of a --nprocs run without --partition-dir


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


def _has_shards(args) -> bool:
    return bool(args.partition_dir) and os.path.lexists(os.path.join(args.partition_dir,
                                                                     "meta.json"))


def check_shards_dataset(args, shard_dir: str, meta=None) -> None:
    """Refuse shards of another graph than ``--dataset`` (without ``--dataset`` the shards are
    used as they are). Cheap when the shards record the same dataset identity (spec params,
    directed flag, input files' size and mtime); otherwise the dataset is loaded and its
    fingerprint compared with the shards'."""
    if not args.dataset:
        return
    from gnnpar.partitioners.shards import dataset_source, read_meta
    meta = meta if meta is not None else read_meta(shard_dir)
    source = meta.get("source") or {}
    if source.get("key") == dataset_source(args.dataset, args.directed)["key"]:
        return
    if _load(args).fingerprint() != meta["fingerprint"]:
        written = source.get("spec") or f"a graph of fingerprint {meta['fingerprint']}"
        written += " --directed" if source.get("directed") else ""
        given = args.dataset + (" --directed" if args.directed else "")
        raise InputError(f"--partition-dir {shard_dir} holds shards of {written}, not of "
                         f"--dataset {given}; give the dataset they were written for, drop "
                         "--dataset, or use another --partition-dir")


def _check_shards_on_rank_0(rank: int, args, shard_dir: str) -> None:
    """Launched ranks (all together): rank 0 runs :func:`check_shards_dataset`, which may load
    the dataset; the others take its verdict, so a job loads the whole graph at most once."""
    from gnnpar.kernels.comm import control_all_reduce
    failure = None
    if rank == 0:
        try:
            check_shards_dataset(args, shard_dir)
        except InputError as e:
            failure = e
    verdict = control_all_reduce(torch.tensor([0 if failure is None else 1]), "max")
    if failure is not None:
        raise failure
    if int(verdict[0]):
        raise InputError(f"--partition-dir {shard_dir} does not hold shards of --dataset "
                         f"{args.dataset} (rank 0 says which graph it holds)")


def _load(args):
    return load_dataset(args.dataset or DEFAULT_SPEC, directed=args.directed,
                        cache_dir=args.cache_dir)


def resolve_auto(args, world: int):
    """``--algo auto``: take the cost model's best algorithm, grid and variant that fits.
    Returns the graph when it had to load it (so the caller need not load it again)."""
    from .plan_cli import plan
    from gnnpar.partitioners.shards import read_meta
    g = None
    if _has_shards(args):
        meta = read_meta(args.partition_dir)
        n, m, f_in, classes = meta["n"], meta["nnz"], meta["num_features"], meta["num_classes"]
    else:
        g = _load(args)
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
    return g


def prepare_shards(args, world: int, graph=None):
    """Write shards for ``world`` ranks unless ``--partition-dir`` already holds them; returns
    the folder and whether it is a temporary one made here (``shards/`` inside a
    :mod:`~gnnpar.scratch` folder: the caller removes that folder, its parent)."""
    from gnnpar.partitioners import partition_graph, write_shards
    from gnnpar.partitioners.shards import check_shard_folder, dataset_source, read_meta
    out = args.partition_dir
    if _has_shards(args):
        meta = read_meta(out)
        if int(meta["parts"]) != world:
            raise InputError(f"the shards in {out} are for {meta['parts']} ranks but --nprocs is "
                             f"{world}; rerun gnnpar-partition with --parts {world}")
        check_shards_dataset(args, out, meta)
        args.shards_checked = out  # the ranks need not compare the dataset again
        return out, False
    if out:
        check_shard_folder(out, "--partition-dir")  # refused before anything is loaded
    source = dataset_source(args.dataset or DEFAULT_SPEC, args.directed)
    temporary = not out
    if temporary:  # shards/ inside a scratch folder that records its owner
        remove_stale_scratch_dirs(SHARDS_PREFIX, allow_dirs=True)
        out = os.path.join(make_scratch_dir(SHARDS_PREFIX), "shards")
    try:
        graph = graph if graph is not None else _load(args)
        if not args.quiet:
            print(graph.summary(), file=sys.stderr)
        part = partition_graph(graph, world, args.partitioner or DEFAULT_PARTITIONER,
                               seed=args.seed)
        write_shards(graph, part, out, norms=("gcn", "mean"), source=source,
                     what="--partition-dir" if not temporary else "shard folder")
    except BaseException:
        if temporary:  # every way out: no gnnpar-shards-* is left in $TMPDIR
            shutil.rmtree(os.path.dirname(out), ignore_errors=True)
        raise
    args.shards_checked = out
    return out, temporary


def rank_body(rank: int, world: int, args, shard_dir, watchdog=None) -> dict:
    """Everything one rank does once the process group exists; returns the final metrics.
    ``watchdog`` (external launches) is told each communication phase, so a lost peer is
    reported with what this rank was doing."""
    from .distributed import DistRuntime
    device = torch.device(args.device_resolved)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    if args.mode == "minibatch":
        from .sampling.run import minibatch_rank
        return minibatch_rank(rank, world, args, shard_dir, device)
    shape, build_grid = make_run_grid(args, world)
    grid = build_grid()
    shard = load_rank_shard(rank, world, args, shard_dir)
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    f_in = int(shard.x.shape[1])
    model = build_model(args.model, f_in, args.hidden, int(shard.num_classes), args.layers,
                        args.dropout).to(device)
    torch.manual_seed(args.seed * 1000003 + rank)  # dropout masks differ between ranks' rows
    rt = DistRuntime(grid, shard, args.algo, model.norm, device, **algo_kwargs(args))
    if watchdog is not None:
        rt.comm.on_phase = watchdog.set_phase
    cfg = TrainConfig(epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay)
    opt = make_optimizer(model, cfg)
    meta = run_meta(args, world, list(shape.values()), shard_fingerprint(shard, args))
    ckpt = Checkpointing(args, rank, meta, model, opt, args.quiet or rank != 0)
    fields = {"algo": args.algo, "world_size": world, "grid": list(shape.values())}
    final = train_logged(lambda on_epoch, start: fit(model, rt, cfg, on_epoch, start, opt),
                         model, args, fields, rank == 0, f"train[{args.algo} x{world}]",
                         {"f_in": f_in, "f_out": int(shard.num_classes)}, ckpt=ckpt)
    return final


def load_rank_shard(rank: int, world: int, args, shard_dir):
    """This rank's shard: memory-mapped from ``shard_dir``, or (no shards written) cut from
    the dataset in memory — every rank loads the whole graph then, fine for small graphs."""
    from gnnpar.partitioners.shards import load_shard
    if shard_dir is not None:
        if getattr(args, "shards_checked", None) != shard_dir:  # launched: not checked yet
            _check_shards_on_rank_0(rank, args, shard_dir)
        return load_shard(shard_dir, rank, world_size=world)
    from gnnpar.partitioners import partition_graph
    from gnnpar.partitioners.shard_build import build_shard
    graph = load_dataset(args.dataset or DEFAULT_SPEC, directed=args.directed)
    return build_shard(graph, partition_graph(graph, world,
                                              args.partitioner or DEFAULT_PARTITIONER,
                                              seed=args.seed), rank)


def shard_fingerprint(shard, args) -> str:
    """Dataset fingerprint plus partitioning, as a checkpoint records it."""
    meta = shard.meta or {}
    data = meta.get("fingerprint") or f"{args.dataset or DEFAULT_SPEC}|directed={args.directed}"
    return f"{data}|{meta.get('method')}|seed={meta.get('seed')}|parts={meta.get('parts')}"


def _spawned(rank, world, args, shard_dir):
    return rank_body(rank, world, args, shard_dir)


def run_distributed(args) -> dict:
    """Entry from ``gnnpar-train``: spawn ``--nprocs`` local ranks, or join the world of the
    launcher that started this process (torchrun, srun, mpirun; see ``gnnpar.bootstrap``)."""
    from .bootstrap import detect_world, resolve_backend
    info = detect_world(args.nprocs)
    graph = resolve_auto(args, info.world_size) if args.algo == "auto" else None
    backend = args.backend
    if backend == "auto" and torch.device(args.device_resolved).type == "cpu":
        backend = "gloo"  # a GPU host asked to train on CPU: NCCL cannot carry CPU tensors
    if info.source == "local":
        return _spawn_local(args, resolve_backend(backend, info)[0], graph)
    return _join_launched(args, info, backend)


def _spawn_local(args, backend: str, graph=None) -> dict:
    from .spawn import SpawnError, spawn
    if args.mode != "minibatch":
        make_run_grid(args, args.nprocs)  # fail before spawning
    shard_dir, temporary = None, False
    with _sigterm_unwinds():  # a SIGTERM while shards are written still removes them
        try:
            shard_dir, temporary = prepare_shards(args, args.nprocs, graph)
            return spawn(_spawned, args.nprocs, args=(args, shard_dir), backend=backend,
                         timeout_s=args.timeout)[0]
        except SpawnError as e:
            if e.kind == "input":
                raise InputError(e.first_line.split(": ", 1)[-1]) from None
            if e.kind == f"exit:{EXIT_PREEMPTED}":
                print("gnnpar-train: preempted (SIGTERM): checkpoint written", file=sys.stderr)
                raise SystemExit(EXIT_PREEMPTED)
            raise RuntimeError(str(e).splitlines()[0]) from None
        finally:
            if temporary:
                shutil.rmtree(os.path.dirname(shard_dir), ignore_errors=True)


@contextmanager
def _sigterm_unwinds():
    """SIGTERM raises ``SystemExit(143)`` in this (main) thread, so every ``finally`` runs
    (while ranks run, spawn passes SIGTERM on to them and re-raises it here afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def preempted(signum, frame):
        raise SystemExit(EXIT_PREEMPTED)
    old = signal.signal(signal.SIGTERM, preempted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _join_launched(args, info, backend: str) -> dict:
    """One rank of an external launch: join, watch the peers, train, leave."""
    from .bootstrap import init_distributed, shutdown
    from .watchdog import Watchdog
    ctx = init_distributed(info, backend, args.timeout)
    if ctx.device.type == "cuda":
        args.device_resolved = str(ctx.device)
    wd = Watchdog(info.rank, info.world_size, timeout=args.timeout).start()
    try:
        with wd.guard():
            return rank_body(info.rank, info.world_size, args, args.partition_dir, wd)
    finally:
        wd.stop()
        shutdown()
