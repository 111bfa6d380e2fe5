"""``gnnpar-predict``: run a trained model over every vertex of a graph and write its
predictions (and node embeddings), serially or on as many ranks as training used.

One process::

    gnnpar-predict --model-file model.pt --dataset npz:cora.npz --out preds/

Four local ranks, any full-batch algorithm, embeddings of the last hidden layer::

    gnnpar-predict --model-file model.pt --dataset rmat:scale=21,ef=16 --algo 1d-halo \\
        --nprocs 4 --embeddings --out preds/

Layer-wise, in chunks of 4096 rows (a model trained with ``--mode minibatch``)::

    gnnpar-predict --model-file sage.pt --dataset rmat:scale=18,ef=16 --batch-size 4096 \\
        --nprocs 4 --out preds/

torchrun / srun / mpirun: ``torchrun --nproc-per-node 4 -m gnnpar.predict --algo 2d --grid
2x2 --partition-dir shards/ --model-file model.pt --out preds/``.

The files and their order are the contract of :mod:`gnnpar.infer.predict_files`. Exit codes as
``gnnpar-train``'s (0 success, 2 bad input, 1 internal error, 3 a lost rank).

In Python, this module is also the function ``gnnpar.predict(model, data, ...)``
(:func:`predict`): the module object is callable, so ``gnnpar.predict`` is the same whether
or not this module has been imported.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import types
from typing import Optional, Tuple, Union

import numpy as np
import torch

from gnnpar.datasets import Graph, InputError, load_dataset

from gnnpar.launcher.bootstrap import detect_world
from gnnpar.nn.model_registry import facts
from gnnpar.cli.cli_common import DefaultsHelpFormatter, run_cli
from gnnpar.infer.inference import check_layerwise, embeddings_layer, forward_rows, layerwise
from gnnpar.launcher.launch import launch
from gnnpar.link.scoring import read_pairs
from gnnpar.cli.options import (_shard_widths, add_data_args, add_distributed_args,
                                parser_defaults)
from gnnpar.cli.output_paths import inputs_of, overlaps
from gnnpar.nn.precision import PRECISIONS
from gnnpar.infer.predict_files import check_out
from gnnpar.infer.prediction import LayerwiseRows, PredictJob, check_widths, predict_rank
from gnnpar.infer.saved_model import model_from_payload, read_model_file
from gnnpar.training.serial import SerialRuntime
from gnnpar.cli.spec import RunSpec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gnnpar-predict",
        description="Predict every vertex of a graph with a model gnnpar-train saved "
                    "(--save-model), and write its node embeddings.",
        formatter_class=DefaultsHelpFormatter)
    m = p.add_argument_group("model and output")
    m.add_argument("--model-file", required=True, metavar="PATH",
                   help="what gnnpar-train --save-model wrote (read with weights_only: "
                        "nothing in it is run); a --model package.module:factory model is "
                        "imported again, from the working folder as in training")
    m.add_argument("--out", required=True, metavar="DIR",
                   help="folder of predictions.npy (N x classes float32 logits, rows in the "
                        "dataset's order), embeddings.npy and predict.json (a link model: "
                        "embeddings.npy, its output rows, and with --pairs scores.npy); a new "
                        "or empty folder, or one gnnpar-predict wrote before (its files "
                        "replaced)")
    m.add_argument("--embeddings", action="store_true",
                   help="also write embeddings.npy: the rows entering layer K of the model "
                        "(--embeddings-layer; default the last hidden layer's output)")
    m.add_argument("--embeddings-layer", type=int, default=None, metavar="K",
                   help="the layer whose input is the embedding, 1..layers-1 (implies "
                        "--embeddings; default layers-1)")
    m.add_argument("--pairs", default=None, metavar="FILE.npy",
                   help="a link model (gnnpar-train --task link): also write scores.npy, the "
                        "decoder's logit of each pair of FILE.npy, a (2, K) integer array of "
                        "vertex ids in the dataset's order (row 0 sources, row 1 targets)")
    m.add_argument("--per-rank", action="store_true",
                   help="one file per rank (predictions.rankR.npy, embeddings.rankR.npy and "
                        "ids.rankR.npy, the dataset ids of its rows) instead of shared files")
    m.add_argument("--batch-size", type=int, default=None, metavar="ROWS",
                   help="layer-wise inference: each layer over all rows in chunks of ROWS, "
                        "with every row's full neighbourhood (gnnpar's own models; data "
                        "parallel with --nprocs, rows moved as --algo 1d-halo moves them); "
                        "default: the model's forward pass on the whole graph")
    r = p.add_argument_group("run")
    r.add_argument("--seed", type=int, default=0,
                   help="seed of the partition (as the training run's --seed)")
    r.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto = cuda when available")
    r.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="as gnnpar-train's: bf16 dense layers under autocast (embeddings then "
                        "bf16 bits, said in predict.json); logits always float32")
    r.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per rank (default: cores / ranks)")
    r.add_argument("--quiet", action="store_true", help="no progress lines, no summary")
    r.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    add_data_args(p)
    add_distributed_args(p)
    return p


def _spec(args, payload: dict) -> RunSpec:
    """The run spec of an inference run: the training flags' defaults, the flags given here,
    and the model's shape from its file (what the model checks read)."""
    ns = argparse.Namespace(**parser_defaults())
    for key, value in vars(args).items():
        if hasattr(ns, key) and key != "batch_size":  # batch_size: mini-batch training's
            setattr(ns, key, value)
    ns.model, ns.layers, ns.hidden = payload["model"], payload["layers"], payload["hidden"]
    ns.dropout, ns.epochs = float(payload.get("dropout", 0.0)), 0
    if facts(payload["model"]).attention:
        ns.heads, ns.attn_dropout = payload.get("heads"), payload.get("attn_dropout")
    if args.batch_size is not None:
        if args.algo not in ("serial", "1d-halo"):
            raise InputError(f"--batch-size runs layer-wise inference, whose ranks move rows as "
                             f"--algo 1d-halo does; drop --algo {args.algo} or --batch-size")
        if args.nprocs or detect_world().launched:
            ns.algo = "1d-halo"
    return RunSpec.from_args(ns)


def check(args) -> Tuple[RunSpec, PredictJob]:
    """Every flag and the model file checked before any data is loaded."""
    if args.batch_size is not None and args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    payload = read_model_file(args.model_file)
    where = f"model file {args.model_file}"
    model = model_from_payload(payload, where)  # a factory that no longer imports: exit 2
    embeddings = args.embeddings or args.embeddings_layer is not None
    _check_link(args, payload.get("task") == "link", embeddings, where)
    if embeddings:
        embeddings_layer(model, args.embeddings_layer)
    if args.batch_size is not None:
        check_layerwise(model)
    spec = _spec(args, payload)
    folder = spec.parallel.partition_dir
    f_in, classes, shards = _shard_widths(folder)
    if shards:
        check_widths(payload, f_in, classes, f"--partition-dir {folder}", where)
    check_out(args.out)
    inputs = inputs_of(spec.settings())
    for what, path, folder in inputs + [(where, args.model_file, False)]:
        how = overlaps(args.out, path, folder)
        if how:
            raise InputError(f"--out {args.out} would {how} {what}; give another folder")
    job = PredictJob(os.path.abspath(args.model_file), args.out, embeddings,
                     args.embeddings_layer, args.per_rank, args.batch_size,
                     pairs=os.path.abspath(args.pairs) if args.pairs else None)
    return spec, job


def _check_link(args, link: bool, embeddings: bool, where: str) -> None:
    """The flags that depend on the model's task: a link model writes its output rows as
    ``embeddings.npy`` (so ``--embeddings`` has nothing to add) and may score ``--pairs``
    (shared files only: each rank reads both endpoints' rows from ``embeddings.npy``)."""
    if link and embeddings:
        raise InputError(f"{where} is a link model: its output rows are the node embeddings, "
                         "written as embeddings.npy without --embeddings; drop "
                         "--embeddings/--embeddings-layer")
    if args.pairs is None:
        return
    if not link:
        raise InputError(f"--pairs scores vertex pairs with a link model's decoder; {where} is "
                         "a node classifier (train one with gnnpar-train --task link)")
    if args.per_rank:
        raise InputError("--pairs reads the endpoints' rows from the shared embeddings.npy; "
                         "drop --per-rank")
    read_pairs(args.pairs)


def run(args) -> int:
    spec, job = check(args)
    content = launch(spec, functools.partial(predict_rank, job))
    if not spec.output.quiet:
        acc = " ".join(f"{k}_acc={v:.4f}" for k, v in content.get("accuracy", {}).items())
        shapes = " ".join(f"{k}={tuple(v['shape'])}" for k, v in content["files"].items())
        print(f"gnnpar-predict: {shapes} {acc}".rstrip(), file=sys.stderr)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(lambda: run(args), args.debug, "gnnpar-predict")


# ---------------------------------------------------------------- the library call
def predict(model, data: Union[Graph, str], batch_size: Optional[int] = None,
            embeddings: Union[bool, int] = False, precision: str = "fp32", device=None):
    """``model``'s logits for every vertex of ``data`` (a :class:`~gnnpar.datasets.Graph`, or
    a dataset spec such as ``"npz:cora.npz"``), as a float32 (N, C) tensor in the dataset's
    vertex order (a graph reordered by :func:`gnnpar.datasets.reorder.reorder` is put back);
    with ``embeddings`` (True: the last hidden layer; an int K: the rows entering layer K),
    ``(logits, embeddings)``. ``batch_size``: layer-wise in chunks of that many rows, else
    the whole graph at once. One process; ``model`` as :func:`gnnpar.load_model` gives it
    (its ``norm`` names the Â it was trained with)."""
    graph = load_dataset(data) if isinstance(data, str) else data
    device = torch.device(device) if device is not None else next(
        (p.device for p in model.parameters()), torch.device("cpu"))
    layer = None
    if embeddings is not False and embeddings is not None:
        layer = embeddings_layer(model, None if embeddings is True else int(embeddings))
    norm = getattr(model, "norm", "gcn")
    if batch_size is None:
        logits, emb = forward_rows(model, SerialRuntime(graph, norm, device), precision, layer)
    else:
        rows = LayerwiseRows(graph, norm, device)
        logits, emb = layerwise(model, rows.structure, rows.x, batch_size, precision, layer)
    order = graph.meta.get("vertex_order")
    if order is not None:  # row k is dataset vertex order[k]
        index = torch.as_tensor(np.asarray(order, np.int64), device=logits.device)
        logits = torch.empty_like(logits).index_copy_(0, index, logits)
        emb = None if emb is None else torch.empty_like(emb).index_copy_(0, index, emb)
    return logits if layer is None else (logits, emb)


class _CallableModule(types.ModuleType):
    """``gnnpar.predict(...)`` calls :func:`predict` whether ``gnnpar.predict`` is this module
    (once imported, the package attribute is the submodule) or the package's lazy name."""

    def __call__(self, *args, **kwargs):
        return predict(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
