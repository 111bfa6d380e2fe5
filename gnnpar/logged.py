"""One training run as the CLI shows it: a progress bar and a JSON line per epoch on the lead
rank, the final record, and the saved weights — the same for every mode and algorithm."""
from __future__ import annotations

import sys
from typing import Callable, Dict, List, Optional

import torch

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


def save_weights(path: str, model, args, shapes: Dict[str, int]) -> None:
    """Weights plus what rebuilding the model needs (``torch.load(weights_only=True)`` safe)."""
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # loads anywhere
    torch.save({"state_dict": weights, "model": args.model, "layers": args.layers,
                "hidden": args.hidden, **shapes}, path)


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
        import os
        import torch.distributed as dist
        self.prof.__exit__(None, None, None)
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, f"profile-epoch{epoch}-rank{rank}.json")
        self.prof.export_chrome_trace(path)
        self.prof = None
        return path


def train_logged(fit_fn: Callable, model, args, fields: dict, lead: bool, desc: str,
                 shapes: Dict[str, int], extra_final: Optional[Callable] = None,
                 ckpt=None) -> dict:
    """Run ``fit_fn(on_epoch, start_epoch)`` (returns the epoch records) with logging; returns
    the final record. ``fields`` (algo, world_size, grid, …) are added to every record;
    ``extra_final(history)`` adds fields to the final one. ``ckpt`` (a
    :class:`gnnpar.resume.Checkpointing`) restores before and checkpoints after each epoch;
    a resumed run appends to its JSON log."""
    start = ckpt.restore() if ckpt is not None else 0
    log = JsonLog(args.log_json if lead else None, append=start > 0)
    bar = progress(args.epochs - start, desc, lead and not args.quiet)
    prof = EpochProfiler(getattr(args, "profile", None), getattr(args, "profile_dir", "."))
    prof.maybe_start(start)

    def on_epoch(rec):
        trace = prof.maybe_stop(rec["epoch"])
        if trace and lead and not args.quiet:
            print(f"profile of epoch {rec['epoch']} written to {trace}", file=sys.stderr)
        prof.maybe_start(rec["epoch"] + 1)
        log.write({**rec, **fields})
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.4f}", val=f"{rec['val_acc']:.3f}")
        if ckpt is not None:
            ckpt.after_epoch(rec["epoch"])

    try:
        history = fit_fn(on_epoch, start)
    finally:
        bar.close()
    final = {"final": True, **fields, **final_metrics(history),
             **(extra_final(history) if extra_final else {})}
    log.write(final)
    log.close()
    if lead and args.save_model:
        save_weights(args.save_model, model, args, shapes)
    return final
