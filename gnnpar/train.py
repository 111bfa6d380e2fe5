"""``gnnpar-train``: train a GNN on one dataset spec.

One process (serial reference)::

    gnnpar-train --dataset rmat:scale=14,ef=8 --model gcn --epochs 100

Four local ranks, sparsity-aware 1D, METIS shards::

    gnnpar-train --algo 1d-halo --nprocs 4 --partitioner metis --dataset rmat:scale=14,ef=8

torchrun (one node, 4 ranks; shards written beforehand by gnnpar-partition)::

    torchrun --nproc-per-node 4 -m gnnpar.train --algo 2d --grid 2x2 --partition-dir shards/

Also ``python -m gnnpar.train ...``. Exit codes: 0 success, 2 bad input, 1 internal error,
4 training diverged (the loss became NaN or infinite; see ``cli_common.EXIT_DIVERGED``).
"""
from __future__ import annotations

import sys

import torch

from gnnpar.datasets import DEFAULT_SPEC, InputError, load_dataset

from .cli_common import EXIT_DIVERGED, run_cli
from .logged import train_logged
from .models import build_model
from .options import build_parser, check_args
from .serial import SerialRuntime
from .resume import Checkpointing, run_meta
from .trainer import TrainConfig, fit, make_optimizer


def pick_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for but torch sees no CUDA device")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def run(args) -> int:
    check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    args.device_resolved = str(device)
    from .bootstrap import detect_world
    from .dist_train import run_distributed
    minibatch = args.mode == "minibatch"
    if (args.algo != "serial" or minibatch) and (args.nprocs or detect_world().launched):
        return _finish(run_distributed(args), args)
    if args.algo != "serial":
        raise InputError(f"--algo {args.algo} needs --nprocs N or a launcher (torchrun, srun)")
    if minibatch:
        from .sampling.run import run_serial_cli
        return _finish(run_serial_cli(args, device), args)
    torch.manual_seed(args.seed)
    graph = load_dataset(args.dataset or DEFAULT_SPEC, directed=args.directed,
                         cache_dir=args.cache_dir)
    if not args.quiet:
        print(graph.summary(), file=sys.stderr)
    model = build_model(args.model, graph.num_features, args.hidden, graph.num_classes,
                        args.layers, args.dropout).to(device)
    rt = SerialRuntime(graph, model.norm, device)
    cfg = TrainConfig(epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay)
    opt = make_optimizer(model, cfg)
    fingerprint = graph.fingerprint() if args.checkpoint_dir else None
    ckpt = Checkpointing(args, 0, run_meta(args, 1, [1], fingerprint), model, opt, args.quiet)
    final = train_logged(lambda on_epoch, start: fit(model, rt, cfg, on_epoch, start, opt),
                         model, args, {"algo": "serial", "world_size": 1, "grid": [1]}, True,
                         "train", {"f_in": graph.num_features, "f_out": graph.num_classes},
                         ckpt=ckpt)
    return _finish(final, args)


def _finish(final: dict, args) -> int:
    """Print the final metrics; the exit code: 0, or EXIT_DIVERGED with one line saying so."""
    _print_final(final, args.quiet)
    epoch = final.get("diverged_epoch")
    if epoch is None:
        return 0
    skipped = [what for flag, what in (("save_model", "--save-model not written"),
                                       ("checkpoint_dir", "that epoch not checkpointed"))
               if getattr(args, flag, None)]
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
