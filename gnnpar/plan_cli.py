"""``gnnpar-plan``: rank every distributed algorithm and grid for a graph and a world size by
the cost model, without running anything.

    gnnpar-plan --dataset rmat:scale=16,ef=16 --world 8
    gnnpar-plan --nodes 111059956 --edges 1615685872 --features 128 --classes 172 \\
                --world 256 --mem-cap 80GB          # ogbn-papers100M on 256 GPUs

Times use the cost model's machine figures (``--bandwidth``, ``--latency``; defaults in
``gnnpar.kernels.cost_model.Machine``); bytes and messages are per average rank per epoch.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from gnnpar.datasets import InputError, load_dataset
from gnnpar.datasets.limits import MAX_BYTES_ENV, parse_bytes
from gnnpar.kernels.cost_model import Machine, rank_algorithms

from .cli_common import run_cli

PROG = "gnnpar-plan"
#: most ranks a plan is made for: ranking every grid of a world size takes time and memory
#: in proportion to it (and to its number of factorisations), and no machine has more.
MAX_WORLD = 1 << 20


def add_max_memory_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="largest memory an input may need before it is refused, e.g. 64GiB "
                        "(default: env GNNPAR_MAX_BYTES, else 80%% of this machine's memory)")


def apply_max_memory(args) -> None:
    """``--max-memory``: checked, and put in the environment, where the size checks (and
    spawned ranks) read it."""
    if getattr(args, "max_memory", None) is None:
        return
    value = parse_bytes(args.max_memory)
    if value <= 0:
        raise InputError(f"--max-memory must be > 0, got {args.max_memory}")
    os.environ[MAX_BYTES_ENV] = repr(float(value))


def _positive_finite(flag: str, value) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InputError(f"{flag} must be a finite number > 0, got {value}")


def check_model_args(args) -> None:
    """The cost model's flags (shared by gnnpar-plan and gnnpar-train --algo auto)."""
    _positive_finite("--bandwidth", args.bandwidth)
    _positive_finite("--latency", args.latency)
    if args.mem_cap is not None and parse_bytes(args.mem_cap) <= 0:
        raise InputError(f"--mem-cap must be > 0, got {args.mem_cap}")


def check_world(world: int, flag: str = "--world") -> None:
    """Refuse a world size the ranking cannot handle (see :data:`MAX_WORLD`): it enumerates
    every factorisation and builds a ``world``-entry array for each grid."""
    if world > MAX_WORLD:
        raise InputError(f"{flag} must be at most {MAX_WORLD:,} ranks (the ranking takes time "
                         f"and memory in proportion to the world size), got {world:,}")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mem-cap", default=None,
                   help="per-rank memory cap, e.g. 80GB or 16GiB (default: none)")
    p.add_argument("--bandwidth", type=float, default=None,
                   help="bytes/s a rank sends (default: cost model's 25e9)")
    p.add_argument("--latency", type=float, default=None,
                   help="seconds per message (default: cost model's 5e-6)")


def machine_from(args):
    m = Machine()
    if args.bandwidth is not None:
        m.bandwidth = args.bandwidth
    if args.latency is not None:
        m.latency = args.latency
    return m


def plan(n: int, m: int, f_in: int, hidden: int, classes: int, layers: int, world: int,
         model: str, args, cut_fraction=None):
    if min(n, m, f_in, hidden, classes, layers, world) < 1:
        raise InputError("nodes, edges, features, hidden, classes, layers and world must be >= 1")
    check_world(world)
    widths = [f_in] + [hidden] * (layers - 1) + [classes]
    cap = parse_bytes(args.mem_cap) if args.mem_cap else None
    return rank_algorithms(n, m, widths, world, kind=model, mem_cap=cap,
                           machine=machine_from(args), cut_fraction=cut_fraction)


def format_table(rows, top: int) -> str:
    out = [f"{'#':>3} {'algo':<8} {'grid':<10} {'variant':<7} {'time s':>10} {'GB/rank':>9} "
           f"{'msgs':>8} {'mem GB':>8} fits"]
    for i, r in enumerate(rows[:top]):
        out.append(f"{i + 1:>3} {r['algo']:<8} {r['grid']:<10} {r['variant']:<7} "
                   f"{r['time_s']:10.4f} {r['bytes'] / 1e9:9.3f} {r['messages']:8.0f} "
                   f"{r['memory'] / 1e9:8.2f} {'yes' if r['fits'] else 'NO'}")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default=None, help="dataset spec (n, m, features, classes from it)")
    p.add_argument("--nodes", type=int, default=None, help="n, instead of --dataset")
    p.add_argument("--edges", type=int, default=None, help="non-zeros of Â (m), instead of --dataset")
    p.add_argument("--features", type=int, default=128, help="input width (with --nodes)")
    p.add_argument("--classes", type=int, default=16, help="output width (with --nodes)")
    p.add_argument("--world", type=int, required=True, help="number of ranks")
    p.add_argument("--model", choices=("gcn", "sage"), default="gcn", help="layer type")
    p.add_argument("--layers", type=int, default=3, help="GNN layers")
    p.add_argument("--hidden", type=int, default=256, help="hidden width")
    p.add_argument("--cut-fraction", type=float, default=None,
                   help="share of non-zeros with a remote column (default: random partition)")
    p.add_argument("--top", type=int, default=15, help="rows to print")
    p.add_argument("--json", action="store_true", help="one JSON object per row instead")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    add_model_args(p)
    add_max_memory_arg(p)
    return p


def run(args) -> int:
    if args.dataset is None and (args.nodes is None or args.edges is None):
        raise InputError("give --dataset SPEC, or --nodes N and --edges M")
    apply_max_memory(args)
    check_model_args(args)
    if args.world < 1:
        raise InputError(f"--world must be >= 1, got {args.world}")
    check_world(args.world)  # before a dataset is loaded
    if args.cut_fraction is not None and not 0.0 <= args.cut_fraction <= 1.0:
        raise InputError(f"--cut-fraction must be in [0, 1], got {args.cut_fraction}")
    if args.top < 1:
        raise InputError(f"--top must be >= 1, got {args.top}")
    if args.dataset is not None:
        g = load_dataset(args.dataset)
        n, m, f_in, classes = g.num_nodes, g.num_edges + g.num_nodes, g.num_features, g.num_classes
    else:
        n, m, f_in, classes = args.nodes, args.edges, args.features, args.classes
    rows = plan(n, m, f_in, args.hidden, classes, args.layers, args.world, args.model, args,
                args.cut_fraction)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(f"n={n:,} m={m:,} world={args.world} widths {f_in}->{args.hidden}x"
              f"{args.layers - 1}->{classes} ({args.model})")
        print(format_table(rows, args.top))
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(lambda: run(args), args.debug, PROG)


if __name__ == "__main__":
    sys.exit(main())
