"""``gnnpar-train``'s link-prediction flags (``--task link``) and their checks: the values,
and the other flags a link run cannot honour yet, refused by name before any work."""
from __future__ import annotations

import argparse

from gnnpar.datasets import InputError

from gnnpar.link.decoders import DECODERS, build_decoder
from gnnpar.link.negatives import MAX_RATIO, check_ratio
from gnnpar.link.split import DEFAULT_FRACTIONS, parse_fractions

TASKS = ("node", "link")
DEFAULT_SPLIT = ",".join(f"{f:g}" for f in DEFAULT_FRACTIONS)
#: flags a --task link run refuses, and why
UNSUPPORTED = {
    "partition_dir": (None, "shards written before do not carry the edge split; let the run "
                            "partition the dataset (drop --partition-dir)"),
    "save_predictions": (None, "link runs write no node predictions"),
}


def add_link_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("link prediction")
    g.add_argument("--task", choices=TASKS, default="node",
                   help="node: classify vertices (their labels); link: predict edges — the "
                        "model's output rows are embeddings scored pair by pair, trained on a "
                        "split of the edges that keeps held-out ones out of the graph")
    g.add_argument("--link-split", default=DEFAULT_SPLIT, metavar="TRAIN,VAL,TEST",
                   help="--task link: shares of the undirected edges (seeded by --seed; both "
                        "directions of an edge on one side)")
    g.add_argument("--neg-ratio", type=int, default=1, metavar="K",
                   help=f"--task link: negatives a training positive (1..{MAX_RATIO:,})")
    g.add_argument("--decoder", default="dot",
                   metavar="{" + ",".join(DECODERS) + ",package.module:factory}",
                   help="--task link: the pair score: dot = <z_u, z_v>; mlp = an MLP on "
                        "z_u * z_v; or your own: factory(width) returning a torch.nn.Module "
                        "whose forward(z_u, z_v) gives one logit a pair")


def check_link_args(args) -> None:
    """Refuse bad link values, link flags on a node run, and flags a link run cannot honour."""
    if args.task != "link":
        for flag, default in (("link_split", DEFAULT_SPLIT), ("neg_ratio", 1),
                              ("decoder", "dot")):
            if getattr(args, flag) != default:
                raise InputError(f"--{flag.replace('_', '-')} applies to --task link")
        return
    parse_fractions(args.link_split)
    check_ratio(args.neg_ratio)
    build_decoder(args.decoder, args.hidden)  # a user's factory imported and tried once
    for flag, (bad, why) in UNSUPPORTED.items():
        value = getattr(args, flag, None)
        if (value == bad) if bad is not None else value:
            raise InputError(f"--task link with --{flag.replace('_', '-')}"
                             f"{' ' + bad if bad else ''}: {why}")
    if args.reorder not in ("auto", "none"):
        raise InputError(f"--task link with --reorder {args.reorder}: the edge split is in the "
                         "dataset's own order, which link runs keep")
