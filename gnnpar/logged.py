"""One training run as the CLI shows it: a progress bar and a JSON line per epoch on the lead
rank, the final record, and the saved weights — the same for every mode and algorithm."""
from __future__ import annotations

import math
import os
import sys
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from gnnpar.datasets import InputError

from .cli_common import JsonLog, progress


def final_metrics(history: List[dict]) -> dict:
    """The last epoch's metrics plus run totals (time, bytes, peak memory)."""
    if not history:
        return {"epochs": 0}
    last = history[-1]
    keys = ("loss", "train_acc", "val_acc", "test_acc")
    return {"epochs": len(history), **{k: last[k] for k in keys},
            "total_s": sum(r["epoch_s"] for r in history),
            "comm_bytes": sum(r["comm_bytes"] for r in history),
            "peak_mem_bytes": max(r["peak_mem_bytes"] for r in history)}


def diverged_epoch(history: List[dict]) -> Optional[int]:
    """The epoch whose loss was NaN or infinite (training stops there), or None."""
    if history and not math.isfinite(history[-1]["loss"]):
        return int(history[-1]["epoch"])
    return None


def save_weights(path: str, model, spec, shapes: Dict[str, int]) -> None:
    """Weights plus what rebuilding the model needs (``torch.load(weights_only=True)`` safe).
    A file is replaced atomically (written beside it, then renamed), so a failed save leaves
    the previous one whole."""
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # loads anywhere
    payload = {"state_dict": weights, "model": spec.model, "layers": spec.layers,
               "hidden": spec.hidden, **shapes}
    if os.path.exists(path) and not os.path.isfile(path):  # a device such as /dev/null
        torch.save(payload, path)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class EpochProfiler:
    """``--profile E``: a torch profiler trace of epoch E, one Chrome-trace JSON per rank
    (``DIR/profile-epochE-rankR.json``; open in chrome://tracing or Perfetto)."""

    def __init__(self, epoch: Optional[int], out_dir: str):
        self.epoch, self.out_dir, self.prof = epoch, out_dir, None

    def maybe_start(self, next_epoch: int) -> None:
        if self.epoch is None or next_epoch != self.epoch:
            return
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=acts, record_shapes=True)
        self.prof.__enter__()

    def maybe_stop(self, epoch: int) -> Optional[str]:
        if self.prof is None or epoch != self.epoch:
            return None
        self.prof.__exit__(None, None, None)
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, f"profile-epoch{epoch}-rank{rank}.json")
        self.prof.export_chrome_trace(path)
        self.prof = None
        return path


def train_logged(fit_fn: Callable, model, spec, fields: dict, lead: bool, desc: str,
                 shapes: Dict[str, int], extra_final: Optional[Callable] = None,
                 ckpt=None) -> dict:
    """Run ``fit_fn(on_epoch, start_epoch)`` (returns the epoch records) with logging; returns
    the final record. ``fields`` (algo, world_size, grid, …) are added to every record;
    ``extra_final(history)`` adds fields to the final one. ``ckpt`` (a
    :class:`gnnpar.resume.Checkpointing`) restores before and checkpoints after each epoch;
    a resumed run cuts its JSON log back to the epochs before the one it resumes at, then
    appends.

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
    if start >= spec.epochs > 0:  # the log already holds this run's end: leave it as it is
        raise InputError(f"--resume: the checkpoints in {spec.checkpoint_dir} reach epoch "
                         f"{start - 1}, the last of --epochs {spec.epochs}: nothing to train "
                         "(raise --epochs to continue)")
    log = JsonLog(spec.log_json if lead else None, resume_epoch=start if start > 0 else None)
    bar = progress(spec.epochs - start, desc, lead and not spec.quiet)
    prof = EpochProfiler(getattr(spec, "profile", None), getattr(spec, "profile_dir", "."))
    prof.maybe_start(start)

    def on_epoch(rec):
        trace = prof.maybe_stop(rec["epoch"])
        if trace and lead and not spec.quiet:
            print(f"profile of epoch {rec['epoch']} written to {trace}", file=sys.stderr)
        prof.maybe_start(rec["epoch"] + 1)
        log.write({**rec, **fields})
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.4f}", val=f"{rec['val_acc']:.3f}")
        if ckpt is not None and math.isfinite(rec["loss"]):  # never a checkpoint of NaN weights
            ckpt.after_epoch(rec["epoch"])

    try:
        history = fit_fn(on_epoch, start)
    finally:
        bar.close()
    final = {"final": True, **fields, **final_metrics(history),
             **(extra_final(history) if extra_final else {})}
    diverged = diverged_epoch(history)
    if diverged is not None:
        final["diverged_epoch"] = diverged
    log.write(final)
    log.close()
    if lead and spec.save_model and diverged is None:
        save_weights(spec.save_model, model, spec, shapes)
    return final
