#!/usr/bin/env python
"""Where a rank's inference peak comes from: ``gnnpar-predict`` run as usual, each rank
printing its resident set (now and high-water mark) before and after each stage — model
file read, shard loaded, runtime built, forward pass, files written.

Run it under ``torchrun`` with ``gnnpar-predict``'s own arguments (a per-rank view needs one
process per rank; ``--nprocs`` would start ranks this script cannot watch):

    torchrun --nproc_per_node 4 scripts/predict_memory_stages.py --model-file m21.pt \\
        --partition-dir shards --algo 1d-halo --embeddings --out p21stages

Lines go to stderr as ``[rank R] stage  rss X GiB  hwm Y GiB``; the load average is printed
once by rank 0. The stages are :mod:`gnnpar.infer.prediction`'s own calls, wrapped in place (the
run's outputs are the same files ``gnnpar-predict`` writes).
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from gnnpar.infer import prediction  # noqa: E402
from gnnpar.training.memory import _status_bytes  # noqa: E402
from gnnpar.predict import main  # noqa: E402

STAGES = ("read_model_file", "load_rank_shard", "fullbatch_runtime", "forward_rows",
          "write_outputs")


def mark(what: str) -> None:
    rank = os.environ.get("RANK", "0")
    now, hwm = (_status_bytes(k) / 2 ** 30 for k in ("VmRSS", "VmHWM"))
    print(f"[rank {rank}] {what:26s} rss {now:5.2f} GiB  hwm {hwm:5.2f} GiB", file=sys.stderr,
          flush=True)


def watched(name: str):
    inner = getattr(prediction, name)

    def call(*args, **kwargs):
        mark(f"before {name}")
        out = inner(*args, **kwargs)
        mark(f"after {name}")
        return out
    return call


if __name__ == "__main__":
    if os.environ.get("RANK", "0") == "0":
        print(f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    for stage in STAGES:
        setattr(prediction, stage, watched(stage))
    sys.exit(main(sys.argv[1:]))
