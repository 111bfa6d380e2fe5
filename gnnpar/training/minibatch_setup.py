"""Mini-batch training's part of a rank's setup (:mod:`gnnpar.training.rank` does the rest).

:func:`serial_parts` (one process, the whole graph) and :func:`build_rank` (rank ``rank`` of
a data-parallel or grouped run, from its shard) build the :class:`MiniBatchParts`: the
macrobatch service, the engine, the full-graph evaluation runtime and the run's setup facts.
Per rank: the sampling structure, replicated (:mod:`~gnnpar.sampling.topology`, gathered
from the shards) or partitioned (:mod:`~gnnpar.sampling.partitioned`,
``--no-replicate-graph``), its own feature rows plus the owner map and cache
(:mod:`~gnnpar.sampling.features`), its training seeds, and one process group per sampler
worker besides the trainer's (gradients) and the evaluator's (halo exchange).

Commands::

    gnnpar-train --mode minibatch --dataset rmat:scale=17,ef=16 --model sage \\
        --fanouts 15,10,5 --batch-size 1024 --macrobatch 4 --sampler-workers 1 --prefetch 2
    gnnpar-train --mode minibatch --nprocs 4 --fanouts 10,5 --batch-size 1024 \\
        --macrobatch 16 --cache-frac 0.1
"""
from __future__ import annotations

import sys
from typing import NamedTuple, Optional

import numpy as np
import torch

from gnnpar.datasets import Graph
from gnnpar.interfaces import SPLITS, MiniBatchEngine, Reducer, Runtime
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.comm import Comm
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.kernels.local import as_tensor
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import usable_cores
from gnnpar.training.trainer import RuntimeCollectives

from gnnpar.sampling.bulk import BulkSampler
from gnnpar.sampling.cache import PRESAMPLE_EPOCH, cache_size, choose_cache
from gnnpar.sampling.features import FeatureStore
from gnnpar.sampling.grouped import Group, GroupedService
from gnnpar.training.minibatch_loop import DataParallel
from gnnpar.sampling.neighbor import SamplerConfig, batch_rng
from gnnpar.sampling.options import pipeline_depth
from gnnpar.sampling.partitioned import PartitionedTopology
from gnnpar.sampling.placement import Placement, resolve_placement
from gnnpar.sampling.seeds import EpochPlan
from gnnpar.sampling.service import MacrobatchService, ServiceConfig
from gnnpar.sampling.topology import Topology, gather_topology

#: minibatches the ``presample`` cache policy samples at setup (at most one epoch's).
PROBE_STEPS = 32


def _service_cfg(spec, device, placement: Placement, burst: bool = False,
                 workers: Optional[int] = None, input_dropout: float = 0.0) -> ServiceConfig:
    """The service's settings: ``workers`` sampler threads (default ``--sampler-workers``,
    else 1; a rank's count must be every rank's, one communicator each); with ``burst``,
    sampling in bursts of that many macrobatches, holding at least that many ahead;
    ``input_dropout``: the model's input dropout, done by the sampler (``ServiceConfig``)."""
    workers = workers or spec.batch.sampler_workers or 1
    k, ahead = pipeline_depth(spec.batch.macrobatch, spec.batch.prefetch, workers,
                              host_samples=placement.sample_on == "host")
    return ServiceConfig(macrobatch=k, workers=workers,
                         prefetch=max(ahead, workers) if burst else ahead, seed=spec.train.seed,
                         device=str(device), sampler=placement.sample_on, burst=burst,
                         input_dropout=input_dropout)


def _serial_cfg(spec, device, placement: Placement, input_dropout: float = 0.0
                ) -> ServiceConfig:
    """A one-process run's settings: in bursts (:func:`samples_in_bursts`) as many workers
    as the trainer has threads, unless ``--sampler-workers`` says."""
    if samples_in_bursts(spec, device, placement):
        return _service_cfg(spec, device, placement, True,
                            spec.batch.sampler_workers or torch.get_num_threads(), input_dropout)
    return _service_cfg(spec, device, placement, input_dropout=input_dropout)


def samples_in_bursts(spec, device, placement: Placement) -> bool:
    """Whether a one-process run samples in bursts (:mod:`.service`): as
    ``--sample-in-bursts`` says, else on the CPU, sampled by the host, with the trainer's
    threads on every core this process may use (no core is left idle for workers running
    beside it)."""
    if spec.batch.sample_in_bursts is not None:
        return spec.batch.sample_in_bursts
    return (torch.device(device).type == "cpu" and placement.sample_on == "host"
            and torch.get_num_threads() >= usable_cores())


def _place(spec, device, topo, store, grouped: bool, lead: bool) -> Placement:
    """Resolve ``--sample-on``/``--features-on`` (:mod:`.placement`), move the rows, say why
    a choice fell back (lead rank, unless --quiet)."""
    placement = resolve_placement(spec.batch.sample_on, spec.batch.features_on, device,
                                  replicated=bool(topo.replicated), grouped=grouped,
                                  feature_bytes=store.nbytes(), topo_bytes=topo.nbytes())
    if placement.features_on == "device" or torch.device(device).type == "cpu":
        store.to(device)  # on a CPU: the owner map as tensors, for device-sampled ids
    if lead and not spec.output.quiet:
        for note in placement.notes:
            print(f"gnnpar-train: note: {note}", file=sys.stderr)
    return placement


class MiniBatchParts(NamedTuple):
    """What a mode-independent rank setup needs from mini-batch training."""

    service: MacrobatchService
    engine: MiniBatchEngine
    eval_runtime: Runtime
    info: dict  #: setup facts for the final record (``layout``: extra log fields)


def serial_parts(spec, graph: Graph, norm: str, device, input_dropout: float = 0.0,
                 make_plan=None) -> MiniBatchParts:
    """One process, the whole graph in memory. ``input_dropout``: the model's input dropout
    when the sampler may do it for the model (``ServiceConfig.input_dropout``: a
    :class:`gnnpar.nn.models.GNN`), else 0. ``make_plan(stream, world)``: the steps' seeds of
    another task than node classification (:class:`gnnpar.link.minibatch.LinkPlan`), else
    the training mask's nodes."""
    topo = Topology.from_graph(graph, (norm,))
    store = FeatureStore.local(graph.x)
    placement = _place(spec, device, topo, store, False, True)
    seeds = np.flatnonzero(np.asarray(graph.train_mask))
    plan = (EpochPlan(seeds, [seeds.shape[0]], 0, spec.batch.batch_size, spec.train.seed)
            if make_plan is None else make_plan(0, 1))
    service = MacrobatchService(topo, store, plan,
                                SamplerConfig(spec.batch.fanouts, norm, spec.batch.replace),
                                _serial_cfg(spec, device, placement, input_dropout),
                                torch.as_tensor(np.asarray(graph.y, np.int64)))
    info = {"topology_bytes": topo.nbytes(), "replicate_graph": True, "cache_rows": 0,
            "sample_on": placement.sample_on, "features_on": placement.features_on}
    return MiniBatchParts(service, DataParallel(), SerialRuntime(graph, norm, device), info)


class _EvalRuntime(RuntimeCollectives):
    """What :func:`gnnpar.training.trainer.evaluate` needs: the 1D halo-exchange operator over this
    rank's rows, the rows' features (shared with the feature store), labels and masks."""

    def __init__(self, shard, grid, store: FeatureStore, norm: str, device):
        self.comm = Comm(grid)
        self.reducer = Reducer(self.comm, "row")
        with self.comm.in_phase("setup"):
            self.op = algorithm("1d-halo").build(shard, self.comm, norm, device)
        self.x = store.x.to(device)
        self.world_axes = ("row",)
        self.global_ids = np.asarray(shard.global_ids, np.int64)
        self.y = as_tensor(shard.y, np.int64).to(device)
        self.masks = {s: as_tensor(getattr(shard, f"{s}_mask"), np.bool_).to(device)
                      for s in SPLITS}


def build_rank(rank: int, world: int, shard, spec, norm: str, device,
               input_dropout: float = 0.0, make_plan=None) -> MiniBatchParts:
    """Everything rank ``rank`` needs but the model (``input_dropout``, ``make_plan``: as
    :func:`serial_parts`; data parallel only: a group's ranks each hold part of the input).

    ``spec.parallel.algo`` other than ``serial`` splits the ranks into groups that each run one
    sampled subgraph on a distributed SpMM (:mod:`~gnnpar.sampling.grouped`)."""
    grid = ProcessGrid.create({"data": world})
    comm = Comm(grid)
    group = None if spec.parallel.algo == "serial" else Group.create(spec, world)
    with comm.in_phase("setup"):
        store = FeatureStore.from_shard(shard, comm, "data")
        if spec.batch.replicate_graph:
            topo = gather_topology(shard, comm, "data", (norm,))
        else:
            topo = PartitionedTopology.from_shard(shard, comm, "data", (norm,), store.owner,
                                                  store.local_index, store.rank)
        train = np.asarray(shard.train_mask)
        seeds = np.asarray(shard.global_ids)[train]
        group_seeds = None  # a group's (seed ids, their labels); another task's steps read none
        if group is not None and make_plan is None:
            group_seeds = group.gather_seeds(seeds, np.asarray(shard.y, np.int64)[train])
            seeds = group_seeds[0]
        counts = [int(c) for c in torch.cat(comm.all_gather(torch.tensor([seeds.shape[0]]),
                                                             "data"))]
    if group is not None:  # every member holds its group's seeds: one count per group
        counts, stream = counts[::group.g], group.index
    else:
        stream = rank
    plan = (EpochPlan(seeds, counts, stream, spec.batch.batch_size, spec.train.seed)
            if make_plan is None else make_plan(stream, len(counts)))
    sampler = SamplerConfig(spec.batch.fanouts, norm, spec.batch.replace)
    n_cache = cache_size(spec.batch.cache_frac, topo.num_nodes, shard.n_local)
    probe = None
    if spec.batch.cache_policy == "presample" and n_cache:
        with comm.in_phase("setup"):
            probe = _presample_inputs(topo, sampler, plan, spec.train.seed, (comm, "data"))
    ids = choose_cache(spec.batch.cache_policy, topo, store.owner != store.rank, n_cache, probe)
    with comm.in_phase("setup"):
        table, _ = store.fetch(ids, comm, "data", use_cache=False)
    store.set_cache(ids, table.remote_rows)
    placement = _place(spec, device, topo, store, group is not None, rank == 0)
    cfg = _service_cfg(spec, device, placement, bool(spec.batch.sample_in_bursts),
                       input_dropout=input_dropout if group is None else 0.0)
    workers = [(Comm(ProcessGrid.create({"data": world})), "data") for _ in range(cfg.workers)]
    eval_runtime = _EvalRuntime(shard, ProcessGrid.create({"row": world}), store, norm, device)
    setup_bytes = comm.reset().total_bytes
    info = {"topology_bytes": topo.nbytes(), "replicate_graph": bool(topo.replicated),
            "cache_rows": int(ids.shape[0]), "cache_bytes": store.cache_bytes(),
            "sample_on": placement.sample_on, "features_on": placement.features_on}
    # a node's label is its owner's row; another task's seeds may be any rank's nodes, and
    # carry no label its steps read
    if group is None:
        y = (as_tensor(shard.y, np.int64) if make_plan is None
             else torch.zeros(topo.num_nodes, dtype=torch.int64))
        service = MacrobatchService(topo, store, plan, sampler, cfg, y, workers)
        engine = DataParallel(comm, "data")
    else:
        service = GroupedService(topo, store, plan, sampler, cfg, group_seeds, workers,
                                 group.me, group.g, group.offset)
        engine = group.engine(norm, device)
        setup_bytes += group.comm.reset().total_bytes
        info["layout"] = group.fields()
    info["setup_bytes"] = setup_bytes
    return MiniBatchParts(service, engine, eval_runtime, info)


def _presample_inputs(topo, sampler: SamplerConfig, plan: EpochPlan, seed: int,
                      owners) -> list:
    """Input ids of up to PROBE_STEPS minibatches of this rank's seeds (own epoch tag; the
    same count on every rank, so a partitioned structure's lookups pair up)."""
    steps = min(plan.steps, PROBE_STEPS)
    seeds = plan.minibatches(PRESAMPLE_EPOCH)[:steps]
    rngs = [batch_rng(seed, PRESAMPLE_EPOCH, plan.stream, s) for s in range(steps)]
    blocks = BulkSampler(topo, sampler).sample(seeds, rngs,
                                               owners=None if topo.replicated else owners)
    return [b[0].src_ids for b in blocks]
