"""``gnnpar-train``: train a GNN on one dataset spec.

One process (serial reference)::

    gnnpar-train --dataset rmat:scale=14,ef=8 --model gcn --epochs 100

Four local ranks, sparsity-aware 1D, METIS shards::

    gnnpar-train --algo 1d-halo --nprocs 4 --partitioner metis --dataset rmat:scale=14,ef=8

torchrun (one node, 4 ranks; shards written beforehand by gnnpar-partition)::

    torchrun --nproc-per-node 4 -m gnnpar.train --algo 2d --grid 2x2 --partition-dir shards/

Also ``python -m gnnpar.train ...``. Exit codes: 0 success, 2 bad input, 1 internal error,
3 a lost rank (one that died, or whose heartbeat stopped for ``--timeout`` seconds; local
``--nprocs`` ranks and launched ones alike), 4 training diverged (the loss became NaN or
infinite; see ``cli_common.EXIT_DIVERGED``), 143 preempted (SIGTERM).
"""
from __future__ import annotations

import sys

from gnnpar.cli.cli_common import EXIT_DIVERGED, run_cli
from gnnpar.launcher.launch import launch
from gnnpar.cli.options import build_parser
from gnnpar.cli.spec import RunSpec


def run(args) -> int:
    """Check the flags into a :class:`~gnnpar.cli.spec.RunSpec`, run it, report."""
    spec = RunSpec.from_args(args)
    return _finish(launch(spec), spec)


def _finish(final: dict, spec: RunSpec) -> int:
    """Print the final metrics; the exit code: 0, or EXIT_DIVERGED with one line saying so."""
    _print_final(final, spec.output.quiet)
    epoch = final.get("diverged_epoch")
    if epoch is None:
        return 0
    skipped = [what for given, what in (
        (spec.output.save_model, "--save-model not written"),
        (spec.checkpoint.checkpoint_dir, "that epoch not checkpointed")) if given]
    print(f"gnnpar-train: training diverged at epoch {epoch} (loss {final.get('loss')}); "
          f"stopped{''.join(', ' + w for w in skipped)}; lower --lr or scale the input features",
          file=sys.stderr)
    return EXIT_DIVERGED


def _print_final(final: dict, quiet: bool) -> None:
    if not quiet:
        print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in final.items() if k != "final"), file=sys.stderr)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(lambda: run(args), args.debug, "gnnpar-train")


if __name__ == "__main__":
    sys.exit(main())
