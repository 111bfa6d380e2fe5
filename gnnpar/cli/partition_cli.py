r"""``gnnpar-partition``: partition a dataset and write one shard folder per rank.

Examples::

    gnnpar-partition --dataset rmat:scale=18,ef=16 --parts 8 --method metis --balance edges \
        --out shards/rmat18-p8
    gnnpar-partition --dataset sbm:n=20000,blocks=8,p_in=0.0005,p_out=0.00002 --parts 8 \
        --report --json
    gnnpar-partition --dataset npz:graph.npz --parts 4 --grid 2x2 --report

Memory stays bounded by the structure, not the graph: the dataset is read memory-mapped (from
``--cache-dir`` or ``cache:DIR``), only the partitioner's input is built (KaMinPar's in a
temporary file), and the shards are written by passes over the structure and row blocks of the
features (``partitioners/shard_build.py``, ``partitioners/node_stream.py``) over ``--jobs``
processes. At the end each phase's seconds and the peak resident memory are printed (stdout; in
the object ``--json`` prints: ``phases``, ``peak_rss_bytes``, ``peak_rss_jobs_bytes``,
``partition_call_s``).

Without ``--out`` nothing is written (use it with ``--report``). ``--out`` must be new, empty,
or a folder gnnpar wrote shards into (anything else in it is refused with exit 2, nothing
touched), and must not lie inside another gnnpar folder; a rewrite removes only gnnpar's own
files. One run writes a folder at a time: a second ``--out`` of the same folder exits 2 naming
the run that holds it. ``--out`` may lie in the ``--cache-dir`` folder, beside its entries
(``KIND-HASH`` folders, gnnpar's), not inside one.

Every flag is checked before anything is loaded (:func:`check_flags`), and a partitioner
setting the ``--method`` would ignore is refused rather than dropped (``--imbalance`` with
block or random, ``--threads`` without kaminpar, ``--balance`` with random). An input whose
memory estimate is over the limit is refused; ``--max-memory SIZE`` (or ``GNNPAR_MAX_BYTES``)
raises it, as in ``gnnpar-train`` and ``gnnpar-plan``. Also ``python -m
gnnpar.cli.partition_cli``. Exit codes: 0 success, 2 bad input (one line on stderr; ``--debug`` adds
the traceback), 1 internal error.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time

from gnnpar.datasets import InputError, load_dataset, parse_spec
from gnnpar.datasets.owned import cache_overlap, refuse_claimed
from gnnpar.partitioners import (DEFAULT_BALANCE, METHODS, GridSpec, format_report, partition_graph,
                                 report, write_shards)
from gnnpar.partitioners.dispatch import DEFAULT_IMBALANCE, READS
from gnnpar.partitioners.metis import check_tolerance
from gnnpar.partitioners.part_pool import default_jobs
from gnnpar.partitioners.shard_build import ShardBuilder, check_norms
from gnnpar.partitioners.shard_folder import check_shard_disk, shard_writer
from gnnpar.partitioners.shards import dataset_source

from gnnpar.cli.cli_common import (add_max_memory_arg, apply_max_memory, check_bounds,
                                   max_memory_bytes, run_cli)

PROG = "gnnpar-partition"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG,
                                description="Partition a graph and write per-rank shards.")
    p.add_argument("--dataset", required=True, metavar="SPEC",
                   help="dataset spec, e.g. rmat:scale=18,ef=16 or sbm:... or npz:PATH or ogb:DIR "
                        "(required)")
    p.add_argument("--directed", action="store_true",
                   help="keep the graph directed instead of symmetrising it (default: off)")
    p.add_argument("--cache-dir", default=None, help="dataset cache folder (default: none)")
    p.add_argument("--parts", type=int, required=True, metavar="P",
                   help="number of parts = ranks that will load the shards (required)")
    p.add_argument("--method", choices=METHODS, default="metis",
                   help="partitioner (default: metis)")
    p.add_argument("--balance", choices=("nodes", "edges"), default=None,
                   help="quantity to balance: vertices, or row non-zeros with each row weighted "
                        "too (default: edges for metis/kaminpar, nodes for block; refused with "
                        "random, which balances sizes only in expectation)")
    p.add_argument("--seed", type=int, default=0,
                   help="partitioner seed of random, metis and kaminpar (block has no randomness; "
                        "default: 0)")
    p.add_argument("--threads", type=int, default=None,
                   help="KaMinPar's threads (default: every core this process may use; KaMinPar's "
                        "partition then varies from run to run: give 1 for one repeatable from "
                        "--seed); refused with the other methods, which run on one core")
    p.add_argument("--jobs", type=int, default=None, metavar="J",
                   help="processes building the shards' rows, J parts at a time (default: every "
                        "core this process may use)")
    p.add_argument("--imbalance", type=float, default=None,
                   help=f"allowed imbalance of metis/kaminpar, a fraction of the mean in (0, 1] "
                        f"(default: {DEFAULT_IMBALANCE}); refused with block and random, which "
                        "have no tolerance to set")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write shards to this folder (default: write nothing)")
    p.add_argument("--norms", default="gcn,mean",
                   help="comma-separated propagation matrices stored per shard (default: gcn,mean)")
    p.add_argument("--grid", default=None, metavar="AxB[xC]",
                   help="with --report: non-zeros per rank of the 2d/3d kernels on this grid, "
                        "whose size must equal --parts (no blocks are written: the kernels cut "
                        "them from the shards at setup; builds A'+I whole in memory, unlike the "
                        "rest of the command; default: none)")
    p.add_argument("--report", action="store_true", help="print the partition quality report")
    p.add_argument("--feat-width", type=int, default=128,
                   help="feature width f used for the bytes-per-SpMM figures of --report "
                        "(default: 128)")
    p.add_argument("--json", action="store_true",
                   help="print the report as one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress messages on stderr")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    add_max_memory_arg(p)
    return p


def run(args) -> int:

    def say(msg: str) -> None:
        if not args.quiet:
            print(f"[{PROG}] {msg}", file=sys.stderr, flush=True)

    grid, norms = check_flags(args)
    apply_max_memory(args.max_memory)  # the limit of the load and of the forked jobs
    if not args.out and not args.report:
        raise InputError("nothing to do: give --out DIR to write shards, --report to print "
                         "quality, or both")
    if grid is not None and not args.report:
        say(f"--grid {args.grid} only adds figures to --report: the 2d/3d kernels cut their blocks "
            f"from the shards at setup, so no grid blocks are written")
    source = None
    if args.cache_dir:
        refuse_claimed("--cache-dir", args.cache_dir, include_self=True)
    if args.out:
        refuse_claimed("--out", args.out)  # not inside another run's shards, checkpoints, cache
        if args.cache_dir and cache_overlap(args.out, args.cache_dir) == "write into":
            raise InputError(f"--out {args.out} lies inside an entry of --cache-dir "
                             f"{args.cache_dir} (its KIND-HASH folders are gnnpar's dataset "
                             "caches, replaced whole); give a path beside them")
        if args.cache_dir and _inside(args.cache_dir, args.out):
            raise InputError(f"--cache-dir {args.cache_dir} lies inside --out {args.out}; a "
                             "shard folder holds only shards: give another cache folder")
        source = dataset_source(args.dataset, args.directed)  # before loading: what is read
        check_shard_disk(args.out, args.parts, len(norms), what="--out")  # the parts² alone
    phases = {}
    # held from before the load until meta.json is written, the folder checked under it (a
    # folder with anything but gnnpar shards is refused); a second writer exits 2 at once
    with shard_writer(args.out, "--out") if args.out else contextlib.nullcontext():
        graph, part = _partition(args, say, phases)
        builder = None
        if args.out:
            t0 = time.perf_counter()
            check_shard_disk(args.out, args.parts, len(norms), graph, "--out")  # and the graph
            builder = ShardBuilder(graph, part, norms, jobs=_jobs(args), progress=say,
                                   halos=False)  # made by the writer's part tasks
            write_shards(graph, part, args.out, norms=norms, progress=say, source=source,
                         what="--out", builder=builder, validated=True)
            phases["shards"] = time.perf_counter() - t0
    rep = {}
    if args.report:
        t0 = time.perf_counter()
        say("computing the quality report")
        if builder is None and grid is None:
            builder = ShardBuilder(graph, part, norms, jobs=_jobs(args), progress=say)
        rep = report(graph, part, feat_width=args.feat_width, grid=grid,
                     counts=builder.quality_counts() if builder is not None else None)
        phases["report"] = time.perf_counter() - t0
    rep.update(_figures(phases, part))
    if args.json:
        print(json.dumps(rep))
    else:
        if args.report:
            print(format_report(rep))
        print(_format_figures(rep))
    return 0


def check_flags(args):
    """Every flag, checked before anything is loaded or written (exit 2, one line): bounds,
    ``--max-memory``, the dataset spec, ``--grid``, ``--norms``, ``--imbalance``, and no
    partitioner setting the chosen method would ignore. Returns ``(grid or None, norms)``."""
    check_bounds(args)  # --parts, --seed, --threads, --jobs, --feat-width
    max_memory_bytes(args.max_memory)
    parse_spec(args.dataset)  # its keys and values; the files it names are read by the load
    grid = GridSpec.parse(args.grid) if args.grid else None
    if grid is not None and grid.size != args.parts:
        raise InputError(f"--grid {args.grid} has {grid.size} ranks but --parts is {args.parts}; "
                         "they must be equal")
    try:
        norms = check_norms(k for k in args.norms.split(",") if k)
    except InputError as e:
        raise InputError(f"--norms {args.norms}: {e}") from None
    if args.imbalance is not None:
        try:
            check_tolerance(args.imbalance)
        except InputError as e:
            raise InputError(f"--imbalance: {e}") from None
    for name in ("balance", "imbalance", "threads"):
        if getattr(args, name) is not None and name not in READS[args.method]:
            readers = [m for m in METHODS if name in READS[m]]
            raise InputError(f"--{name} is not read by --method {args.method} (only by "
                             f"{' and '.join(readers)}); leave it out or choose one of those")
    return grid, norms


def _jobs(args) -> int:
    return args.jobs if args.jobs is not None else default_jobs()


def _figures(phases: dict, part) -> dict:
    """Each phase's seconds, the partitioner's own call and the peak resident memory of this
    process and of the largest forked job (Linux reports KiB)."""
    unit = 1 if sys.platform == "darwin" else 1024
    return {"phases": {k: round(v, 3) for k, v in phases.items()},
            "partition_s": round(phases.get("partition", 0.0), 3),
            "partition_call_s": round(part.info.get("call_s", phases.get("partition", 0.0)), 3),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit,
            "peak_rss_jobs_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * unit}


def _format_figures(rep: dict) -> str:
    gib = float(1 << 30)
    times = ", ".join(f"{k} {v:.1f} s" for k, v in rep["phases"].items())
    return (f"phases: {times} (total {sum(rep['phases'].values()):.1f} s; the partitioner's own "
            f"call {rep['partition_call_s']:.1f} s); peak resident memory "
            f"{rep['peak_rss_bytes'] / gib:.2f} GiB "
            f"(largest job {rep['peak_rss_jobs_bytes'] / gib:.2f} GiB)")


def _inside(path: str, folder: str) -> bool:
    inner, outer = os.path.realpath(path), os.path.realpath(folder)
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _partition(args, say, phases: dict):
    """The dataset and its partition; each step's seconds into ``phases``."""
    say(f"loading {args.dataset}")
    t0 = time.perf_counter()
    graph = load_dataset(args.dataset, directed=args.directed, cache_dir=args.cache_dir,
                         progress=say)
    phases["load"] = time.perf_counter() - t0
    say(f"{graph.summary()} ({phases['load']:.1f} s)")
    threads = args.threads if args.threads is not None else default_jobs()
    say(f"partitioning into {args.parts} parts with {args.method} "
        f"(balance {args.balance or DEFAULT_BALANCE[args.method]}"
        f"{f', {threads} threads' if args.method == 'kaminpar' else ''})")
    t0 = time.perf_counter()
    imbalance = DEFAULT_IMBALANCE if args.imbalance is None else args.imbalance
    part = partition_graph(graph, args.parts, args.method, seed=args.seed, balance=args.balance,
                           imbalance=imbalance, threads=threads)
    phases["partition"] = time.perf_counter() - t0
    say(f"partitioned in {phases['partition']:.1f} s")
    return graph, part


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_cli(lambda: run(args), args.debug, PROG)


if __name__ == "__main__":
    sys.exit(main())
