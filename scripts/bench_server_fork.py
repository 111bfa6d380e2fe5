"""What a ``gnnpar-train --nprocs`` run costs to start with its ranks' fork server forked from
the launcher (``gnnpar/launcher/server_fork.py``) and started as a new interpreter
(``GNNPAR_SERVER_FORK=0``).

Each round runs the same small run (``--ranks`` ranks, one epoch of GCN on R-MAT scale 8)
once per variant, interleaved, through the installed ``gnnpar-train``, and reports the CPU
seconds of its whole process tree (the launcher, the fork server, the ranks: this process is
their subreaper, so the server, which outlives its launcher by a moment, is counted too) and
the wall seconds. Prints each round, the medians and the load average.

    python scripts/bench_server_fork.py --rounds 5
"""
from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import commit, load  # noqa: E402

VARIANTS = {"forked": {}, "interpreter": {"GNNPAR_SERVER_FORK": "0"}}
PR_SET_CHILD_SUBREAPER = 36


def tree_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_run(tool: str, ranks: int, env: dict, folder: str):
    """(CPU, wall) seconds of one run's process tree, every process of it reaped."""
    before, start = tree_cpu(), time.monotonic()
    res = subprocess.run([tool, "--dataset", "rmat:scale=8,ef=4", "--algo", "1d", "--nprocs",
                          str(ranks), "--epochs", "1", "--quiet"], cwd=folder,
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(res.stderr[-2000:])
    while True:  # the orphans this process adopted (the server, after its launcher)
        try:
            os.wait()
        except ChildProcessError:
            break
    return tree_cpu() - before, time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    tool = os.path.join(os.path.dirname(sys.executable), "gnnpar-train")
    print(f"commit {commit()}  ranks {args.ranks}  load {load():.2f}")
    got = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for variant, env in VARIANTS.items():
                cpu, wall = one_run(tool, args.ranks, env, folder)
                got[variant].append((cpu, wall))
                print(f"round {r} {variant:11s} CPU {cpu:.2f} s  wall {wall:.2f} s  "
                      f"load {load():.2f}")
    for variant, runs in got.items():
        print(f"{variant:11s} median CPU {statistics.median(c for c, _ in runs):.2f} s, "
              f"wall {statistics.median(w for _, w in runs):.2f} s over {len(runs)} runs")


if __name__ == "__main__":
    main()
