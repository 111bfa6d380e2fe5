"""``gnnpar-report``: one picture of a training run from its ``--log-json`` file.

    gnnpar-report run.jsonl -o report.png

Four panels: loss and accuracies (a link run's AUC, MRR and Hits@50) per epoch; each
epoch's time split into compute, communication and — for mini-batch runs — sampling
(``sampler_s``) and input stalls (``stall_s``), as stacked bars; bytes sent per rank per
epoch (mean over ranks and the busiest rank, or every rank when the log has
``comm_bytes_per_rank``); a summary of the run.
Exit codes: 0 written, 2 unreadable or empty log, or an output path it may not write (a
folder, the log itself, a path inside a gnnpar folder), checked before the log is read.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import List, Tuple

from gnnpar.datasets import InputError
from gnnpar.datasets.owned import check_writable_folder, refuse_claimed

from gnnpar.cli.cli_common import DefaultsHelpFormatter, run_cli

TIME_PARTS = (("compute_s", "compute", "#4C72B0"), ("comm_s", "communication", "#DD8452"),
              ("sampler_s", "sampling", "#55A868"), ("stall_s", "input stall", "#C44E52"))
#: the per-epoch metrics drawn beside the loss, where the log has them: a node run's
#: accuracies, a link run's (``--task link``) AUC, MRR and Hits@50
ACCURACIES = (("train_acc", "train acc", "-"), ("val_acc", "val acc", "--"),
              ("test_acc", "test acc", ":"), ("val_auc", "val AUC", "--"),
              ("test_auc", "test AUC", ":"), ("val_mrr", "val MRR", "-."),
              ("test_mrr", "test MRR", "-."), ("test_hits@50", "test Hits@50", "-"))


def read_log(path: str) -> Tuple[List[dict], dict]:
    """(epoch records in epoch order, the final record or {}) of a JSON-lines log."""
    if not os.path.isfile(path):
        raise InputError(f"no such file: {path}")
    epochs, final = [], {}
    with open(path, encoding="utf-8") as fh:
        for no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{no}: not a JSON object ({e.msg})")
            if not isinstance(rec, dict):
                raise InputError(f"{path}:{no}: not a JSON object")
            if rec.get("final"):
                final = rec
            elif "epoch" in rec:
                if "loss" not in rec:
                    raise InputError(f"{path}:{no}: epoch record without 'loss'")
                epochs.append(rec)
    if not epochs:
        raise InputError(f"{path} has no epoch records (was it written by --log-json?)")
    epochs.sort(key=lambda r: r["epoch"])
    return epochs, final


def _num(rec: dict, key: str) -> float:
    v = rec.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def build_figure(epochs: List[dict], final: dict, title: str = ""):
    """The report as a matplotlib Figure (Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 7.5), dpi=90, layout="constrained")
    ax_loss, ax_time, ax_bytes, ax_text = fig.subplots(2, 2).flatten()
    x = [int(r["epoch"]) for r in epochs]
    head = epochs[-1]
    world = int(final.get("world_size") or head.get("world_size") or 1)
    algo = final.get("algo") or head.get("algo") or "?"
    grid = final.get("grid") or head.get("grid")
    fig.suptitle(title or f"gnnpar: {algo} on {world} rank{'s' if world > 1 else ''}"
                 + (f", grid {'x'.join(map(str, grid))}" if grid else ""), fontsize=13)

    ax_loss.plot(x, [_num(r, "loss") for r in epochs], color="black", label="loss")
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="Loss and accuracy")
    ax_acc = ax_loss.twinx()
    for key, label, style in ACCURACIES:
        ys = [_num(r, key) for r in epochs]
        if any(not math.isnan(v) for v in ys):
            ax_acc.plot(x, ys, style, label=label)
    ax_acc.set(ylabel="accuracy" if "val_acc" in head else "metric", ylim=(0, 1.02))
    lines = ax_loss.get_legend_handles_labels()
    more = ax_acc.get_legend_handles_labels()
    ax_loss.legend(lines[0] + more[0], lines[1] + more[1], loc="center right", fontsize=8)

    bottom = [0.0] * len(x)
    for key, label, color in TIME_PARTS:
        if not any(key in r for r in epochs):
            continue
        vals = [1e3 * (0.0 if math.isnan(_num(r, key)) else _num(r, key)) for r in epochs]
        ax_time.bar(x, vals, bottom=bottom, color=color, label=label, width=0.85)
        bottom = [b + v for b, v in zip(bottom, vals)]
    if any("epoch_s" in r for r in epochs):
        ax_time.plot(x, [1e3 * _num(r, "epoch_s") for r in epochs], "k.", ms=3,
                     label="epoch (wall)")
    ax_time.set(xlabel="epoch", ylabel="ms", title="Time per epoch")
    ax_time.legend(fontsize=8)

    per_rank = [r.get("comm_bytes_per_rank") for r in epochs]
    if all(isinstance(p, list) and p for p in per_rank):
        ranks = range(len(per_rank[0]))
        totals = [sum(p[k] for p in per_rank) / len(per_rank) for k in ranks]
        ax_bytes.bar(list(ranks), [t / 1e6 for t in totals], color="#8172B3")
        ax_bytes.set(xlabel="rank", ylabel="MB sent per epoch (mean over epochs)",
                     title="Bytes sent per rank")
    else:
        mean = [_num(r, "comm_bytes") / world / 1e6 for r in epochs]
        top = [_num(r, "comm_bytes_max_rank") / 1e6 for r in epochs]
        ax_bytes.bar(x, top, color="#CCB974", width=0.85, label="busiest rank")
        ax_bytes.bar(x, mean, color="#8172B3", width=0.5, label="mean over ranks")
        ax_bytes.set(xlabel="epoch", ylabel="MB sent", title="Bytes sent per rank per epoch")
        finite = [v for v in top + mean if not math.isnan(v)]
        ax_bytes.set_ylim(0, 1.3 * max(finite) if finite and max(finite) > 0 else 1.0)
        ax_bytes.legend(fontsize=8, loc="upper right", ncols=2)

    from matplotlib.ticker import MaxNLocator
    for ax in (ax_loss, ax_time, ax_bytes):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_text.axis("off")
    ax_text.set_title("Run")
    ax_text.text(0.02, 0.98, summary_text(epochs, final, world, algo, grid), va="top",
                 family="monospace", fontsize=9, transform=ax_text.transAxes)
    return fig


def summary_text(epochs, final, world, algo, grid) -> str:
    last = epochs[-1]
    total_s = sum(_num(r, "epoch_s") for r in epochs if "epoch_s" in r)
    comm_s = sum(_num(r, "comm_s") for r in epochs if "comm_s" in r)
    total_b = sum(_num(r, "comm_bytes") for r in epochs if "comm_bytes" in r)
    peak = max((_num(r, "peak_mem_bytes") for r in epochs if "peak_mem_bytes" in r),
               default=math.nan)
    rows = [("algorithm", algo), ("ranks", world),
            ("grid", "x".join(map(str, grid)) if grid else "-"),
            ("epochs", len(epochs)),
            ("final loss", f"{_num(final or last, 'loss'):.4f}")]
    for key, label, _ in ACCURACIES:  # a link run's metrics only where it has them
        if key.endswith("_acc") and "val_auc" not in (final or last) or key in (final or last):
            rows.append((label, f"{_num(final or last, key):.4f}"))
    rows += [("time (sum of epochs)", f"{total_s:.3f} s"),
             ("communication share", f"{100 * comm_s / total_s:.1f} %" if total_s else "-"),
             ("bytes, all ranks", f"{total_b / 1e6:.2f} MB"),
             ("peak memory (largest rank)", f"{peak / 2**20:.0f} MiB" if peak == peak else "-")]
    ratios = final if "peak_over_data_max" in final else last
    if "peak_over_data_max" in ratios:  # distributed full batch: peak / (shard + halo rows)
        rows.append(("peak / data (max rank)",
                     f"{_num(ratios, 'peak_over_data_max'):.2f}, less baseline "
                     f"{_num(ratios, 'peak_net_over_data_max'):.2f}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def write_report(log_path: str, out_path: str, title: str = "", dpi: int = 90) -> str:
    epochs, final = read_log(log_path)
    fig = build_figure(epochs, final, title)
    fig.savefig(out_path, dpi=dpi)
    return out_path


def check_output(log_path: str, out_path: str) -> None:
    """Refuse ``-o`` where the picture must not go: a folder, the log it is drawn from, a
    path inside a gnnpar folder (shards, checkpoints, a dataset cache), or a folder that
    cannot be written."""
    if os.path.isdir(out_path):
        raise InputError(f"-o {out_path} is a folder; give a file path")
    if os.path.realpath(out_path) == os.path.realpath(log_path):
        raise InputError(f"-o {out_path} would overwrite the log it is drawn from; give "
                         "another path")
    refuse_claimed("-o", out_path)
    check_writable_folder(os.path.dirname(os.path.abspath(out_path)), "-o", f"-o {out_path}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gnnpar-report",
                                description="Draw a PNG report from a gnnpar --log-json file.",
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("log", help="JSON-lines log written by gnnpar-train --log-json")
    p.add_argument("-o", "--output", default="report.png", help="PNG file to write")
    p.add_argument("--title", default="", help="figure title (default: algorithm and grid)")
    p.add_argument("--dpi", type=int, default=90, help="resolution, dots per inch")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    def body():
        if args.dpi < 10:
            raise InputError(f"--dpi must be >= 10, got {args.dpi}")
        check_output(args.log, args.output)
        path = write_report(args.log, args.output, args.title, args.dpi)
        print(f"gnnpar-report: wrote {path}", file=sys.stderr)
        return 0

    return run_cli(body, args.debug, "gnnpar-report")


if __name__ == "__main__":
    sys.exit(main())
