"""One rank's part of an inference run: load the model and this rank's rows, run the model
over them (:mod:`gnnpar.infer.inference`), write its rows of the outputs
(:mod:`gnnpar.infer.predict_files`).

``gnnpar-predict`` runs :func:`predict_rank` on every rank through the training launcher
(:func:`gnnpar.launcher.launch.launch`: serial, ``--nprocs``, torchrun, srun, mpirun), so a graph
that trains on P ranks predicts on P ranks, each holding only its shard. ``gnnpar-train
--save-predictions`` calls :func:`predict_rows` at the end of training with the model and
rows it trained on (no second load).
"""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from gnnpar.datasets import DEFAULT_SPEC, Graph, InputError
from gnnpar.datasets.normalize import propagation_matrix
from gnnpar.kernels.comm import Comm, control_all_reduce
from gnnpar.kernels.dist_op import shard_values
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.kernels.halo import HaloPlan
from gnnpar.kernels.local import as_tensor
from gnnpar.kernels.overlap import forward_only

from gnnpar.training.distributed import rows_tensor
from gnnpar.infer.inference import embeddings_layer, forward_rows, layerwise
from gnnpar.interfaces import SPLITS, Reducer
from gnnpar.training.memory import gather_ints, local_peak_bytes
from gnnpar.link.scoring import check_pair_ids, read_pairs, score_rows
from gnnpar.infer.predict_files import write_column, write_outputs
from gnnpar.training.rows import fullbatch_runtime, rank_device
from gnnpar.infer.saved_model import model_from_payload, read_model_file
from gnnpar.training.shard_source import dataset_ids, load_graph, load_rank_shard, vertex_order
from gnnpar.training.trainer import RuntimeCollectives, accuracy_counts


@dataclass(frozen=True)
class PredictJob:
    """What to compute and write, besides the run spec: ``model_file`` (what
    ``--save-model`` wrote; None when the model is given in memory), the output folder
    ``out`` (named ``flag`` in messages), ``embeddings`` with ``embeddings_layer`` (None: the
    last hidden layer), ``per_rank`` files, and ``batch_size`` (layer-wise inference in
    chunks of that many rows; None: the model's forward pass on the whole rows)."""

    model_file: Optional[str]
    out: str
    embeddings: bool = False
    embeddings_layer: Optional[int] = None
    per_rank: bool = False
    batch_size: Optional[int] = None
    flag: str = "--out"
    prog: str = "gnnpar-predict"
    pairs: Optional[str] = None


class LayerwiseRows(RuntimeCollectives):
    """This rank's rows for :func:`gnnpar.infer.inference.layerwise`: Â's rows (``structure``),
    ``x``, ``y``, masks, the rows' ``global_ids``, and ``gather`` (the 1D halo exchange of
    one layer's rows; None on one process)."""

    def __init__(self, data, norm: str, device, world: int = 1):
        self.gather = None
        if isinstance(data, Graph):
            self.structure = propagation_matrix(data, norm)
            self.global_ids = np.arange(data.num_nodes, dtype=np.int64)
        else:
            self.structure = (data.indptr, data.indices, shard_values(data, norm))
            self.global_ids = np.asarray(data.global_ids, np.int64)
            self.comm = Comm(ProcessGrid.create({"row": world}))
            self.reducer = Reducer(self.comm, "row")
            plan = HaloPlan.from_arrays(data.send_local, data.send_counts, data.recv_counts,
                                        device)
            self.gather = lambda h: plan.start_gather(self.comm, h, "row").wait()
        take = rows_tensor if not isinstance(data, Graph) else as_tensor
        self.x = take(data.x, np.float32, device)
        self.y = take(data.y, np.int64, device)
        self.masks = {s: take(getattr(data, f"{s}_mask"), np.bool_, device) for s in SPLITS}


def check_widths(payload: dict, f_in: int, classes: int, where: str, source: str) -> None:
    """Refuse a model whose input width or class count is not the data's (both numbers; a
    link model's output is its embedding, whatever the data's classes)."""
    if payload.get("task") == "link":
        if int(payload["f_in"]) != f_in:
            raise InputError(f"{source} takes {payload['f_in']} input features; {where}: "
                             f"{f_in} features")
        return
    if int(payload["f_in"]) != f_in or int(payload["f_out"]) != classes:
        raise InputError(f"{source} takes {payload['f_in']} input features and gives "
                         f"{payload['f_out']} classes; {where}: {f_in} features, "
                         f"{classes} classes")


def predict_rank(job: PredictJob, spec, rank: int = 0, world: int = 1, source=None,
                 watchdog=None) -> dict:
    """Rank ``rank`` of ``world`` (``source`` None: one process with the whole graph):
    load, infer, write; returns ``predict.json``'s content."""
    device = rank_device(spec, rank)
    where = f"model file {job.model_file}"
    payload = read_model_file(job.model_file)
    model = model_from_payload(payload, where).to(device)
    lead = rank == 0 and not spec.output.quiet
    data = load_graph(spec) if source is None else load_rank_shard(rank, world, spec, source)
    if isinstance(data, Graph):
        check_widths(payload, data.num_features, data.num_classes, "the dataset", where)
    else:
        check_widths(payload, int(data.x.shape[1]), int(data.num_classes), "the shards", where)
    if job.pairs:  # every rank reads the same file: all refuse it alike, before inference
        check_pair_ids(read_pairs(job.pairs), data_rows(data), job.pairs)
    if lead and isinstance(data, Graph):
        print(data.summary(), file=sys.stderr)
    if job.batch_size:
        rows = LayerwiseRows(data, model.norm, device, world)
    else:
        with forward_only():  # no transposes: nothing runs a backward
            rows = fullbatch_runtime(spec, world, data, model.norm, device, watchdog)
    return predict_rows(model, rows, data, spec, job, rank, world,
                        outputs_meta(spec, payload["model"], job.model_file))


def outputs_meta(spec, model_name: str, model_file: Optional[str]) -> dict:
    """What ``predict.json`` says of the run's inputs."""
    shards = spec.parallel.partition_dir
    return {"model": model_name,
            "model_file": os.path.abspath(model_file) if model_file else None,
            "dataset": spec.data.dataset or (None if shards else DEFAULT_SPEC),
            "partition_dir": os.path.abspath(shards) if shards else None,
            "reorder": vertex_order(spec)}


def hidden_layers(model) -> bool:
    """Whether ``model`` has a hidden layer whose output an embedding can be."""
    layers = getattr(model, "layers", None)
    return isinstance(layers, torch.nn.ModuleList) and len(layers) > 1


def predict_rows(model, rows, data, spec, job: PredictJob, rank: int, world: int,
                 meta: dict) -> dict:
    """Run ``model`` over ``rows`` (a full-batch runtime, or :class:`LayerwiseRows` when
    ``job.batch_size``) and write the outputs; collective. ``data``: the graph or shard the
    rows came from (for the dataset's vertex order)."""
    link = getattr(model, "decoder", None) is not None
    layer = embeddings_layer(model, job.embeddings_layer) if job.embeddings else None
    lead = rank == 0 and not spec.output.quiet
    if lead:
        how = (f"layer-wise in chunks of {job.batch_size} rows" if job.batch_size
               else "full batch")
        print(f"{job.prog}: inference over {data_rows(data):,} vertices, {how}, "
              f"{world} rank{'s' if world > 1 else ''}", file=sys.stderr, flush=True)
    if job.batch_size:
        logits, emb = layerwise(model, rows.structure, rows.x, job.batch_size, spec.train.precision,
                                layer, rows.gather)
    else:
        logits, emb = forward_rows(model, rows, spec.train.precision, layer)
    accuracy = {} if link else _accuracy(logits, rows)
    # a link model's output rows are its node embeddings (what its decoder scores)
    arrays = {"embeddings": logits} if link else {"predictions": logits}
    if emb is not None:
        arrays["embeddings"] = emb
    ids = dataset_ids(data, rows.global_ids)
    peaks = gather_ints([local_peak_bytes(logits.device)], rank, world, rows.all_reduce_sum)
    info = {**meta, "algo": "1d-halo" if job.batch_size and world > 1 else spec.parallel.algo,
            "world_size": world,
            "inference": "layer-wise" if job.batch_size else "full-batch",
            "batch_size": job.batch_size, "precision": spec.train.precision,
            "task": "link" if link else "node", "pairs": job.pairs,
            "embeddings_layer": layer, "accuracy": accuracy,
            # each rank's peak (resident set, or CUDA allocator) when inference was done
            "peak_mem_bytes_ranks": [row[0] for row in peaks]}
    then = None
    if job.pairs:
        then = functools.partial(_scores, model.decoder, job, rank, world)
    content = write_outputs(job.out, rank, world, data_rows(data), ids, arrays, info,
                            _agree, job.per_rank, job.flag, then)
    if lead:
        print(f"{job.prog}: wrote {', '.join(arrays)} of {data_rows(data):,} vertices to "
              f"{job.out}", file=sys.stderr, flush=True)
    return content


def _accuracy(logits, rows) -> dict:
    """Accuracy of the argmax on each mask, over every rank (collective)."""
    counts = rows.all_reduce_sum(accuracy_counts(logits, rows.y, rows.masks))
    return {s: float(counts[2 * i] / counts[2 * i + 1])
            for i, s in enumerate(SPLITS) if counts[2 * i + 1] > 0}


def _scores(decoder, job: PredictJob, rank: int, world: int) -> dict:
    """``scores.npy`` of ``--pairs`` from the written ``embeddings.npy`` (collective)."""
    pairs = read_pairs(job.pairs)
    emb = os.path.join(job.out, "embeddings.npy")
    return write_column(job.out, "scores", int(pairs.shape[1]), rank, world,
                        lambda a, b: score_rows(decoder, emb, pairs, a, b), _agree, job.flag)


def data_rows(data) -> int:
    """The dataset's vertex count, from the whole graph or a shard."""
    return int(data.num_nodes if isinstance(data, Graph) else data.n_global)


def _agree(failed: bool) -> bool:
    """Whether any rank failed (one flag, all-reduced over the world; one process: its own)."""
    return bool(control_all_reduce(torch.tensor([int(failed)]), "max")[0])
