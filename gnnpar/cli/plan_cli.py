"""``gnnpar-plan``: rank every distributed algorithm and grid for a graph and a world size by
the cost model, without running anything.

    gnnpar-plan --dataset rmat:scale=16,ef=16 --world 8
    gnnpar-plan --dataset rmat:scale=16,ef=16 --world 8 --partitioner metis   # exact, per rank
    gnnpar-plan --dataset rmat:scale=16,ef=16 --world 8 --partitioner metis --comm-dtype bf16
    gnnpar-plan --nodes 111059956 --edges 1615685872 --features 128 --classes 172 \\
                --world 256 --mem-cap 80GB          # ogbn-papers100M on 256 GPUs
    gnnpar-plan --calibrate [--calibration rates.json]   # probe this machine (seconds)
    gnnpar-plan --dataset ... --world 8 --calibration rates.json

Times use the cost model's machine figures: a calibration file (``--calibration PATH`` or env
``GNNPAR_CALIBRATION``, written by ``--calibrate``), else the defaults of
``gnnpar.kernels.cost_model.Machine``; ``--bandwidth``/``--latency`` override either. With
``--partitioner`` the dataset is partitioned and bytes and messages are the busiest rank's
(``bytes`` padded, as the collectives move them; ``comm_bytes_max_rank`` logical, as
``gnnpar-train`` logs them) on the blocks ``gnnpar-train`` builds with the same ``--seed``,
``--block-layout``, ``--comm-dtype`` and ``--precision``; otherwise they are the average rank's
estimate.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from gnnpar.datasets import InputError, load_dataset
from gnnpar.datasets.limits import parse_bytes
from gnnpar.datasets.owned import refuse_claimed
from gnnpar.kernels.blocks import BLOCK_LAYOUTS
from gnnpar.kernels.comm import WIRE_DTYPES
from gnnpar.kernels.cost_model import Machine, Structure, rank_algorithms
from gnnpar.kernels.cost_terms import gat_kind
from gnnpar.partitioners import partition_graph

from gnnpar.nn.model_registry import built_in, facts
from gnnpar.cli.calibrate import (CALIBRATION_ENV, DEFAULT_PATH, calibrate,
                                  check_target as check_calibration_target, machine_for, save)
from gnnpar.nn.attention import GAT_HEADS, check_heads
from gnnpar.cli.cli_common import (MAX_RANKS, DefaultsHelpFormatter, add_max_memory_arg,
                                   apply_max_memory, check_bounds, run_cli)
from gnnpar.nn.precision import PRECISIONS

PROG = "gnnpar-plan"
#: most ranks a plan is made for: ranking every grid of a world size takes time and memory
#: in proportion to it (and to its number of factorisations), and no machine has more.
MAX_WORLD = MAX_RANKS


def _positive_finite(flag: str, value) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InputError(f"{flag} must be a finite number > 0, got {value}")


def check_model_args(args) -> None:
    """The cost model's flags (shared by gnnpar-plan and gnnpar-train --algo auto), checked
    and nothing else: gnnpar-train's run spec carries ``--calibration``, which its launcher's
    plan reads (:func:`machine_from`)."""
    _positive_finite("--bandwidth", args.bandwidth)
    _positive_finite("--latency", args.latency)
    path = getattr(args, "calibration", None)
    if path is not None and not getattr(args, "calibrate", False):
        Machine.load(path)  # refused now, not after the dataset is loaded
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
    p.add_argument("--calibration", default=None, metavar="PATH",
                   help="time figures measured by `gnnpar-plan --calibrate` (JSON; default: "
                        f"env {CALIBRATION_ENV}, else the cost model's defaults)")


def machine_from(args):
    """The cost model's machine: the calibration file (``--calibration`` or the environment
    variable), else the defaults; ``--bandwidth``/``--latency`` override either."""
    m = machine_for(getattr(args, "calibration", None)) or Machine()
    if args.bandwidth is not None:
        m.bandwidth = args.bandwidth
    if args.latency is not None:
        m.latency = args.latency
    return m


def plan(n: int, m: int, f_in: int, hidden: int, classes: int, layers: int, world: int,
         model: str, args, cut_fraction=None, structure=None):
    """The ranked rows (:func:`rank_algorithms`); ``structure`` (Â and a partition into
    ``world`` parts) makes them exact and per busiest rank. ``args``: the model's flags and the
    run's (``block_layout``, ``seed``, ``comm_dtype``, ``precision``: gnnpar-plan's, or a
    gnnpar-train :class:`~gnnpar.cli.spec.RunSpec`), so the blocks and the wire are the run's."""
    if min(n, m, f_in, hidden, classes, layers, world) < 1:
        raise InputError("nodes, edges, features, hidden, classes, layers and world must be >= 1")
    check_world(world)
    widths = [f_in] + [hidden] * (layers - 1) + [classes]
    cap = parse_bytes(args.mem_cap) if args.mem_cap else None
    rows = rank_algorithms(n, m, widths, world, kind=cost_kind(model, args), mem_cap=cap,
                           machine=machine_from(args), cut_fraction=cut_fraction,
                           structure=structure, settings=args)
    return rows


def cost_kind(model: str, args) -> str:
    """The cost model's ``kind`` of ``--model``: GAT with its heads (``--heads``, default
    :data:`GAT_HEADS`); a user's model (``package.module:factory``) is estimated as GCN, one
    product a layer at the narrower width."""
    if facts(model).attention:
        heads = getattr(args, "heads", None)
        return gat_kind(GAT_HEADS if heads is None else heads)
    return facts(model).cost


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
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("--dataset", default=None, help="dataset spec (n, m, features, classes from it)")
    p.add_argument("--nodes", type=int, default=None, help="n, instead of --dataset")
    p.add_argument("--edges", type=int, default=None,
                   help="non-zeros of Â (m), instead of --dataset")
    p.add_argument("--features", type=int, default=128, help="input width (with --nodes)")
    p.add_argument("--classes", type=int, default=16, help="output width (with --nodes)")
    p.add_argument("--world", type=int, default=None, help="number of ranks (required unless "
                   "--calibrate)")
    p.add_argument("--partitioner", default=None,
                   help="with --dataset: partition it (block | random | metis | kaminpar) and "
                        "model every rank exactly (default: average-rank estimate)")
    p.add_argument("--seed", type=int, default=0,
                   help="the run's --seed: the partitioner's and the balanced block layout's "
                        "(with --partitioner)")
    p.add_argument("--block-layout", default="balanced", choices=BLOCK_LAYOUTS,
                   help="the run's --block-layout: 2d/3d/4d row ownership (balanced: the seeded "
                        "random balanced set; parts: the partition's parts)")
    p.add_argument("--comm-dtype", default="fp32", choices=tuple(WIRE_DTYPES),
                   help="the run's --comm-dtype: wire format of the SpMM exchanges (the "
                        "gradient all-reduce and 3d's matrix pieces stay as they are)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="the run's --precision (bf16: the SpMM exchanges move bf16 features)")
    p.add_argument("--calibrate", action="store_true",
                   help="probe this machine (a few seconds: SpMM, dense and elementwise rates, "
                        f"latency and bandwidth of 2 local gloo ranks) and write the figures to "
                        f"--calibration "
                        f"(default {DEFAULT_PATH})")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per process while calibrating (1: one thread per rank)")
    p.add_argument("--model", choices=built_in(), default="gcn",
                   help="layer type (gat: only the algorithms that run it are ranked)")
    p.add_argument("--heads", type=int, default=None,
                   help=f"--model gat: attention heads (default {GAT_HEADS}); --hidden is the "
                        "width in all")
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


def run_calibrate(args) -> int:
    if args.threads < 1:
        raise InputError(f"--threads must be >= 1, got {args.threads}")
    path = args.calibration or DEFAULT_PATH
    check_calibration_target(path)  # before the probe: a refusal costs no seconds
    refuse_claimed("--calibration", path)  # nor into another gnnpar folder
    record = calibrate(threads=args.threads)
    save(record, path)
    print(f"wrote {path}: bandwidth {record['bandwidth'] / 1e9:.3g} GB/s, latency "
          f"{record['latency'] * 1e6:.3g} us, SpMM {record['spmm_rate'] / 1e9:.3g} GFLOP/s, "
          f"dense {record['dense_rate'] / 1e9:.3g} GFLOP/s, elementwise "
          f"{record['elementwise_rate'] / 1e9:.3g} G row-features/s, fixed "
          f"{record['step_overhead'] * 1e3:.3g} ms a step + {record['layer_overhead'] * 1e3:.3g} "
          f"ms a layer ({args.threads} thread(s), "
          f"probe {record['probe_s']:.1f} s)")
    return 0


def run(args) -> int:
    check_bounds(args)  # --threads, --seed, --hidden, --layers: before any work
    apply_max_memory(args.max_memory)  # the probe's graphs are judged by it too
    if args.calibrate:
        return run_calibrate(args)
    if args.world is None:
        raise InputError("give --world P (or --calibrate)")
    if args.partitioner is not None and args.dataset is None:
        raise InputError("--partitioner needs --dataset (the graph to partition)")
    if args.dataset is None and (args.nodes is None or args.edges is None):
        raise InputError("give --dataset SPEC, or --nodes N and --edges M")
    check_model_args(args)
    check_heads(args.model, args.heads, args.hidden)
    if args.world < 1:
        raise InputError(f"--world must be >= 1, got {args.world}")
    check_world(args.world)  # before a dataset is loaded
    if args.cut_fraction is not None and not 0.0 <= args.cut_fraction <= 1.0:
        raise InputError(f"--cut-fraction must be in [0, 1], got {args.cut_fraction}")
    if args.top < 1:
        raise InputError(f"--top must be >= 1, got {args.top}")
    structure = None
    if args.dataset is not None:
        g = load_dataset(args.dataset)
        n, m, f_in, classes = g.num_nodes, g.num_edges + g.num_nodes, g.num_features, g.num_classes
        if args.partitioner is not None:
            part = partition_graph(g, args.world, args.partitioner, seed=args.seed)
            structure = Structure.from_graph(g, part.owner, args.world)
    else:
        n, m, f_in, classes = args.nodes, args.edges, args.features, args.classes
    rows = plan(n, m, f_in, args.hidden, classes, args.layers, args.world, args.model, args,
                args.cut_fraction, structure)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(f"n={n:,} m={m:,} world={args.world} widths {f_in}->{args.hidden}x"
              f"{args.layers - 1}->{classes} ({args.model}); "
              + (f"{args.partitioner} partition, busiest rank" if structure is not None
                 else "average rank estimate"))
        print(format_table(rows, args.top))
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(lambda: run(args), args.debug, PROG)


if __name__ == "__main__":
    sys.exit(main())
