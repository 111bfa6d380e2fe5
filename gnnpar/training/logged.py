"""One training run as the CLI shows it: a progress bar and a JSON line per epoch on the lead
rank, the final record, and the saved weights — the same for every mode and algorithm.

A run's outputs are finished by whichever segment of it trains the last epoch, or by a
``--resume`` whose checkpoint already is the last epoch (a SIGTERM in or after the last
epoch): that one trains nothing, writes the final record and ``--save-model`` and exits 0, so
a requeue loop always ends. The final record's totals cover the whole run, every segment:
each checkpoint carries them (:func:`final_metrics` of the epochs so far).

The ``--log-json`` file has one writer: the lead rank (or the single process) holds
:class:`LogLock` from before its data is loaded until the run's outputs are written, and
:func:`check_log_free` refuses a busy log at startup, before any work (exit 2, the holder
named). The lock's folder lives only as long as the run: however the run ends, it is removed.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from gnnpar.datasets import InputError
from gnnpar.datasets.owned import FolderBusy, FolderLock

from gnnpar.launcher.bootstrap import detect_world
from gnnpar.training.checkpoint import agree_on_error
from gnnpar.cli.cli_common import JsonLog, epoch_records, progress
from gnnpar.training.memory import merge_rank_peaks
from gnnpar.infer.saved_model import model_payload, write_model_file

#: the last epoch's metrics a final record repeats: a node run's accuracies, a link run's
#: ranking metrics (:mod:`gnnpar.link.loop`); each only where the records have it
_LAST = ("loss", "train_acc", "val_acc", "test_acc", "val_auc", "test_auc", "val_mrr",
         "test_mrr", "test_hits@20", "test_hits@50", "test_hits@100")


#: per-epoch counters of a mini-batch run summed into its totals (only where records have
#: them): what its sampler drew and fetched, and the time it took (:mod:`gnnpar.sampling`)
SUMMED = ("sampled_edges", "input_nodes", "unique_input_nodes", "feat_bytes", "sampler_s",
          "stall_s")


def final_metrics(history: List[dict], before: Optional[dict] = None) -> dict:
    """The last epoch's metrics plus run totals (epochs, time, bytes, the :data:`SUMMED`
    counters, peak memory; with per-rank memory, each rank's largest peak, its data bytes
    and the ratios of those: :func:`gnnpar.training.memory.merge_rank_peaks`).

    ``before``: what this returned for the epochs before ``history`` (a resumed run's, from
    its checkpoint), so the totals cover the whole run and not only the last segment."""
    b = before or {}
    if not history:
        return dict(b) if b else {"epochs": 0}
    last = history[-1]
    peaks = [r["peak_mem_bytes"] for r in history] + (
        [b["peak_mem_bytes"]] if "peak_mem_bytes" in b else [])
    return {"epochs": int(b.get("epochs", 0)) + len(history),
            **{k: last[k] for k in _LAST if k in last},
            "total_s": b.get("total_s", 0.0) + sum(r["epoch_s"] for r in history),
            "comm_bytes": b.get("comm_bytes", 0) + sum(r["comm_bytes"] for r in history),
            **{k: b.get(k, 0) + sum(r[k] for r in history) for k in SUMMED if k in last},
            "peak_mem_bytes": max(peaks), **merge_rank_peaks([b, *history])}


def logged_totals(path: Optional[str], start: int) -> Optional[dict]:
    """:func:`final_metrics` of the epoch records before ``start`` in the log at ``path``, or
    None when there is no log: the totals of a run resumed from a checkpoint written before
    checkpoints carried them."""
    if not path or not os.path.isfile(path):
        return None
    records = {rec["epoch"]: {k: float("nan") if v is None else v for k, v in rec.items()}
               for _, rec in epoch_records(path, start)}
    try:
        return final_metrics([records[e] for e in sorted(records)]) if records else None
    except KeyError:  # a record without the totals' fields: not one of ours
        return None


class LogLock:
    """The ``--log-json`` file's writer lock: :class:`gnnpar.datasets.owned.FolderLock` (the
    lock every gnnpar folder uses: ``flock``, the holder's pid and host, dropped by the kernel
    however the holder ends) on a hidden folder beside the log, ``.NAME.gnnpar-lock/`` — one
    per log, so runs writing other logs in the same folder never wait on each other, and a
    lock that survives the log being cut and replaced on ``--resume``. A path that is no
    regular file (``/dev/stdout``) is not locked. Raises :class:`InputError` naming the
    holder when another live run has it.

    The folder is the run's own temporary: :meth:`release` removes it (lock file first, while
    still locked). A lock is held only on the file that is at the path: one taken on a file
    its holder has just removed is dropped and the new file taken (:func:`_take`). A run
    killed before it could remove the folder (SIGKILL) leaves it unlocked: the next run on
    the log takes it at once and removes it when it ends."""

    def __init__(self, path: Optional[str]):
        self.lock: Optional[FolderLock] = None
        if not path or (os.path.exists(path) and not os.path.isfile(path)):
            return
        folder = lock_folder(path)
        try:
            self.lock = _take(folder)
        except FolderBusy as e:
            raise InputError(f"--log-json {path} is being written by another run "
                             f"({e.holder}); wait for it to finish or give another path"
                             ) from None
        except OSError as e:
            raise InputError(f"--log-json {path}: cannot lock it ({e.strerror or e}: "
                             f"{e.filename or folder})") from None

    def release(self) -> None:
        """Remove the lock file and its folder, then let go (a second call does nothing)."""
        if self.lock is not None:
            lock, self.lock = self.lock, None
            try:
                _remove(lock)
            finally:
                lock.release()


#: how often :func:`_take` starts again after a holder removed the lock as it was taken
_TAKE_ATTEMPTS = 100


def _take(folder: str) -> FolderLock:
    """The lock in ``folder`` (made if missing), held on the file at its path; FolderBusy
    when a live run holds it. A holder that ends removes the file and the folder while a
    second run takes them: that run finds the folder gone, the file gone while it read the
    holder's pid, or its lock on a removed file, and starts again."""
    unknown = 0
    for _ in range(_TAKE_ATTEMPTS):
        os.makedirs(folder, exist_ok=True)
        try:
            lock = FolderLock(folder, "--log-json")
        except FileNotFoundError:  # the folder went with the holder that just ended
            continue
        except FolderBusy as e:
            if e.holder == "pid unknown" and unknown < 3:  # it ended while its pid was read
                unknown += 1
                continue
            raise
        if lock.current():
            return lock
        lock.release()  # a file its holder removed as it ended: not the lock any more
    raise OSError(errno.EAGAIN, "the lock kept being replaced while it was taken", folder)


def _remove(lock: FolderLock) -> None:
    """Remove the lock file of ``lock`` (held) and its folder, if the file is still the one
    at the path; a folder another run has already put its own lock file in stays (that run
    removes it)."""
    if not lock.current():
        return
    with contextlib.suppress(OSError):
        os.unlink(lock.path)
        os.rmdir(os.path.dirname(lock.path))


def lock_folder(path: str) -> str:
    """The hidden folder beside the log ``path`` that holds its :class:`LogLock`."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.gnnpar-lock")


@contextlib.contextmanager
def holding_log(path: Optional[str]):
    """Hold the log's :class:`LogLock` (``path`` None: nothing to hold) for the block, and
    make every rank of the process group raise the same InputError when the lead's log is
    busy (the other ranks pass ``None`` and learn it from the lead). However the block ends
    the lock folder is removed; on SIGTERM too (:func:`_removed_on_sigterm`)."""
    lock, refused = None, None
    try:
        lock = LogLock(path)
    except InputError as e:
        refused = str(e)
    refused = agree_on_error(refused)
    if refused is not None:
        if lock is not None:
            lock.release()
        raise InputError(refused)
    try:
        with _removed_on_sigterm(lock):
            yield
    finally:
        if lock is not None:
            lock.release()


@contextlib.contextmanager
def _removed_on_sigterm(lock: Optional[LogLock]):
    """While the block runs, a SIGTERM that would end this process at once (the default
    action) first removes the lock folder, then ends it as the default would (killed by
    SIGTERM). Only where this process can run a handler and nothing else handles SIGTERM: in
    the main thread of a process that is not a ``--nprocs`` rank (the spawning parent
    removes what such a rank leaves: :func:`check_log_free`). A handler installed meanwhile
    (a checkpointing run's) takes over and ends the run through ``finally``, which removes
    the folder."""
    if (lock is None or lock.lock is None or mp.parent_process() is not None
            or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def remove_then_die(signum, frame):
        if lock.lock is not None:
            with contextlib.suppress(OSError):
                _remove(lock.lock)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, remove_then_die)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def check_log_free(path: Optional[str]) -> None:
    """At startup, before any work: exit 2 (InputError naming the holder) when another live
    run writes the log ``path``. Only the process that will write it checks (a launched
    rank other than 0 would see its own lead's lock); the lead takes the lock for good in
    :func:`holding_log`.

    The checking process also removes, when it exits, a lock folder that no live run holds
    any more (:func:`_remove_free_lock_folders`): the one a ``--nprocs`` lead rank leaves
    when its parent kills it after another rank failed."""
    if not path:
        return
    try:
        lead = detect_world().rank == 0
    except InputError:  # a contradictory launch: launch() reports it
        return
    if lead:
        if os.path.isdir(os.path.dirname(os.path.abspath(path))):  # else no run writes it
            LogLock(path).release()
        if not _CHECKED:
            atexit.register(_remove_free_lock_folders)
        _CHECKED.add(os.path.abspath(path))


#: the logs :func:`check_log_free` checked in this process
_CHECKED: set = set()


def _remove_free_lock_folders() -> None:
    """At exit: remove the lock folder of every log this process checked that exists and no
    live run holds (one that is held stays: it is that run's)."""
    for path in sorted(_CHECKED):
        if not os.path.isdir(lock_folder(path)):
            continue
        with contextlib.suppress(Exception):  # at exit: never a traceback of our own
            LogLock(path).release()


def diverged_epoch(history: List[dict]) -> Optional[int]:
    """The epoch whose loss was NaN or infinite (training stops there), or None."""
    if history and not math.isfinite(history[-1]["loss"]):
        return int(history[-1]["epoch"])
    return None


def save_weights(path: str, model, spec, shapes: Dict[str, int]) -> None:
    """Weights plus what rebuilding the model needs, a GAT's heads and attention dropout
    resolved (:mod:`gnnpar.infer.saved_model`: ``torch.load(weights_only=True)`` safe, read back by
    :func:`gnnpar.load_model`). A file is replaced atomically (written beside it, then
    renamed), so a failed save leaves the previous one whole."""
    write_model_file(path, model_payload(model, spec, shapes))


class EpochProfiler:
    """``--profile E``: a torch profiler trace of epoch E, one Chrome-trace JSON per rank
    (``DIR/profile-epochE-rankR.json``; open in chrome://tracing or Perfetto). ``quiet``: the
    lines the profiler's C++ side prints on stderr when it starts and stops are silenced."""

    def __init__(self, epoch: Optional[int], out_dir: str, quiet: bool = False):
        self.epoch, self.out_dir, self.quiet, self.prof = epoch, out_dir, quiet, None

    def maybe_start(self, next_epoch: int) -> None:
        if self.epoch is None or next_epoch != self.epoch:
            return
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=acts, record_shapes=True)
        with muted_stderr(self.quiet):
            self.prof.__enter__()

    def maybe_stop(self, epoch: int) -> Optional[str]:
        if self.prof is None or epoch != self.epoch:
            return None
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, f"profile-epoch{epoch}-rank{rank}.json")
        with muted_stderr(self.quiet):
            self.prof.__exit__(None, None, None)
            self.prof.export_chrome_trace(path)
        self.prof = None
        return path


@contextlib.contextmanager
def muted_stderr(mute: bool):
    """With ``mute``, file descriptor 2 points at the null device for the block: the
    profiler's C++ logging writes there directly, past ``sys.stderr``."""
    if not mute:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def train_logged(fit_fn: Callable, model, spec, fields: dict, lead: bool, desc: str,
                 shapes: Dict[str, int], extra_final: Optional[Callable] = None,
                 ckpt=None) -> dict:
    """Run ``fit_fn(on_epoch, start_epoch)`` (returns the epoch records) with logging; returns
    the final record. ``fields`` (algo, world_size, grid, …) are added to every record;
    ``extra_final(history)`` adds fields to the final one. ``ckpt`` (a
    :class:`gnnpar.training.resume.Checkpointing`) restores before and checkpoints after each epoch
    (with the run totals so far); a resumed run cuts its JSON log back to the epochs before
    the one it resumes at, then appends — a run resumed at its last epoch appends only the
    final record, and saves the model.

    A NaN or infinite epoch loss (the same on every rank) ends the run: ``fit_fn`` stops after
    that epoch, whose record is logged but neither checkpointed nor saved (``--save-model``);
    the final record then has ``diverged_epoch`` (the CLI exits with ``EXIT_DIVERGED``)."""
    try:
        return _train(fit_fn, model, spec, fields, lead, desc, shapes, extra_final, ckpt)
    finally:
        if ckpt is not None:  # a SIGTERM handler and the folder lock end with the training
            ckpt.close()


def _train(fit_fn, model, spec, fields, lead, desc, shapes, extra_final, ckpt) -> dict:
    start = ckpt.restore() if ckpt is not None else 0
    if start > spec.train.epochs:
        raise InputError(f"--resume: the checkpoints in {spec.checkpoint.checkpoint_dir} reach "
                         f"epoch {start - 1}, past the last of --epochs {spec.train.epochs}: "
                         f"resume with --epochs {start} or more")
    before = ckpt.totals if ckpt is not None else None
    if before is None and start > 0 and lead:  # a checkpoint that carries no totals
        before = logged_totals(spec.output.log_json, start)
    if start == spec.train.epochs > 0 and lead and not spec.output.quiet:
        print(f"gnnpar-train: the checkpoint is the last epoch ({start - 1}) of --epochs "
              f"{spec.train.epochs}: finishing the run's outputs", file=sys.stderr)
    log = JsonLog(spec.output.log_json if lead else None, resume_epoch=start if start > 0 else None)
    bar = progress(spec.train.epochs - start, desc, lead and not spec.output.quiet)
    prof = EpochProfiler(spec.output.profile, spec.output.profile_dir, spec.output.quiet)
    prof.maybe_start(start)
    totals = before

    def on_epoch(rec):
        nonlocal totals
        totals = final_metrics([rec], totals)  # the whole run's, carried by each checkpoint
        trace = prof.maybe_stop(rec["epoch"])
        if trace and lead and not spec.output.quiet:
            print(f"profile of epoch {rec['epoch']} written to {trace}", file=sys.stderr)
        prof.maybe_start(rec["epoch"] + 1)
        log.write({**rec, **fields})
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.4f}",
                        val=f"{rec.get('val_acc', rec.get('val_auc', float('nan'))):.3f}")
        if ckpt is not None and math.isfinite(rec["loss"]):  # never a checkpoint of NaN weights
            ckpt.after_epoch(rec["epoch"], totals)

    try:
        history = fit_fn(on_epoch, start)
    finally:
        bar.close()
    final = {"final": True, **fields, **final_metrics([], totals),
             **(extra_final(history) if extra_final else {})}
    diverged = diverged_epoch(history)
    if diverged is not None:
        final["diverged_epoch"] = diverged
    log.write(final)
    log.close()
    if lead and spec.output.save_model and diverged is None:
        save_weights(spec.output.save_model, model, spec, shapes)
    return final
