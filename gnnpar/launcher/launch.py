"""Find the world and start the ranks; nothing else (each rank's setup is
:mod:`gnnpar.training.rank`).

- serial (no ``--nprocs``, no launcher): :func:`gnnpar.training.rank.run_rank` in this process;
- ``--nprocs N``: write the shards once (:mod:`gnnpar.training.shard_source`) and spawn N local
  ranks (:mod:`gnnpar.launcher.spawn`), each memory-mapping only its shard; the scratch shards are
  removed
  on every way out, SIGTERM included;
- launched (``torchrun``, ``srun``, ``mpirun``; :mod:`gnnpar.launcher.bootstrap` reads the world):
  this process is one rank; it joins the process group, a watchdog watches its peers.

World-size decisions are made here, once, before any rank runs: ``--algo auto`` (the cost
model's best algorithm, grid and variant that fits) and the backend. They go into a new
:class:`~gnnpar.cli.spec.RunSpec`; nothing below rewrites it.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Optional

import torch

from gnnpar.datasets import Graph, InputError
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.cost_model import Structure
from gnnpar.kernels.cpu_spmm import size_pool
from gnnpar.partitioners.shards import read_meta

from gnnpar.training.adam import optimizer_imports_dynamo
from gnnpar.launcher.bootstrap import (WorldInfo, detect_world, init_distributed, resolve_backend,
                                       shutdown)
from gnnpar.cli.cli_common import apply_max_memory
from gnnpar.cli.plan_cli import plan
from gnnpar.training.rank import run_rank
from gnnpar.training.shard_source import (ShardSource, check_shard_flags, has_shards, load_graph,
                                          prepare_shards, resolve_reorder, run_partition)
from gnnpar.launcher.server_fork import start_now
from gnnpar.launcher.spawn import SpawnError, spawn
from gnnpar.cli.spec import RunSpec
from gnnpar.launcher.watchdog import EXIT_PEER_LOST, EXIT_PREEMPTED, Watchdog


def launch(spec: RunSpec, job: Callable = run_rank) -> dict:
    """Run ``spec`` to the end; returns the final record (rank 0's when there are ranks).
    ``job(spec, rank, world, source, watchdog)`` is each rank's work (training; inference
    for ``gnnpar-predict``): a module-level function or a ``functools.partial`` of one, so
    spawned ranks can unpickle it.

    ``--threads T`` is each rank's budget: its trainer's torch threads and compiled SpMM pool
    (this process serially, every ``--nprocs`` rank alike; without it a rank gets cores /
    ranks). A mini-batch run's sampler threads come on top at the lowest OS priority on the
    CPU (:mod:`gnnpar.sampling.service`), using what the trainer leaves idle."""
    apply_max_memory(spec.data.max_memory)  # the limit of the load, the shards and the ranks
    if spec.train.threads:
        torch.set_num_threads(spec.train.threads)
    size_pool(torch.get_num_threads())  # a launcher's rank: its share, not every core
    distributed = (spec.parallel.algo != "serial" or spec.minibatch) and bool(
        spec.parallel.nprocs or detect_world().launched)
    spec = resolve_reorder(spec, not distributed and not spec.minibatch)
    check_shard_flags(spec)
    if distributed:
        return run_distributed(spec, job)
    if spec.parallel.algo != "serial":
        raise InputError(f"--algo {spec.parallel.algo} needs --nprocs N or a launcher "
                         "(torchrun, srun)")
    return job(spec)


def run_distributed(spec: RunSpec, job: Callable = run_rank) -> dict:
    """Spawn ``--nprocs`` local ranks, or join the world of the launcher that started this
    process."""
    info = detect_world(spec.parallel.nprocs)
    if info.source == "local" and torch.device(spec.train.device).type == "cpu":
        start_now()  # the ranks' fork server, forked from this process before it loads data
    graph = part = None
    if spec.parallel.algo == "auto":
        spec, graph, part = choose_algorithm(spec, info.world_size,
                                             exact=info.source == "local")
    backend = spec.parallel.backend
    if backend == "auto" and torch.device(spec.train.device).type == "cpu":
        backend = "gloo"  # a GPU host asked to train on CPU: NCCL cannot carry CPU tensors
    if info.source == "local":
        return _spawn_local(spec.evolve(backend=resolve_backend(backend, info)[0]), graph, part,
                            job)
    return _join_launched(spec, info, backend, job)


def choose_algorithm(spec: RunSpec, world: int, exact: bool = False):
    """``--algo auto``: the cost model's best algorithm, grid and variant that fits, as a new
    spec; the graph when it had to be loaded, and with ``exact`` its partition (so the shards
    need neither load nor partition it again; None otherwise).

    With ``exact`` (``--nprocs``, no ``--partition-dir`` shards) the graph is partitioned here
    as the run will partition it, and every algorithm is modelled on that partition's busiest
    rank (:class:`~gnnpar.kernels.cost_model.Structure`), with the blocks and the wire format
    ``spec`` gives the run (``--block-layout``, ``--seed``, ``--comm-dtype``, ``--precision``),
    as ``gnnpar-plan --partitioner`` does with the same flags; otherwise (shards already
    written, or ranks of a launcher, which partition on their own) the average-rank estimate
    ranks them, with the run's wire format."""
    graph: Optional[Graph] = None
    part = structure = None
    if has_shards(spec):
        meta = read_meta(spec.parallel.partition_dir)
        n, m, f_in, classes = meta["n"], meta["nnz"], meta["num_features"], meta["num_classes"]
    else:
        graph = load_graph(spec)
        n, m = graph.num_nodes, graph.num_edges + graph.num_nodes
        f_in, classes = graph.num_features, graph.num_classes
        if exact:
            part = run_partition(spec, graph, world)
            structure = Structure.from_graph(graph, part.owner, world)
    rows = plan(n, m, f_in, spec.model.hidden, classes, spec.model.layers, world,
                spec.model.model, spec.settings(), structure=structure)
    best = rows[0]
    if not best["fits"]:
        lean = min(rows, key=lambda r: r["memory"])
        raise InputError(f"no algorithm fits --mem-cap {spec.parallel.mem_cap} on {world} "
                         f"ranks (the leanest, {lean['algo']} {lean['grid']}, needs "
                         f"{lean['memory'] / 2**20:.1f} MiB per rank)")
    reads = algorithm(best["algo"]).flags  # only the layout flags the algorithm reads
    chosen = spec.evolve(
        algo=best["algo"], grid=best["grid"] if "grid" in reads else None,
        replication=best["replication"] if "replication" in reads else None,
        # recorded in the run identity as it always was (1d/1d-halo name their data movement)
        variant=best["variant"] if best["variant"] in ("halo", "bcast") else None)
    if not spec.output.quiet:
        print(f"--algo auto chose {chosen.parallel.algo} grid {best['grid']} ({best['variant']}): "
              f"modelled {best['time_s']:.4f} s/epoch, {best['memory'] / 2**20:.1f} MiB/rank"
              + (" (busiest rank of the run's partition)" if structure is not None else ""),
              file=sys.stderr)
    return chosen, graph, part


def _spawned(rank: int, world: int, spec: RunSpec, source: ShardSource,
             job: Callable = run_rank) -> dict:
    return job(spec, rank, world, source)


def _spawn_local(spec: RunSpec, graph: Optional[Graph] = None, part=None,
                 job: Callable = run_rank) -> dict:
    if not spec.minibatch:
        spec.grid_shape(spec.parallel.nprocs)  # fail before writing shards or spawning
    source, temporary = None, False
    with _sigterm_unwinds() as sigterm:  # a SIGTERM while shards are written removes them
        try:
            source, temporary = prepare_shards(spec, spec.parallel.nprocs, graph, part)
            _raise_if_preempted(sigterm)
            par = spec.parallel
            return spawn(_spawned, par.nprocs, args=(spec, source, job), backend=par.backend,
                         timeout_s=par.timeout, threads=spec.train.threads,
                         dynamo_first=optimizer_imports_dynamo(spec.train.device))[0]
        except SpawnError as e:
            if e.failure.kind == "input":
                raise InputError(e.failure.message) from None
            if e.failure.exit_code == EXIT_PREEMPTED:
                # "exit": every rank left through its checkpoint's handler; else some rank
                # was stopped before it had one (while starting) and wrote nothing
                saved = ("checkpoint written" if e.failure.kind == "exit" else
                         "no new checkpoint" if spec.checkpoint.checkpoint_dir else "no checkpoint")
                print(f"gnnpar-train: preempted (SIGTERM): {saved}", file=sys.stderr)
                raise SystemExit(EXIT_PREEMPTED)
            if e.failure.kind in ("died", "hung"):  # a lost rank, as a launcher's watchdog says
                print(f"gnnpar-train: {e.headline}; the other ranks were stopped",
                      file=sys.stderr)
                raise SystemExit(EXIT_PEER_LOST)
            raise RuntimeError(e.headline) from None
        finally:
            if temporary:
                shutil.rmtree(os.path.dirname(source.folder), ignore_errors=True)


@contextmanager
def _sigterm_unwinds():
    """SIGTERM raises ``SystemExit(143)`` in this (main) thread, so every ``finally`` runs
    (while ranks run, spawn passes SIGTERM on to them and re-raises it here afterwards).

    A handler's exception is lost when the signal lands while C code is calling back into
    Python (numba's compiler does, while the shard kernels compile): Python prints
    "Exception ignored" and goes on. So the signal is also recorded, and
    :func:`_raise_if_preempted` raises it again once the shards are written."""
    state = {"received": False}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def preempted(signum, frame):
        state["received"] = True
        raise SystemExit(EXIT_PREEMPTED)
    old = signal.signal(signal.SIGTERM, preempted)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, old)


def _raise_if_preempted(sigterm: dict) -> None:
    """Raise the SIGTERM that :func:`_sigterm_unwinds` recorded, if its own raise was lost."""
    if sigterm["received"]:
        raise SystemExit(EXIT_PREEMPTED)


def _join_launched(spec: RunSpec, info: WorldInfo, backend: str,
                   job: Callable = run_rank) -> dict:
    """One rank of an external launch: join, watch the peers, train, leave."""
    ctx = init_distributed(info, backend, spec.parallel.timeout)
    if ctx.device.type == "cuda":
        spec = spec.evolve(device=str(ctx.device))
    wd = Watchdog(info.rank, info.world_size, timeout=spec.parallel.timeout).start()
    try:
        with wd.guard():
            return job(spec, info.rank, info.world_size,
                       ShardSource(spec.parallel.partition_dir), wd)
    finally:
        wd.stop()
        shutdown()
