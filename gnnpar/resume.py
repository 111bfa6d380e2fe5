"""Checkpoint and exact resume for a training run (``--checkpoint-dir``, ``--checkpoint-every``,
``--checkpoint-keep``, ``--resume``), and a checkpoint on SIGTERM (SLURM preemption).

Each rank keeps its own folder (``DIR/rank-00000/``…) of atomic, checksummed checkpoints
(``gnnpar.checkpoint``) holding the model, the optimizer, every RNG state and the epoch.
Checkpoints are taken at epoch boundaries, after the epoch's evaluation: every random draw
of the epoch is done, so restoring the RNG states there makes the resumed run bitwise equal
to an uninterrupted one on CPU. (Mini-batch samplers draw from (seed, epoch, rank, step)
alone, so their position needs no state of its own.)

The header records world size, grid, algorithm, mode and the partition/dataset fingerprint;
resuming with any of them changed is refused with a clear error (exit 2). On resume all ranks
agree on the newest epoch every rank holds intact; a damaged newest file is skipped (with a
warning) for the previous good one.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from gnnpar.datasets import InputError

from .checkpoint import (agree_on_step, good_steps, load_step, rank_dir, restore_rng,
                         save_checkpoint, capture_rng)


class Checkpointing:
    """Restore at start, save every ``every`` epochs and on SIGTERM; inactive without a dir."""

    def __init__(self, args, rank: int, meta: dict, model, opt, quiet: bool = True):
        self.dir = rank_dir(args.checkpoint_dir, rank) if args.checkpoint_dir else None
        self.every, self.keep = args.checkpoint_every, args.checkpoint_keep
        self.resume, self.meta = args.resume, meta
        self.model, self.opt, self.quiet = model, opt, quiet
        self.epoch = -1
        self.sigterm = None
        if self.dir is not None:
            os.makedirs(self.dir, exist_ok=True)
            from .watchdog import on_sigterm
            self.sigterm = on_sigterm(self.save_now, deferred=True)

    def restore(self) -> int:
        """The first epoch to run: 0, or the one after the newest checkpoint on every rank."""
        if self.dir is None or not self.resume:
            return 0
        step = agree_on_step(good_steps(self.dir))
        if step is None:
            self._say("--resume: no checkpoint yet, starting from epoch 0")
            return 0
        ck = load_step(self.dir, step, expect=self.meta)
        self.model.load_state_dict(ck.state["model"])
        self.opt.load_state_dict(ck.state["optimizer"])
        restore_rng(ck.state["rng"])
        self.epoch = step
        self._say(f"resumed from {ck.path} (epoch {step})")
        return step + 1

    def after_epoch(self, epoch: int) -> None:
        """Call at the end of every epoch, on every rank, at the same point."""
        if self.dir is None:
            return
        self.epoch = epoch
        if (epoch + 1) % self.every == 0:
            self.save_now()
        self.sigterm.check()  # all ranks agree; saves and exits 143 when one was signalled

    def save_now(self) -> None:
        if self.dir is None or self.epoch < 0:
            return
        state = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                 "rng": capture_rng(), "epoch": self.epoch}
        save_checkpoint(self.dir, state, self.epoch, keep=self.keep, meta=self.meta)

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(f"gnnpar-train: {msg}", file=sys.stderr)


def check_checkpoint_args(args) -> None:
    if args.resume and not args.checkpoint_dir:
        raise InputError("--resume needs --checkpoint-dir (the folder the run wrote to)")
    if args.checkpoint_every < 1:
        raise InputError(f"--checkpoint-every must be >= 1 epoch, got {args.checkpoint_every}")
    if args.checkpoint_keep < 1:
        raise InputError(f"--checkpoint-keep must be >= 1, got {args.checkpoint_keep}")


def run_meta(args, world: int, grid, fingerprint: Optional[str]) -> dict:
    """What a checkpoint must match to be resumed by this run."""
    return {"world_size": int(world), "grid": [int(g) for g in grid], "algo": args.algo,
            "mode": getattr(args, "mode", "fullbatch"), "model": args.model,
            "layers": int(args.layers), "hidden": int(args.hidden), "fingerprint": fingerprint}
