"""Command-line options of ``gnnpar-train``: each flag's help gives its default and unit."""
from __future__ import annotations

import argparse
import functools
import math
import os

import torch

from gnnpar.datasets import InputError
from gnnpar.datasets.limits import check_memory, check_num_classes
from gnnpar.datasets.reorder import ORDERS
from gnnpar.kernels.algorithms import ALGORITHMS
from gnnpar.kernels.blocks import BLOCK_LAYOUTS
from gnnpar.kernels.entry import LAYOUT_FLAGS
from gnnpar.partitioners.shards import read_meta
from gnnpar.nn.precision import PRECISIONS

from gnnpar.nn.attention import check_heads
from gnnpar.cli.cli_common import DefaultsHelpFormatter, check_bounds, max_memory_bytes
from gnnpar.nn.custom_model import is_custom, model_args_dict, parse_model_arg
from gnnpar.link.options import add_link_args, check_link_args
from gnnpar.nn.model_registry import built_in, facts
from gnnpar.nn.models import check_model
from gnnpar.cli.output_paths import check_output_paths
from gnnpar.cli.plan_cli import add_max_memory_arg, add_model_args, check_model_args
from gnnpar.training.resume import check_checkpoint_args
from gnnpar.training.trainer import LINK_WEIGHT_DECAY, NODE_WEIGHT_DECAY
from gnnpar.sampling.options import add_minibatch_args, check_mode_args

#: longest ``--timeout`` (seconds), a week: longer than any wait of a healthy run (a partition
#: of the largest graph takes hours), and inside what the value reaches in every rank:
#: ``datetime.timedelta`` (it overflows past ~2.7 million years) and C timeouts counted in
#: milliseconds (``poll(2)`` takes a 32-bit count: ~24.8 days)
MAX_TIMEOUT_S = 7 * 24 * 3600

#: flags only ``--algo auto`` reads (the cost model's); it chooses the layout flags itself
AUTO_FLAGS = ("mem_cap", "bandwidth", "latency", "calibration")




def algo_choices() -> tuple:
    """``--algo`` values: ``serial`` (one process, the reference), every registered algorithm
    (:mod:`gnnpar.kernels.algorithms`), and ``auto`` (the cost model picks)."""
    return ("serial", *ALGORITHMS, "auto")


def algo_only() -> dict:
    """Flags that only some ``--algo`` values read (in either ``--mode``) -> those values, from
    each algorithm's ``flags``. Any other algorithm would ignore the flag, so giving it there is
    refused; ``auto`` sets the layout flags itself and is the only reader of the cost-model
    flags."""
    out = {flag: tuple(a.name for a in ALGORITHMS.values() if flag in a.flags)
           for flag in LAYOUT_FLAGS}
    out.update({flag: ("auto",) for flag in AUTO_FLAGS})
    return out


def add_data_args(p: argparse.ArgumentParser):
    """The ``data`` flags (``gnnpar-train`` and ``gnnpar-predict``); returns the group."""
    d = p.add_argument_group("data")
    d.add_argument("--dataset", default=None,
                   help="dataset spec: rmat:scale=S,ef=E | sbm:n=N,blocks=B,p_in=P,p_out=Q | "
                        "npz:PATH | ogb:DIR | cache:DIR (default: a small SBM)")
    d.add_argument("--directed", action="store_true",
                   help="keep npz/ogb edges as given instead of symmetrising them")
    d.add_argument("--cache-dir", default=None,
                   help="binary cache folder: a second load of the same spec reads it")
    d.add_argument("--reorder", default="auto", choices=("auto",) + ORDERS,
                   help="renumber the vertices once at load so neighbours sit near each other "
                        "in memory (degree: hubs first; rcm: reverse Cuthill-McKee; partition: "
                        "METIS clusters of ~8k rows, hubs first in each); the same "
                        "graph, faster sparse products (default auto: degree for a "
                        "single-process full-batch run; none for mini batch and "
                        "distributed runs)")
    return d


def add_distributed_args(p: argparse.ArgumentParser) -> None:
    """The ``distributed full-batch`` flags (``gnnpar-train`` and ``gnnpar-predict``)."""
    g = p.add_argument_group("distributed full-batch")
    g.add_argument("--algo", default="serial", choices=algo_choices(),
                   help="SpMM algorithm; serial = one process, the reference; auto = the "
                        "cost model's fastest that fits --mem-cap")
    g.add_argument("--nprocs", type=int, default=None,
                   help="spawn N local ranks (gloo on CPU); omit under torchrun")
    g.add_argument("--grid", default=None,
                   help="process grid AxB (2d) or AxBxC (3d/4d); in --mode minibatch one "
                        "group's grid, and DxPXxPYxPZ for 4d (D data-parallel groups)")
    g.add_argument("--replication", type=int, default=None, help="1.5D replication factor c")
    g.add_argument("--partitioner", default=None,
                   help="block | random | metis | kaminpar (default metis for --nprocs)")
    g.add_argument("--partition-dir", default=None,
                   help="folder of per-rank shards from gnnpar-partition (written there if empty)")
    g.add_argument("--backend", default="auto",
                   help="auto (nccl on GPU, else gloo) | gloo | nccl | mpi")
    g.add_argument("--comm-dtype", default="fp32", choices=("fp32", "bf16", "fp16"),
                   help="wire format of the SpMM's feature and gradient exchanges (summed in "
                        "fp32; the weights' gradient all-reduce stays fp32); default fp32")
    g.add_argument("--block-layout", default="balanced", choices=BLOCK_LAYOUTS,
                   help="2d/3d/4d row ownership: balanced = a seeded random balanced set, "
                        "even non-zeros per rank under any partitioner; parts = the "
                        "partition's own parts (default balanced)")
    g.add_argument("--variant", default=None, choices=("halo", "bcast"),
                   help="1.5d/2d data movement (default halo: only the rows a block touches)")
    add_model_args(g)
    g.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective may wait before every rank fails, and how "
                        "long a rank's heartbeat may be silent before it is named lost "
                        f"(exit 3): more than 0, at most {MAX_TIMEOUT_S:,} (a week); "
                        "default 300")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gnnpar-train",
        description="Train a GCN, GraphSAGE or GAT model, serially or distributed.",
        formatter_class=DefaultsHelpFormatter)
    d = add_data_args(p)
    m = p.add_argument_group("model")
    m.add_argument("--model", default="gcn", metavar="{gcn,sage,gat,package.module:factory}",
                   help="layer type (gat: graph attention, with every --algo, full batch "
                        "and mini batch), or your own model: "
                        "factory(f_in, hidden, f_out, layers, dropout) "
                        "returning a torch.nn.Module whose forward(ops, x) reads layer i's "
                        "operator as ops[i] (gnnpar/nn/custom_model.py), or your own layer class "
                        "(forward(op, h)) that its module registers with "
                        "gnnpar.register_layer, stacked as gnnpar's layers are (default: gcn)")
    m.add_argument("--model-arg", dest="model_args", action=AppendTuple, default=(),
                   type=parse_model_arg, metavar="KEY=VALUE",
                   help="a keyword for your own --model factory or layer (repeat for more; "
                        "true/false, integers and decimals are given as such, anything else "
                        "as a string)")
    m.add_argument("--layers", type=int, default=2, help="number of GNN layers")
    m.add_argument("--hidden", type=int, default=64,
                   help="hidden width (features); with --model gat the width in all, heads x "
                        "width per head, so a multiple of --heads")
    m.add_argument("--dropout", type=float, default=0.5, help="dropout probability")
    m.add_argument("--heads", type=int, default=None,
                   help="--model gat: attention heads (default 8); hidden layers concatenate "
                        "them, the output layer averages them")
    m.add_argument("--attn-dropout", type=float, default=None,
                   help="--model gat: dropout on the attention coefficients (default: "
                        "--dropout's)")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=int, default=100, help="full-batch epochs")
    t.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    t.add_argument("--weight-decay", type=float, default=None,
                   help=f"Adam weight decay (default: {NODE_WEIGHT_DECAY} with --task node, as "
                        f"the GCN paper's; {LINK_WEIGHT_DECAY} with --task link: decay shrinks "
                        "the embeddings whose products are the scores)")
    t.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto = cuda when available")
    t.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="bf16: dense layers under autocast and bf16 features into the SpMM "
                        "(fp32 accumulation, fp32 master weights); tf32 (CUDA): fp32, but the "
                        "dense layers' matrix products on TF32 tensor cores; default fp32")
    t.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per rank (default: cores / ranks)")
    o = p.add_argument_group("output")
    o.add_argument("--log-json", default=None, help="write one JSON object per epoch to PATH")
    o.add_argument("--save-model", default=None, help="save the trained weights to PATH")
    o.add_argument("--save-predictions", default=None, metavar="DIR",
                   help="at the end of training, write the final model's predictions (and "
                        "the last hidden layer's embeddings) for every vertex into DIR, as "
                        "gnnpar-predict --out DIR --embeddings would")
    o.add_argument("--profile", type=int, default=None, metavar="EPOCH",
                   help="write a torch profiler trace of this epoch (per rank)")
    o.add_argument("--profile-dir", default=".", help="folder of the --profile traces")
    o.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    o.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    add_max_memory_arg(d)
    add_link_args(p)
    add_distributed_args(p)
    add_minibatch_args(p)
    c = p.add_argument_group("checkpoints")
    c.add_argument("--checkpoint-dir", default=None,
                   help="folder for per-rank checkpoints (also written on SIGTERM)")
    c.add_argument("--checkpoint-every", type=int, default=1, help="epochs between checkpoints")
    c.add_argument("--checkpoint-keep", type=int, default=3, help="newest checkpoints kept")
    c.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint-dir (exact)")
    return p


@functools.lru_cache(maxsize=None)
def parser_defaults() -> dict:
    """What ``gnnpar-train`` sets each option to when its flag is not on the command line."""
    return vars(build_parser().parse_args([]))


def check_algo_flags(args) -> None:
    """Refuse a flag of :func:`algo_only` that ``--algo`` would ignore."""
    for name, readers in algo_only().items():
        if args.algo in readers or getattr(args, name) == parser_defaults()[name]:
            continue
        why = "chooses it itself" if args.algo == "auto" else "ignores it"
        raise InputError(f"--{name.replace('_', '-')} is read only by --algo "
                         f"{', '.join(readers)}; --algo {args.algo} {why}")


#: resident memory of one spawned rank before it holds any data (Python, torch, gloo).
RANK_PROCESS_BYTES = 150 * 2 ** 20


def check_args(args) -> None:
    """Refuse values that cannot work, and flags the run would ignore, with the flag's name in
    the message: each ``--help`` group's flags by the check beside them (the run spec's
    sections, :mod:`gnnpar.cli.spec`), the cheap ones first; then what the flags imply on disk
    and in memory — the sizes (``data``), the output paths (``output``) and the checkpoint
    folder (``checkpoints``) — all before any work."""
    check_bounds(args)  # every count and size flag in its range (gnnpar.cli.cli_common.BOUNDS)
    check_training_args(args)
    check_distributed_args(args)
    check_mode_args(args)  # mini batch: gnnpar/sampling/options.py
    check_link_args(args)  # link prediction: gnnpar/link/options.py
    check_model_group(args)
    check_sizes(args, max_memory_bytes(args.max_memory))
    check_output_paths(args)
    check_checkpoint_args(args)  # gnnpar/training/resume.py


def check_training_args(args) -> None:
    """The ``training`` group, and ``--profile``'s epoch (of ``--epochs``)."""
    if args.epochs < 0:
        raise InputError(f"--epochs must be >= 0, got {args.epochs}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise InputError(f"--lr must be a finite number > 0, got {args.lr}")
    if args.weight_decay is not None and not (math.isfinite(args.weight_decay)
                                              and args.weight_decay >= 0):
        raise InputError(f"--weight-decay must be a finite number >= 0, got {args.weight_decay}")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be >= 1, got {args.threads}")
    if args.precision == "tf32" and (args.device == "cpu" or args.device == "auto"
                                     and not torch.cuda.is_available()):
        raise InputError("--precision tf32 is a mode of CUDA's matrix products; this run is "
                         "on the CPU (use fp32 or bf16)")
    if args.profile is not None and not 0 <= args.profile < args.epochs:
        raise InputError(f"--profile {args.profile} is not an epoch of this run "
                         f"(0..{args.epochs - 1})")


def check_distributed_args(args) -> None:
    """The ``distributed full-batch`` group: the ranks, the flags only some ``--algo`` read
    (:func:`check_algo_flags`), the wire, the timeout and the cost model's flags
    (:func:`gnnpar.cli.plan_cli.check_model_args`)."""
    if args.nprocs is not None and args.nprocs < 1:
        raise InputError(f"--nprocs must be >= 1, got {args.nprocs}")
    check_algo_flags(args)
    if args.algo == "serial" and (args.nprocs or 1) > 1 and args.mode != "minibatch":
        raise InputError(f"--nprocs > 1 needs a distributed --algo ({', '.join(ALGORITHMS)})")
    if args.block_layout != "balanced" and args.mode == "minibatch":
        raise InputError("--block-layout sets the full-batch 2d/3d/4d row ownership; in "
                         "--mode minibatch a group's blocks follow its sampled rows")
    if args.comm_dtype != "fp32" and args.algo == "serial":
        raise InputError(f"--comm-dtype {args.comm_dtype} sets the wire format of a distributed "
                         "SpMM's exchanges; --algo serial (one process, or mini-batch data "
                         "parallelism) has none")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise InputError(f"--timeout must be a finite number > 0 seconds, got {args.timeout}")
    if args.timeout > MAX_TIMEOUT_S:  # it becomes a timedelta and C timeouts in every rank
        raise InputError(f"--timeout must be at most {MAX_TIMEOUT_S:,} seconds (a week), "
                         f"got {args.timeout:g}")
    check_model_args(args)


def check_model_group(args) -> None:
    """The ``model`` group: ``--dropout``, the model's name (a user's factory is built once
    here, so it comes after the cheap checks) and a GAT's attention flags."""
    if not 0.0 <= args.dropout < 1.0:
        raise InputError(f"--dropout must be in [0, 1), got {args.dropout}")
    check_model_name(args)
    check_attention_args(args)


class AppendTuple(argparse.Action):
    """A repeatable flag's values as a tuple, in the order given (``()`` when never given: a
    default that is the run spec's, and never shared between parses as a list would be)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, (*getattr(namespace, self.dest, ()), values))


def check_model_name(args) -> None:
    """``--model``: a built-in kind, or a factory that gives a model (``gnnpar/nn/custom_model.py``
    builds one trial model here, before any data)."""
    model_args = model_args_dict(args.model_args)
    if args.model in built_in():
        if model_args:
            raise InputError(f"--model-arg is for your own model or layer; --model "
                             f"{args.model} takes its settings from its flags")
        return
    if not is_custom(args.model):
        raise InputError(f"--model {args.model!r}: choose one of {', '.join(built_in())} or "
                         "name your own as package.module:factory")
    check_model(args.model, args.hidden, args.layers, args.dropout, model_args)


def check_attention_args(args) -> None:
    """``--heads``/``--attn-dropout`` only with ``--model gat`` (which runs with every
    ``--algo``, in full batch and mini batch), and in range."""
    check_heads(args.model, args.heads, args.hidden)
    if not facts(args.model).attention:
        if args.attn_dropout is not None:
            raise InputError(f"--attn-dropout sets the attention of --model gat; --model "
                             f"{args.model} has none")
        return
    if args.attn_dropout is not None and not 0.0 <= args.attn_dropout < 1.0:
        raise InputError(f"--attn-dropout must be in [0, 1), got {args.attn_dropout}")


def check_sizes(args, max_bytes=None) -> None:
    """What the flags alone say about memory: the spawned ranks, and the model's weights with
    their gradients and Adam state (16 bytes a parameter), against
    :func:`gnnpar.datasets.limits.check_memory` (``max_bytes``: ``--max-memory``'s bytes). The
    input and output widths are those of the shards in ``--partition-dir`` when it holds them
    (their ``num_classes`` also checked against the node count, as a dataset's is), else at
    least one feature each."""
    if args.nprocs:
        check_memory(args.nprocs * RANK_PROCESS_BYTES,
                     f"--nprocs {args.nprocs} (a process per rank)", max_bytes)
    f_in, f_out, where = _shard_widths(args.partition_dir)
    per = facts(args.model).weight_sets
    params = per * (args.hidden * args.hidden * max(args.layers - 2, 0)
                    + args.hidden * (f_in + f_out))
    check_memory(16 * params, f"--hidden {args.hidden} with --layers {args.layers}{where} "
                              "(weights, gradients and Adam state)", max_bytes)


def _shard_widths(partition_dir):
    """(features, classes, words naming them) of the shards in ``partition_dir``; (1, 1, "")
    when it holds none, or a meta.json its loading will refuse (with its own message)."""
    if not partition_dir or not os.path.isfile(os.path.join(partition_dir, "meta.json")):
        return 1, 1, ""
    try:
        meta = read_meta(partition_dir)
        n, f_in, f_out = int(meta["n"]), int(meta["num_features"]), int(meta["num_classes"])
    except (InputError, TypeError, ValueError):
        return 1, 1, ""
    where = os.path.join(partition_dir, "meta.json")
    check_num_classes(f_out, n, f"{where}: num_classes",
                      "the shards were edited or are damaged: rewrite them with gnnpar-partition")
    if f_in < 1 or f_out < 1:
        raise InputError(f"{where}: num_features {f_in} and num_classes {f_out} must be >= 1; "
                         "rewrite the shards with gnnpar-partition")
    return f_in, f_out, f" on the shards' {f_in:,} features and {f_out:,} classes"
