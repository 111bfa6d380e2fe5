"""``gnnpar-train --mode minibatch``: build the pieces for one process or for one rank.

Serial (one process, the reference)::

    gnnpar-train --mode minibatch --dataset rmat:scale=17,ef=16 --model sage \\
        --fanouts 15,10,5 --batch-size 1024 --macrobatch 4 --sampler-workers 1 --prefetch 2

Data parallel on N local ranks (shards written once, features stay partitioned)::

    gnnpar-train --mode minibatch --nprocs 4 --fanouts 10,5 --batch-size 1024 \\
        --macrobatch 16 --cache-frac 0.1

Per rank: the sampling structure, replicated (:mod:`~gnnpar.sampling.topology`, gathered
from the shards) or partitioned (:mod:`~gnnpar.sampling.partitioned`,
``--no-replicate-graph``), its own feature rows plus the owner map and cache
(:mod:`~gnnpar.sampling.features`), its training seeds, and one process group per sampler
worker besides the trainer's (gradients) and the evaluator's (halo exchange).
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from gnnpar.datasets import DEFAULT_SPEC, load_dataset
from gnnpar.kernels.local import as_tensor

from .bulk import BulkSampler
from .cache import PRESAMPLE_EPOCH, cache_size, choose_cache
from .features import FeatureStore
from .grouped import Group, GroupedService
from .loop import DataParallel, fit_minibatch
from .neighbor import SamplerConfig, batch_rng
from .partitioned import PartitionedTopology
from .placement import Placement, resolve_placement
from .seeds import EpochPlan
from .service import MacrobatchService, ServiceConfig
from .topology import Topology, gather_topology

#: minibatches the ``presample`` cache policy samples at setup (at most one epoch's).
PROBE_STEPS = 32


def _service_cfg(args, device, placement: Placement) -> ServiceConfig:
    return ServiceConfig(macrobatch=args.macrobatch or 1, workers=args.sampler_workers,
                         prefetch=args.prefetch, seed=args.seed, device=str(device),
                         sampler=placement.sample_on)


def _place(args, device, topo, store, grouped: bool, lead: bool) -> Placement:
    """Resolve ``--sample-on``/``--features-on`` (:mod:`.placement`), move the rows, say why
    a choice fell back (lead rank, unless --quiet)."""
    placement = resolve_placement(args.sample_on, args.features_on, device,
                                  replicated=bool(topo.replicated), grouped=grouped,
                                  feature_bytes=store.nbytes(), topo_bytes=topo.nbytes())
    if placement.features_on == "device" or torch.device(device).type == "cpu":
        store.to(device)  # on a CPU: the owner map as tensors, for device-sampled ids
    if lead and not args.quiet:
        for note in placement.notes:
            print(f"gnnpar-train: note: {note}", file=sys.stderr)
    return placement


def _train_cfg(args):
    from gnnpar.trainer import TrainConfig
    return TrainConfig(epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay)


def run_serial_cli(args, device) -> dict:
    """One process, whole graph in memory: train, log, save; returns the final record."""
    from gnnpar.models import build_model
    from gnnpar.serial import SerialRuntime
    graph = load_dataset(args.dataset or DEFAULT_SPEC, directed=args.directed,
                         cache_dir=args.cache_dir)
    if not args.quiet:
        print(graph.summary(), file=sys.stderr)
    torch.manual_seed(args.seed)
    model = build_model(args.model, graph.num_features, args.hidden, graph.num_classes,
                        args.layers, args.dropout).to(device)
    topo = Topology.from_graph(graph, (model.norm,))
    store = FeatureStore.local(graph.x)
    placement = _place(args, device, topo, store, False, True)
    seeds = np.flatnonzero(np.asarray(graph.train_mask))
    plan = EpochPlan(seeds, [seeds.shape[0]], 0, args.batch_size, args.seed)
    service = MacrobatchService(topo, store, plan,
                                SamplerConfig(args.fanouts, model.norm, args.replace),
                                _service_cfg(args, device, placement),
                                torch.as_tensor(np.asarray(graph.y, np.int64)))
    eval_rt = SerialRuntime(graph, model.norm, device)
    info = {"topology_bytes": topo.nbytes(), "replicate_graph": True, "cache_rows": 0,
            "sample_on": placement.sample_on, "features_on": placement.features_on}
    return _train_and_log(model, service, DataParallel(), eval_rt, args, 1, info, True,
                          {"f_in": graph.num_features, "f_out": graph.num_classes}, 0,
                          graph.fingerprint() if args.checkpoint_dir else None)


def _train_and_log(model, service, engine, eval_rt, args, world, info, lead, shapes,
                   rank: int = 0, fingerprint=None) -> dict:
    """Fit with a JSON line per epoch (lead rank), checkpoints, the final record and saved
    weights (``gnnpar.logged.train_logged``)."""
    from gnnpar.logged import train_logged
    from gnnpar.resume import Checkpointing, run_meta
    from gnnpar.trainer import make_optimizer
    cfg = _train_cfg(args)
    fields = {"algo": "data-parallel" if world > 1 else "serial", "world_size": world,
              "grid": [world], "mode": "minibatch", "eval": "full-neighbourhood",
              **info.pop("layout", {})}
    opt = make_optimizer(model, cfg)
    meta = run_meta(args, world, fields["grid"], fingerprint)
    meta["sample_on"] = info["sample_on"]  # the device sampler draws other blocks (hash draws)
    ckpt = Checkpointing(args, rank, meta, model, opt, args.quiet or not lead)
    return train_logged(
        lambda on_epoch, start: fit_minibatch(model, service, engine, eval_rt, cfg, on_epoch,
                                              start, opt),
        model, args, fields, lead, f"minibatch x{world}", shapes,
        extra_final=lambda history: {**final_sampling(history), **info}, ckpt=ckpt)


class _EvalRuntime:
    """What :func:`gnnpar.trainer.evaluate` needs: the 1D halo-exchange operator over this
    rank's rows, the rows' features (shared with the feature store), labels and masks."""

    def __init__(self, shard, grid, store: FeatureStore, norm: str, device):
        from gnnpar.kernels.build import build_operator
        from gnnpar.kernels.comm import Comm
        self.comm = Comm(grid)
        with self.comm.in_phase("setup"):
            self.op = build_operator("1d-halo", shard, self.comm, norm, device)
        self.x = store.x.to(device)
        self.y = as_tensor(shard.y, np.int64).to(device)
        self.masks = {s: as_tensor(getattr(shard, f"{s}_mask"), np.bool_).to(device)
                      for s in ("train", "val", "test")}

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.comm.reduce_control(t, "row")


def build_rank(rank: int, world: int, shard, args, norm: str, device):
    """Everything rank ``rank`` needs but the model: (service, engine, eval runtime, info).

    ``args.algo`` other than ``serial`` splits the ranks into groups that each run one sampled
    subgraph on a distributed SpMM (:mod:`~gnnpar.sampling.grouped`)."""
    from gnnpar.kernels.comm import Comm
    from gnnpar.kernels.grid import ProcessGrid
    grid = ProcessGrid.create({"data": world})
    comm = Comm(grid)
    group = None if args.algo == "serial" else Group.create(args, world)
    with comm.in_phase("setup"):
        store = FeatureStore.from_shard(shard, comm, "data")
        if args.replicate_graph:
            topo = gather_topology(shard, comm, "data", (norm,))
        else:
            topo = PartitionedTopology.from_shard(shard, comm, "data", (norm,), store.owner,
                                                  store.local_index, store.rank)
        train = np.asarray(shard.train_mask)
        seeds = np.asarray(shard.global_ids)[train]
        if group is not None:
            seeds, labels = group.gather_seeds(seeds, np.asarray(shard.y, np.int64)[train])
        counts = [int(c) for c in torch.cat(comm.all_gather(torch.tensor([seeds.shape[0]]),
                                                             "data"))]
    if group is not None:  # every member holds its group's seeds: one count per group
        counts, stream = counts[::group.g], group.index
    else:
        stream = rank
    plan = EpochPlan(seeds, counts, stream, args.batch_size, args.seed)
    sampler = SamplerConfig(args.fanouts, norm, args.replace)
    n_cache = cache_size(args.cache_frac, topo.num_nodes, shard.n_local)
    probe = None
    if args.cache_policy == "presample" and n_cache:
        with comm.in_phase("setup"):
            probe = _presample_inputs(topo, sampler, plan, args.seed, (comm, "data"))
    ids = choose_cache(args.cache_policy, topo, store.owner != store.rank, n_cache, probe)
    with comm.in_phase("setup"):
        table, _ = store.fetch(ids, comm, "data", use_cache=False)
    store.set_cache(ids, table.remote_rows)
    placement = _place(args, device, topo, store, group is not None, rank == 0)
    workers = [(Comm(ProcessGrid.create({"data": world})), "data")
               for _ in range(args.sampler_workers)]
    eval_rt = _EvalRuntime(shard, ProcessGrid.create({"row": world}), store, norm, device)
    setup_bytes, _, _ = comm.reset()
    info = {"topology_bytes": topo.nbytes(), "replicate_graph": bool(topo.replicated),
            "cache_rows": int(ids.shape[0]), "cache_bytes": store.cache_bytes(),
            "sample_on": placement.sample_on, "features_on": placement.features_on}
    if group is None:
        service = MacrobatchService(topo, store, plan, sampler,
                                    _service_cfg(args, device, placement),
                                    as_tensor(shard.y, np.int64), workers)
        engine = DataParallel(comm, "data")
    else:
        service = GroupedService(topo, store, plan, sampler,
                                 _service_cfg(args, device, placement),
                                 (seeds, labels), workers, group.me, group.g, group.offset)
        engine = group.engine(norm, device)
        setup_bytes += group.comm.reset()[0]
        info["layout"] = group.fields()
    info["setup_bytes"] = setup_bytes
    return service, engine, eval_rt, info


def _presample_inputs(topo, sampler: SamplerConfig, plan: EpochPlan, seed: int, link) -> list:
    """Input ids of up to PROBE_STEPS minibatches of this rank's seeds (own epoch tag; the
    same count on every rank, so a partitioned structure's lookups pair up)."""
    steps = min(plan.steps, PROBE_STEPS)
    seeds = plan.minibatches(PRESAMPLE_EPOCH)[:steps]
    rngs = [batch_rng(seed, PRESAMPLE_EPOCH, plan.stream, s) for s in range(steps)]
    blocks = BulkSampler(topo, sampler).sample(seeds, rngs, link=None if topo.replicated else link)
    return [b[0].src_ids for b in blocks]


def minibatch_rank(rank: int, world: int, args, shard_dir, device) -> dict:
    """One rank of a data-parallel minibatch run (process group up); the final record."""
    from gnnpar.models import build_model
    shard = _load_shard(rank, world, args, shard_dir)
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    f_in, f_out = int(shard.x.shape[1]), int(shard.num_classes)
    model = build_model(args.model, f_in, args.hidden, f_out, args.layers,
                        args.dropout).to(device)
    service, engine, eval_rt, info = build_rank(rank, world, shard, args, model.norm, device)
    torch.manual_seed(args.seed * 1000003 + rank)  # dropout masks differ between ranks
    from gnnpar.dist_train import shard_fingerprint
    return _train_and_log(model, service, engine, eval_rt, args, world, info, rank == 0,
                          {"f_in": f_in, "f_out": f_out}, rank, shard_fingerprint(shard, args))


def _load_shard(rank: int, world: int, args, shard_dir):
    from gnnpar.dist_train import load_rank_shard
    return load_rank_shard(rank, world, args, shard_dir)


def final_sampling(history) -> dict:
    """Run totals of the sampling fields for the final JSON record."""
    keys = ("sampled_edges", "input_nodes", "unique_input_nodes", "feat_bytes", "sampler_s",
            "stall_s")
    return {k: sum(r[k] for r in history) for k in keys} if history else {}
