"""One rank's setup and training — the one path every run takes, serial or distributed,
full batch or mini batch.

:func:`run_rank` builds, in this order: the device, the rows (the whole graph for a serial
run, else this rank's shard, :mod:`gnnpar.training.shard_source`), the model (seeded alike on every
rank), the rank's own random stream (dropout differs between ranks), then what the mode adds
(:class:`Training`: full batch — a :class:`~gnnpar.interfaces.Runtime`; mini batch — the
sampling service and an engine, :mod:`gnnpar.training.minibatch_setup`), the optimiser,
checkpointing and the JSON log (:func:`gnnpar.training.logged.train_logged`; every record names the
run's
``precision``). The lead rank holds the log's lock (:func:`gnnpar.training.logged.holding_log`) from
before it loads anything until the run's outputs are written. The launcher
(:mod:`gnnpar.launcher.launch`) calls it in-process for a serial run and once per rank otherwise;
``docs/architecture.md`` follows one step of each mode file by file.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Union

import torch

from gnnpar.datasets import Graph
from gnnpar.kernels.blocks import nnz_balance

from gnnpar.interfaces import Shard
from gnnpar.link.decoders import build_decoder
from gnnpar.link.exchange import PairExchange
from gnnpar.link.loop import fit_link, link_modules
from gnnpar.link.minibatch import LinkPlan, link_minibatch_parts
from gnnpar.training.logged import holding_log, train_logged
from gnnpar.training.memory import RankMemory, array_bytes, halo_row_bytes, local_current_bytes
from gnnpar.nn.models import build_model, sampler_input_dropout
from gnnpar.training.resume import Checkpointing, run_meta
from gnnpar.sampling.draws import HASH_GENERATOR
from gnnpar.training.minibatch_loop import fit_minibatch
from gnnpar.training.minibatch_setup import build_rank, serial_parts
from gnnpar.training.shard_source import (ShardSource, load_graph, load_rank_shard,
                                          shard_fingerprint, vertex_order)
from gnnpar.cli.spec import RunSpec
from gnnpar.training.trainer import TrainConfig, fit, make_optimizer
from gnnpar.infer.prediction import PredictJob, hidden_layers, outputs_meta, predict_rows
from gnnpar.training.rows import fullbatch_runtime, rank_device


@dataclass
class Training:
    """What a mode adds to the common setup: ``fit(opt, cfg, on_epoch, start) -> records``,
    the run-level log ``fields`` and progress ``desc``, the grid recorded in checkpoints,
    extra final-record fields, and extra run-identity entries."""

    fit: Callable
    fields: dict
    desc: str
    grid: List[int]
    extra_final: Optional[Callable] = None
    identity: dict = field(default_factory=dict)
    rows: object = None  #: the full-batch runtime that evaluates (and predicts) the rows
    module: object = None  #: what the optimiser updates (None: the model)


def run_rank(spec: RunSpec, rank: int = 0, world: int = 1,
             source: Optional[ShardSource] = None, watchdog=None) -> dict:
    """Set up and train; returns the final record. ``source`` None: one process with the
    whole graph (serial); else this rank's shard. ``watchdog`` (external launches) is told
    each communication phase, so a lost peer is reported with what this rank was doing."""
    with holding_log(spec.output.log_json if rank == 0 else None):  # one writer per log
        return _run_rank(spec, rank, world, source, watchdog)


def _run_rank(spec: RunSpec, rank: int, world: int, source: Optional[ShardSource],
              watchdog) -> dict:
    device = rank_device(spec, rank)
    baseline = local_current_bytes(device)  # before any data: the process's own footprint
    data = load_graph(spec) if source is None else load_rank_shard(rank, world, spec, source)
    if source is None and not spec.output.quiet:
        print(data.summary(), file=sys.stderr)
    f_in, f_out = _dims(data)
    if spec.link.task == "link":  # the model's output rows are the embeddings pairs are scored on
        f_out = spec.model.hidden
    torch.manual_seed(spec.train.seed)  # identical initial weights on every rank
    model = build_model(spec.model.model, f_in, spec.model.hidden, f_out, spec.model.layers,
                        spec.model.dropout, spec.model.heads, spec.model.attn_dropout,
                        dict(spec.model.model_args)).to(device)
    build = _minibatch if spec.minibatch else _fullbatch
    if spec.link.task == "link":  # its decoder seeded as the model is, before the ranks differ
        decoder = build_decoder(spec.link.decoder, spec.model.hidden).to(device)
        build = functools.partial(_link, decoder)
    if source is not None:
        torch.manual_seed(spec.train.seed * 1000003 + rank)  # dropout masks differ between ranks
    training = build(spec, rank, world, data, model, device, watchdog, baseline)
    t = spec.train
    cfg = TrainConfig(epochs=t.epochs, lr=t.lr, weight_decay=t.weight_decay,
                      precision=t.precision)
    opt = make_optimizer(training.module or model, cfg)
    fingerprint = (shard_fingerprint(data, spec) if source is not None else
                   data.fingerprint() if spec.checkpoint.checkpoint_dir else None)
    meta = {**run_meta(spec, world, training.grid, fingerprint), **training.identity,
            **_numerics_identity(spec)}
    lead = rank == 0
    ckpt = Checkpointing(spec, rank, meta, training.module or model, opt,
                         spec.output.quiet or not lead)
    fields = {**training.fields, "precision": spec.train.precision,
              "comm_dtype": spec.parallel.comm_dtype,
              "reorder": vertex_order(spec)}  # the order the graph was loaded in
    final = train_logged(lambda on_epoch, start: training.fit(opt, cfg, on_epoch, start),
                         training.module or model, spec, fields, lead, training.desc,
                         {"f_in": f_in, "f_out": f_out}, extra_final=training.extra_final,
                         ckpt=ckpt)
    if spec.output.save_predictions and final.get("diverged_epoch") is None:
        # the trained model over the rows it trained on: no second load
        job = PredictJob(None, spec.output.save_predictions, embeddings=hidden_layers(model),
                         flag="--save-predictions", prog="gnnpar-train")
        predict_rows(model, training.rows, data, spec, job, rank, world,
                     outputs_meta(spec, spec.model.model, spec.output.save_model))
    return final


def _numerics_identity(spec: RunSpec) -> dict:
    """A bf16 run's checkpoints name their precision, and a run with a low-precision wire its
    ``--comm-dtype`` (a resume with another would not continue the same numbers); fp32 runs
    add nothing, so their checkpoints stay interchangeable with every fp32 run's."""
    return {k: v for k, v in (("precision", spec.train.precision),
                              ("comm_dtype", spec.parallel.comm_dtype)) if v != "fp32"}


def _dims(data: Union[Graph, Shard]):
    """(input features, classes) of the whole graph or of a shard."""
    if isinstance(data, Graph):
        return data.num_features, data.num_classes
    return int(data.x.shape[1]), int(data.num_classes)


def _fullbatch(spec, rank, world, data, model, device, watchdog, baseline=0) -> Training:
    runtime, fields, desc, grid, memory = _fullbatch_runtime(spec, rank, world, data, model,
                                                             device, watchdog, baseline)
    return Training(lambda opt, cfg, on_epoch, start: fit(model, runtime, cfg, on_epoch,
                                                          start, opt, memory),
                    fields, desc, grid, rows=runtime)


def _fullbatch_runtime(spec, rank, world, data, model, device, watchdog, baseline=0):
    """A full-batch run's runtime, log fields, progress description, grid and per-rank
    memory accounting (None serially), for node and link training alike."""
    memory = None
    runtime = fullbatch_runtime(spec, world, data, model.norm, device, watchdog)
    if isinstance(data, Graph):
        fields, desc, grid = {"algo": "serial", "world_size": 1, "grid": [1]}, "train", [1]
    else:
        grid = list(spec.grid_shape(world).values())
        top, mean = nnz_balance(runtime.comm, runtime.op)
        fields = {"algo": spec.parallel.algo, "world_size": world, "grid": grid,
                  "nnz_max_over_mean": top / max(mean, 1e-12)}
        desc = f"train[{spec.parallel.algo} x{world}]"
        memory = _rank_memory(spec, rank, world, data, device, baseline, runtime.reducer)
    return runtime, fields, desc, grid, memory


def _link(decoder, spec, rank, world, data, model, device, watchdog, baseline=0) -> Training:
    """``--task link``: the full-batch runtime of the training graph (held-out edges out of
    it: :func:`gnnpar.training.shard_source.load_graph`), its rows' embeddings scored pair by pair
    (:mod:`gnnpar.link.loop`; on several ranks through a
    :class:`~gnnpar.link.exchange.PairExchange`)."""
    serial = isinstance(data, Graph)
    n = data.num_nodes if serial else int(data.n_global)
    split = data.meta["link_split"]
    if spec.minibatch:
        return _minibatch(spec, rank, world, data, model, device, watchdog, baseline,
                          link=(decoder, split, n))
    runtime, fields, desc, grid, memory = _fullbatch_runtime(spec, rank, world, data, model,
                                                             device, watchdog, baseline)
    pairs = None if serial else PairExchange.of_runtime(runtime, n)

    def run(opt, cfg, on_epoch, start):
        return fit_link(model, decoder, runtime, split, cfg, n, spec.link.neg_ratio,
                        spec.train.seed, pairs, on_epoch, start, opt, memory)
    return Training(run, {**fields, **_link_fields(spec)}, desc, grid, rows=runtime,
                    module=link_modules(model, decoder))


def _link_fields(spec) -> dict:
    return {"task": "link", "decoder": spec.link.decoder, "neg_ratio": spec.link.neg_ratio,
            "link_split": spec.link.link_split}


def _rank_memory(spec, rank, world, shard, device, baseline, reducer) -> Optional[RankMemory]:
    """Every rank's peak against its data (:class:`~gnnpar.training.memory.RankMemory`): the shard's
    arrays as loaded, and the halo rows one SpMM holds at the widest layer (the shard's
    ``n_halo``: what the 1D halo kernel receives). None when the runtime's reductions do not
    span every rank."""
    if reducer.world != world:
        return None
    f_in, f_out = _dims(shard)
    f_out = spec.model.hidden if spec.link.task == "link" else f_out
    widths = [f_in] + [spec.model.hidden] * (spec.model.layers - 1) + [f_out]
    return RankMemory(rank, world, device, baseline, array_bytes(shard),
                      halo_row_bytes(shard.n_halo, widths, spec.train.precision))


def _minibatch(spec, rank, world, data, model, device, watchdog, baseline=0,
               link=None) -> Training:
    """Mini-batch training of a node classifier, or with ``link`` = (decoder, split, node
    count) of a link predictor: edge batches as seeds (:mod:`gnnpar.link.minibatch`)."""
    memory = None
    make_plan = None if link is None else functools.partial(
        _link_plan, link[1].train_pos, spec, link[2])
    if isinstance(data, Graph):
        parts = serial_parts(spec, data, model.norm, device,
                             sampler_input_dropout(model, device), make_plan)
    else:
        parts = build_rank(rank, world, data, spec, model.norm, device,
                           sampler_input_dropout(model, device), make_plan)
        if parts.engine.reducer.world == world:  # every rank's peak, against its baseline
            memory = RankMemory(rank, world, device, baseline)
    info = parts.info
    fields = {"algo": "data-parallel" if world > 1 else "serial", "world_size": world,
              "grid": [world], "mode": "minibatch", "eval": "full-neighbourhood",
              **info.pop("layout", {})}
    step = evaluate_on = module = None
    if link is not None:
        decoder, split, n = link
        pairs = None if isinstance(data, Graph) else PairExchange.of_runtime(parts.eval_runtime, n)
        step, evaluate_on = link_minibatch_parts(model, decoder, split, pairs, spec.train.precision)
        module = link_modules(model, decoder)
        fields.update(_link_fields(spec))
    return Training(
        lambda opt, cfg, on_epoch, start: fit_minibatch(model, parts.service, parts.engine,
                                                        parts.eval_runtime, cfg, on_epoch,
                                                        start, opt, memory, step,
                                                        evaluate_on),
        fields, f"minibatch x{world}", [world], module=module,
        extra_final=lambda history: info,  # run totals: logged.final_metrics
        # the device sampler draws other blocks than the host's (counter-based draws, named
        # by their generator: a checkpoint of other draws would not replay the same blocks);
        # host-sampled runs add nothing to the identity
        identity=({"sample_on": "device", "draws": HASH_GENERATOR} if info["sample_on"] == "device"
                  else {}),
        rows=parts.eval_runtime)


def _link_plan(train_pos, spec, num_nodes, stream, world):
    """A link mini-batch rank's steps (``--batch-size`` positives a step)."""
    return LinkPlan(train_pos, world, stream, spec.batch.batch_size, spec.train.seed,
                    spec.link.neg_ratio, num_nodes)
