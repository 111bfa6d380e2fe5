"""Command-line options of ``gnnpar-train``: each flag's help gives its default and unit."""
from __future__ import annotations

import argparse
import functools
import os

from gnnpar.datasets import InputError

ALGOS = ("serial", "1d", "1d-halo", "1.5d", "2d", "3d", "4d", "auto")

#: flags that only some ``--algo`` values read (in either ``--mode``) -> those values. Any other
#: algorithm would ignore the flag, so giving it there is refused; ``auto`` sets the grid,
#: replication and variant itself and is the only reader of the cost-model flags.
ALGO_ONLY = {
    "grid": ("2d", "3d", "4d"),
    "replication": ("1.5d",),
    "variant": ("1.5d", "2d"),
    "mem_cap": ("auto",),
    "bandwidth": ("auto",),
    "latency": ("auto",),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gnnpar-train",
        description="Train a GCN or GraphSAGE model, serially or distributed.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = p.add_argument_group("data")
    d.add_argument("--dataset", default=None,
                   help="dataset spec: rmat:scale=S,ef=E | sbm:n=N,blocks=B,p_in=P,p_out=Q | "
                        "npz:PATH | ogb:DIR | cache:DIR (default: a small SBM)")
    d.add_argument("--directed", action="store_true",
                   help="keep npz/ogb edges as given instead of symmetrising them")
    d.add_argument("--cache-dir", default=None,
                   help="binary cache folder: a second load of the same spec reads it")
    m = p.add_argument_group("model")
    m.add_argument("--model", choices=("gcn", "sage"), default="gcn", help="layer type")
    m.add_argument("--layers", type=int, default=2, help="number of GNN layers")
    m.add_argument("--hidden", type=int, default=64, help="hidden width (features)")
    m.add_argument("--dropout", type=float, default=0.5, help="dropout probability")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=int, default=100, help="full-batch epochs")
    t.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    t.add_argument("--weight-decay", type=float, default=5e-4, help="Adam weight decay")
    t.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto = cuda when available")
    t.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per rank (default: cores / ranks)")
    o = p.add_argument_group("output")
    o.add_argument("--log-json", default=None, help="write one JSON object per epoch to PATH")
    o.add_argument("--save-model", default=None, help="save the trained weights to PATH")
    o.add_argument("--profile", type=int, default=None, metavar="EPOCH",
                   help="write a torch profiler trace of this epoch (per rank)")
    o.add_argument("--profile-dir", default=".", help="folder of the --profile traces")
    o.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    o.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    g = p.add_argument_group("distributed full-batch")
    g.add_argument("--algo", default="serial", choices=ALGOS,
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
    g.add_argument("--backend", default="auto", help="auto (nccl on GPU, else gloo) | gloo | nccl | mpi")
    g.add_argument("--variant", default=None, choices=("halo", "bcast"),
                   help="1.5d/2d data movement (default halo: only the rows a block touches)")
    from .plan_cli import add_model_args
    add_model_args(g)
    g.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective may wait before every rank fails")
    from .sampling.options import add_minibatch_args
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
    """Refuse a flag of :data:`ALGO_ONLY` that ``--algo`` would ignore."""
    for name, readers in ALGO_ONLY.items():
        if args.algo in readers or getattr(args, name) == parser_defaults()[name]:
            continue
        why = "chooses it itself" if args.algo == "auto" else "ignores it"
        raise InputError(f"--{name.replace('_', '-')} is read only by --algo "
                         f"{', '.join(readers)}; --algo {args.algo} {why}")


def check_args(args) -> None:
    """Refuse values that cannot work, and flags the run would ignore, with the flag's name in
    the message."""
    for name, value in (("layers", args.layers), ("hidden", args.hidden)):
        if value < 1:
            raise InputError(f"--{name} must be >= 1, got {value}")
    if args.epochs < 0:
        raise InputError(f"--epochs must be >= 0, got {args.epochs}")
    if not 0.0 <= args.dropout < 1.0:
        raise InputError(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.lr <= 0:
        raise InputError(f"--lr must be > 0, got {args.lr}")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be >= 1, got {args.threads}")
    if args.nprocs is not None and args.nprocs < 1:
        raise InputError(f"--nprocs must be >= 1, got {args.nprocs}")
    check_algo_flags(args)
    from .sampling.options import check_mode_args
    check_mode_args(args)
    if args.algo == "serial" and (args.nprocs or 1) > 1 and args.mode != "minibatch":
        raise InputError("--nprocs > 1 needs a distributed --algo (1d, 1d-halo, 1.5d, 2d, 3d, 4d)")
    if args.timeout <= 0:
        raise InputError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.profile is not None and not 0 <= args.profile < args.epochs:
        raise InputError(f"--profile {args.profile} is not an epoch of this run "
                         f"(0..{args.epochs - 1})")
    if args.profile is not None and os.path.exists(args.profile_dir) \
            and not os.path.isdir(args.profile_dir):
        raise InputError(f"--profile-dir {args.profile_dir} exists and is not a folder")
    from .resume import check_checkpoint_args
    check_checkpoint_args(args)
