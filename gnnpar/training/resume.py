"""Checkpoint and exact resume for a training run (``--checkpoint-dir``, ``--checkpoint-every``,
``--checkpoint-keep``, ``--resume``), and a checkpoint on SIGTERM (SLURM preemption).

Each rank keeps its own folder (``DIR/rank-00000/``…) of atomic, checksummed checkpoints
(``gnnpar.training.checkpoint``) holding the model, the optimizer, every RNG state, the epoch and
the run totals so far (the final record's, :func:`gnnpar.training.logged.final_metrics`).
Checkpoints are taken at epoch boundaries, after the epoch's evaluation: every random draw
of the epoch is done, so restoring the RNG states there makes the resumed run bitwise equal
to an uninterrupted one on CPU. (Mini-batch samplers draw from (seed, epoch, rank, step)
alone, so their position needs no state of its own.)

A checkpoint folder belongs to one run identity (:func:`run_meta`: dataset/partition
fingerprint, model shape, dropout, seed, learning rate and weight decay, world size, grid,
algorithm, mode and the mini-batch settings; a GAT's heads and attention dropout as the model
uses them, :func:`attention_settings`). Before any epoch runs:

- ``DIR`` is claimed (``gnnpar.datasets.owned``, kind ``checkpoints``): a new or empty folder
  is marked with the identity; a folder holding anything gnnpar did not write, another kind
  of gnnpar output or another identity is refused (exit 2, the differing keys named);
- rank 0 holds an exclusive lock on ``DIR/.gnnpar-lock`` until its last checkpoint, so a
  second run on the folder fails at once (exit 2, the holder's pid named);
- without ``--resume``, a folder that already holds checkpoints is refused (pass ``--resume``
  to continue that run, or give a new folder) — nothing is deleted.

Every checkpoint's header records the identity too; resuming with any of it changed is
refused (exit 2). On resume all ranks agree on the newest epoch every rank holds intact and
can load: a damaged newest file, or one the safe loader refuses, is skipped (with a warning)
for the previous good one; checkpoint files with none usable is exit 2 naming the folder.
Rotation (``--checkpoint-keep``) deletes only checkpoints of this identity whose checksum
holds.

A resume whose checkpoint is the last epoch (SIGTERM in the last epoch, or after the final
record) trains nothing: :func:`gnnpar.training.logged.train_logged` writes the final record and the
model and the run exits 0, so a requeue loop always ends.
"""
from __future__ import annotations

import json
import os
import re
import sys
import warnings
from typing import Optional

from gnnpar.datasets import InputError
from gnnpar.datasets.owned import (check_claimable, check_identity, check_writable_folder, claim,
                                   read_claim, write_marker)
from gnnpar.sampling.neighbor import parse_fanouts

from gnnpar.nn.model_registry import facts
from gnnpar.nn.attention import GAT_HEADS
from gnnpar.training.checkpoint import (CheckpointWarning, CorruptCheckpoint, FolderLock,
                                        agree_on_error, agree_on_failure, agree_on_step,
                                        capture_rng, file_name, list_steps, load_step, rank_dir,
                                        read_verified, restore_rng, save_checkpoint)
from gnnpar.training.trainer import default_weight_decay
from gnnpar.launcher.watchdog import on_sigterm

KIND, WHAT = "checkpoints", "--checkpoint-dir"


class Checkpointing:
    """Claim and lock the folder, restore at start, save every ``every`` epochs and on
    SIGTERM; inactive without a dir. All ranks construct it at the same point (it agrees
    with the other ranks on whether the folder may be used)."""

    def __init__(self, spec, rank: int, meta: dict, model, opt, quiet: bool = True):
        self.base = spec.checkpoint.checkpoint_dir or None
        self.dir = rank_dir(self.base, rank) if self.base else None
        self.rank = rank
        self.every, self.keep = spec.checkpoint.checkpoint_every, spec.checkpoint.checkpoint_keep
        self.resume = spec.checkpoint.resume
        self.meta = as_recorded(json.loads(json.dumps(dict(meta))),
                                recorded_identity(self.base))
        self.last_epoch = int(spec.train.epochs) - 1
        self.model, self.opt, self.quiet = model, opt, quiet
        self.epoch = -1
        self.totals: Optional[dict] = None  #: the run totals up to ``epoch`` (logged.final_metrics)
        self.sigterm = None
        self.lock: Optional[FolderLock] = None
        if self.dir is not None:
            try:
                self.lock = setup_folder(self.base, rank, self.meta, self.resume)
                os.makedirs(self.dir, exist_ok=True)
            except BaseException:
                self.release()
                raise
            self.sigterm = on_sigterm(self.save_now, deferred=True)

    def restore(self) -> int:
        """The first epoch to run: 0, or the one after the newest checkpoint on every rank
        (``--epochs`` when that checkpoint is the last epoch: the run has only its outputs
        left to write)."""
        if self.dir is None:
            return 0
        try:
            start = self._restore() if self.resume else 0
        except BaseException:
            self.release()
            raise
        if start > self.last_epoch:
            self.release()  # nothing left to train: no checkpoint will be written
        return start

    def _restore(self) -> int:
        candidates, problems = [], []
        for step in list_steps(self.dir):
            try:
                read_verified(os.path.join(self.dir, file_name(step)))
                candidates.append(step)
            except (CorruptCheckpoint, OSError) as e:
                problems.append(str(e))
                warnings.warn(f"skipping damaged checkpoint: {e}", CheckpointWarning,
                              stacklevel=2)
        had_files = bool(candidates or problems)
        while True:
            step = agree_on_step(candidates)
            if step is None:
                break
            ck, refused, damaged = None, None, None
            try:
                ck = load_step(self.dir, step, expect=self.meta)
            except (CorruptCheckpoint, OSError) as e:  # e.g. a payload the safe loader refuses
                damaged = str(e)
            except InputError as e:  # written by another run identity
                refused = str(e)
            refused = agree_on_error(refused)
            if refused is not None:
                raise InputError(refused)
            if damaged is not None:
                problems.append(damaged)
                warnings.warn(f"skipping damaged checkpoint: {damaged}", CheckpointWarning,
                              stacklevel=2)
                candidates.remove(step)
            if agree_on_error("bad" if damaged is not None else None) is None:
                self.model.load_state_dict(ck.state["model"])
                self.opt.load_state_dict(ck.state["optimizer"])
                restore_rng(ck.state["rng"])
                self.epoch = step
                self.totals = ck.state.get("totals")  # None: written before they were carried
                self._say(f"resumed from {ck.path} (epoch {step})")
                return step + 1
        why = None
        if had_files:
            why = (f"every checkpoint in {self.dir} is damaged or unreadable ({problems[0]})"
                   if not candidates and problems else
                   f"the ranks hold no epoch in common ({self.dir} has "
                   f"{', '.join(map(str, candidates)) or 'none intact'})")
        why = agree_on_error(why)
        if why is not None:
            raise InputError(f"--resume: no usable checkpoint in {WHAT} {self.base}: {why}; "
                             "restore the files or give a new folder (without --resume)")
        self._say("--resume: no checkpoint yet, starting from epoch 0")
        return 0

    def after_epoch(self, epoch: int, totals: Optional[dict] = None) -> None:
        """Call at the end of every epoch, on every rank, at the same point; ``totals``: the
        run's so far (:func:`gnnpar.training.logged.final_metrics`), saved with the checkpoint so a
        resumed run's final record covers every segment."""
        if self.dir is None:
            return
        self.epoch, self.totals = epoch, totals
        if (epoch + 1) % self.every == 0:
            self.save_now()
        self.sigterm.check()  # all ranks agree; saves and exits 143 when one was signalled
        if epoch >= self.last_epoch:
            self.release()  # the run's last checkpoint is written

    def save_now(self) -> None:
        if self.dir is None or self.epoch < 0:
            return
        if self.lock is not None and self.lock.held:
            self._keep_marker()
        state = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                 "rng": capture_rng(), "epoch": self.epoch}
        if self.totals is not None:
            state["totals"] = dict(self.totals)
        save_checkpoint(self.dir, state, self.epoch, keep=self.keep, meta=self.meta)

    def release(self) -> None:
        """Let go of the folder lock (rank 0): after the last checkpoint, or on an error."""
        if self.lock is not None:
            self.lock.release()

    def close(self) -> None:
        """Training is over (however it ended): put back the SIGTERM handler that was there
        before and let go of the folder. Safe to call twice."""
        if self.sigterm is not None:
            self.sigterm.uninstall()
            self.sigterm = None
        self.release()

    def _keep_marker(self) -> None:
        """The lock holder owns the folder: put its marker back if a run that lost the race
        for a brand-new folder overwrote it before failing to get the lock."""
        found = read_claim(self.base)
        if found is None or found.get("kind") != KIND or found.get("identity") != self.meta:
            write_marker(self.base, {"tool": "gnnpar", "kind": KIND, "identity": self.meta})

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(f"gnnpar-train: {msg}", file=sys.stderr)


def setup_folder(base: str, rank: int, identity: dict, resume: bool) -> Optional[FolderLock]:
    """Claim ``base`` for this run identity and lock it (rank 0), then check it on every
    rank; every rank raises the same InputError when any refuses. Returns rank 0's lock."""
    lock, failure = None, None
    if rank == 0:
        try:
            lock = _claim_and_lock(base, identity)
            if not resume:
                _refuse_earlier_checkpoints(base, _rank_dirs(base))
        except Exception as e:  # noqa: BLE001 - the other ranks must learn of it too
            failure = e
    _agree_setup(failure, lock)
    if rank != 0:
        try:
            # the marker rank 0 wrote (shared folder), or this node's own (node-local disks)
            claim(base, KIND, identity, WHAT)
            if not resume:
                _refuse_earlier_checkpoints(base, [rank_dir(base, rank)])
        except Exception as e:  # noqa: BLE001
            failure = e
    _agree_setup(failure, lock)
    return lock


_BAD_INPUT, _FAILED = 0, 1  #: kinds of a setup failure the ranks agree on


def _agree_setup(failure: Optional[BaseException], lock: Optional[FolderLock]) -> None:
    word = None
    if isinstance(failure, OSError):  # the user's path: cannot be created, locked, listed
        failure = InputError(f"{WHAT}: cannot use it: {failure.strerror or failure}"
                             + (f": {failure.filename}" if failure.filename else ""))
    if failure is not None:
        word = (_BAD_INPUT if isinstance(failure, InputError) else _FAILED,
                str(failure) or type(failure).__name__)
    agreed = agree_on_failure(word)
    if agreed is None:
        return
    if lock is not None:
        lock.release()
    if failure is not None:
        raise failure
    kind, text = agreed
    if kind == _BAD_INPUT:
        raise InputError(text)
    raise RuntimeError(f"another rank could not set up {WHAT} {text}")


def _claim_and_lock(base: str, identity: dict) -> FolderLock:
    check_writable_folder(base, WHAT)
    found = read_claim(base) if os.path.isdir(base) else None
    if found is not None and found.get("kind") == KIND:
        lock = FolderLock(base, WHAT)  # "in use by another run" before any identity talk
        try:
            claim(base, KIND, identity, WHAT)
        except BaseException:
            lock.release()
            raise
        return lock
    claim(base, KIND, identity, WHAT)  # marks a new or empty folder, refuses anything else
    lock = FolderLock(base, WHAT)
    try:
        claim(base, KIND, identity, WHAT)  # again under the lock: a run racing us to mark it
    except BaseException:
        lock.release()
        raise
    return lock


def _refuse_earlier_checkpoints(base: str, folders) -> None:
    steps = [s for d in folders if os.path.isdir(d) for s in list_steps(d)]
    if steps:
        raise InputError(f"{WHAT} {base} already holds checkpoints (newest: epoch "
                         f"{max(steps)}); pass --resume to continue that run, or give a new "
                         "folder to start over")


def check_checkpoint_args(args) -> None:
    """The checkpoint flags, and the folder as far as the flags alone judge it: a path that is
    a file, a folder that cannot be written, a folder holding files gnnpar did not write or
    another kind of gnnpar output (all exit 2). What the run's identity decides comes once
    the spec is built (:func:`check_checkpoint_folder`)."""
    if args.resume and not args.checkpoint_dir:
        raise InputError("--resume needs --checkpoint-dir (the folder the run wrote to)")
    if args.checkpoint_every < 1:
        raise InputError(f"--checkpoint-every must be >= 1 epoch, got {args.checkpoint_every}")
    if args.checkpoint_keep < 1:
        raise InputError(f"--checkpoint-keep must be >= 1, got {args.checkpoint_keep}")
    folder = args.checkpoint_dir
    if not folder:
        return
    ranks = _rank_dirs(folder)
    if ranks and read_claim(folder) is None and len(ranks) == len(os.listdir(folder)):
        raise InputError(f"{WHAT} {folder} was written by an older gnnpar that recorded no run "
                         "identity: its checkpoints cannot be resumed safely; give a new folder")
    check_claimable(folder, KIND, WHAT)


def check_checkpoint_folder(spec) -> None:
    """The checkpoint folder against the run ``spec`` (a RunSpec, checked by
    :func:`check_checkpoint_args`): another run's identity in its marker, as far as the flags
    decide it (the dataset's fingerprint and the world's layout come at setup; an unset
    ``--macrobatch`` is resolved with the device), or, without ``--resume``, checkpoints it
    already holds (exit 2)."""
    folder = spec.checkpoint.checkpoint_dir
    if not folder:
        return
    found = check_claimable(folder, KIND, WHAT)
    if found is not None and found.get("identity"):
        theirs = found["identity"]
        asked = run_meta(spec, 0, [], None)
        mine = {k: v for k, v in as_recorded(asked, theirs).items()
                if k not in ("world_size", "grid", "fingerprint", "macrobatch") and k in theirs}
        check_identity(folder, {"identity": {k: theirs[k] for k in mine}}, mine, WHAT)
    if not spec.checkpoint.resume:  # on this host's disk; every rank checks its own again
        _refuse_earlier_checkpoints(folder, _rank_dirs(folder))


def _rank_dirs(base: str):
    if not os.path.isdir(base):
        return []
    return sorted(os.path.join(base, e) for e in os.listdir(base)
                  if re.fullmatch(r"rank-\d{5,}", e) and os.path.isdir(os.path.join(base, e)))


def run_meta(spec, world: int, grid, fingerprint: Optional[str]) -> dict:
    """The run identity: what a checkpoint folder and each checkpoint must match to be
    resumed by this run (JSON values). ``spec``: a RunSpec (its sections)."""
    mode, task = spec.batch.mode, spec.link.task
    meta = {"world_size": int(world), "grid": [int(g) for g in grid], "algo": spec.parallel.algo,
            "mode": mode, "model": spec.model.model, "layers": int(spec.model.layers),
            "hidden": int(spec.model.hidden), "dropout": float(spec.model.dropout),
            "fingerprint": fingerprint, "seed": int(spec.train.seed), "lr": float(spec.train.lr),
            "weight_decay": float(default_weight_decay(task) if spec.train.weight_decay is None
                                  else spec.train.weight_decay),
            "variant": spec.parallel.variant, "replication": spec.parallel.replication}
    meta.update(attention_settings(spec.model))
    if spec.model.model_args:  # runs without any add nothing: old checkpoints fit
        meta["model_args"] = dict(spec.model.model_args)
    if task == "link":  # node runs add nothing: old checkpoints fit
        meta.update({"task": "link", "link_split": spec.link.link_split,
                     "neg_ratio": int(spec.link.neg_ratio), "decoder": spec.link.decoder})
    if mode == "minibatch":
        macro = spec.batch.macrobatch
        meta.update({"fanouts": list(parse_fanouts(spec.batch.fanouts)),
                     "batch_size": int(spec.batch.batch_size),
                     "macrobatch": 1 if macro is None else int(macro),
                     "group_size": spec.batch.group_size, "replace": bool(spec.batch.replace)})
    return meta


def attention_settings(m) -> dict:
    """A GAT's ``heads`` and ``attn_dropout`` as the model uses them: ``--heads`` or
    :data:`~gnnpar.nn.attention.GAT_HEADS`, ``--attn-dropout`` or ``--dropout``'s (a run that
    spells out a default is the same run as one that leaves it out); empty for other
    models. ``m``: a run spec's ``model`` section, or the parsed flags (the same names)."""
    if not facts(m.model).attention:
        return {}
    heads, attn = m.heads, m.attn_dropout
    return {"heads": int(GAT_HEADS if heads is None else heads),
            "attn_dropout": float(m.dropout if attn is None else attn)}


def as_recorded(meta: dict, recorded: Optional[dict]) -> dict:
    """``meta`` in the form the ``recorded`` identity of an existing folder has it: gnnpar
    once recorded a GAT's ``heads``/``attn_dropout`` as given, None for the default, so where
    ``recorded`` has None and ``meta`` the default, None is kept (the same run: its folder
    stays resumable and keeps one identity throughout)."""
    if not recorded or not facts(meta.get("model")).attention:
        return meta
    defaults = {"heads": GAT_HEADS, "attn_dropout": meta.get("dropout")}
    return {k: None if k in defaults and k in recorded and recorded[k] is None
            and v == defaults[k] else v for k, v in meta.items()}


def recorded_identity(folder: Optional[str]) -> Optional[dict]:
    """The run identity marked on the checkpoint folder ``folder``, if it has one."""
    found = read_claim(folder) if folder and os.path.isdir(folder) else None
    if found is None or found.get("kind") != KIND or not isinstance(found.get("identity"), dict):
        return None
    return found["identity"]
