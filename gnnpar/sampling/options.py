"""The ``gnnpar-train`` flags of mini-batch training and their checks (no heavy imports)."""
from __future__ import annotations

import argparse

from gnnpar.datasets import InputError
from gnnpar.kernels.algorithms import get_grouped, group_names
from gnnpar.kernels.grid import parse_grid

from gnnpar.sampling.neighbor import parse_fanouts

MODES = ("fullbatch", "minibatch")
#: ``--macrobatch`` where the host samples and the flag is not given. Sampling 4 minibatches
#: at once makes the plain CPU command faster (``docs/performance.md``, mini batch) and
#: gives the same blocks as 1 (the draws never depend on the macrobatch).
HOST_MACROBATCH = 4
#: every flag of :func:`add_minibatch_args` but ``--mode``: only ``--mode minibatch`` reads them
#: (``MINIBATCH_ONLY``, filled in below, maps each to its parser default, "not given")
MINIBATCH_FLAGS = ("fanouts", "batch_size", "macrobatch", "group_size", "sampler_workers",
                   "sample_in_bursts", "prefetch", "cache_frac", "cache_policy", "replace",
                   "replicate_graph", "sample_on", "features_on")


def add_minibatch_args(p: argparse.ArgumentParser) -> None:
    b = p.add_argument_group("mini-batch training (--mode minibatch)")
    b.add_argument("--mode", default="fullbatch", choices=MODES,
                   help="fullbatch: every node every step; minibatch: sampled minibatches, "
                        "data parallel over the ranks")
    b.add_argument("--fanouts", default=None,
                   help="neighbours sampled per layer, input layer first (DGL order: the "
                        "seeds draw the last), -1 = all (write --fanouts=-1,-1); one per "
                        "--layers, e.g. 15,10,5")
    b.add_argument("--batch-size", type=int, default=None,
                   help="seed nodes (--task link: training positives, each with its "
                        "negatives) per minibatch on the rank with the most seeds")
    b.add_argument("--macrobatch", type=int, default=None,
                   help="minibatches sampled together whose input features are fetched once "
                        f"(default {HOST_MACROBATCH} where the host samples: a CPU run or "
                        "--sample-on host; 1 where the device may)")
    b.add_argument("--sampler-workers", type=int, default=None,
                   help="sampler threads per rank running ahead of the trainer (default 1; "
                        "a one-process CPU run whose trainer has every core samples in "
                        "bursts on as many threads as it has: --sample-in-bursts)")
    b.add_argument("--sample-in-bursts", default=None, action=argparse.BooleanOptionalAction,
                   help="sampler threads run only while the trainer waits, a macrobatch "
                        "each, never beside its parallel products (default: on for a "
                        "one-process CPU run whose trainer threads cover every core, else "
                        "off)")
    b.add_argument("--prefetch", type=int, default=None,
                   help="macrobatches a rank's samplers may have ready ahead of the trainer "
                        "(default 2 at --macrobatch 1, else one per sampler worker)")
    b.add_argument("--cache-frac", type=float, default=0.0,
                   help="fraction of the remote vertices whose feature rows a rank keeps (0-1)")
    b.add_argument("--cache-policy", default="degree", choices=("degree", "presample"),
                   help="which remote rows to cache: most-referenced vertices, or the most "
                        "frequent inputs of a pre-sampling pass")
    b.add_argument("--replace", action="store_true",
                   help="sample neighbours with replacement")
    b.add_argument("--replicate-graph", default=True, action=argparse.BooleanOptionalAction,
                   help="every rank holds the whole sampling structure; --no-replicate-graph: "
                        "each rank its own rows, neighbours of others' rows asked of their "
                        "owners per layer (less memory, more messages; ignored serially)")
    b.add_argument("--sample-on", default="auto", choices=("auto", "host", "device"),
                   help="where minibatches are sampled: host (numpy threads) or device (torch "
                        "kernels on --device); auto: device on a GPU when the structure is "
                        "replicated and training is plain data parallel (default auto)")
    b.add_argument("--features-on", default="auto", choices=("auto", "host", "device"),
                   help="where feature rows live: host (pinned copies on a side stream) or "
                        "device (gathered there); auto: device on a GPU when they fit in half "
                        "its free memory (default auto)")
    b.add_argument("--group-size", type=int, default=None,
                   help="ranks sharing one sampled subgraph, with --algo 1d/1d-halo/1.5d (2d, "
                        "3d: the --grid product; 4d: PX*PY*PZ of --grid DxPXxPYxPZ); world/g "
                        "groups train data parallel (default: no groups, plain data parallel)")


def _minibatch_defaults() -> dict:
    p = argparse.ArgumentParser(add_help=False)
    add_minibatch_args(p)
    return {name: p.get_default(name) for name in MINIBATCH_FLAGS}


MINIBATCH_ONLY = _minibatch_defaults()


def _flag(name: str, value) -> str:
    """The flag as the command line wrote it (``--no-X`` for a switched-off boolean)."""
    return ("--no-" if value is False else "--") + name.replace("_", "-")


def check_mode_args(args) -> None:
    """Refuse mini-batch flags outside ``--mode minibatch`` and impossible mini-batch settings."""
    if args.mode != "minibatch":
        for name, unused in MINIBATCH_ONLY.items():
            value = getattr(args, name)
            if value != unused:
                raise InputError(f"{_flag(name, value)} needs --mode minibatch (full-batch "
                                 f"training ignores it)")
        return
    if args.fanouts is None or args.batch_size is None:
        raise InputError("--mode minibatch needs --fanouts (one per layer, e.g. 15,10,5) and "
                         "--batch-size")
    fanouts = parse_fanouts(args.fanouts)
    if len(fanouts) != args.layers:
        raise InputError(f"--fanouts gives {len(fanouts)} layer(s) but --layers is {args.layers}")
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    for flag, value in (("--macrobatch", args.macrobatch),
                        ("--sampler-workers", args.sampler_workers), ("--prefetch", args.prefetch)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be >= 1, got {value}")
    if not 0.0 <= args.cache_frac <= 1.0:
        raise InputError(f"--cache-frac must be in [0, 1], got {args.cache_frac}")
    check_group_args(args)


def pipeline_depth(macrobatch, prefetch, workers: int, host_samples: bool):
    """``(K, prefetch)``: the flags as given, else their defaults. K is
    :data:`HOST_MACROBATCH` where the host samples, 1 where the device may. Prefetch is 2 at
    K = 1 (two minibatches ahead keep a device fed), else one macrobatch per sampler worker.
    So K = 4 holds four minibatches ahead where K = 1 holds two, and fetches the feature rows
    they share once (the peak memory of both is in ``docs/performance.md``)."""
    k = int(macrobatch) if macrobatch is not None else (HOST_MACROBATCH if host_samples else 1)
    workers = 1 if workers is None else int(workers)
    ahead = int(prefetch) if prefetch is not None else (2 if k == 1 else max(1, workers))
    return k, ahead


def check_group_args(args) -> None:
    """``--algo``/``--group-size``/``--grid`` of grouped mini-batch training (world-size
    checks where ``--nprocs`` gives it; under a launcher the ranks check it)."""
    choices = ", ".join(group_names())
    if args.algo == "serial":
        if args.group_size is not None and args.group_size != 1:
            raise InputError(f"--group-size needs --algo ({choices}) to split each sampled "
                             "subgraph over its group")
        return
    if args.algo == "auto":
        raise InputError("--algo auto is for full-batch training; in --mode minibatch give "
                         f"--algo {choices} with --group-size/--grid")
    if args.group_size is not None and args.group_size < 1:
        raise InputError(f"--group-size must be >= 1, got {args.group_size}")
    dims = parse_grid(args.grid) if args.grid else None
    get_grouped(args.algo).group_shape(args.nprocs, args.group_size, dims, args.replication or 1)
