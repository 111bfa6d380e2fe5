"""What a spawned rank's start costs with and without numba, and numba's compiler set up, among
the fork server's imports (``gnnpar/launcher/rank_start.py``: ``PRELOAD``).

Each round runs, for each variant in turn (interleaved), a fresh launcher process that
spawns ``--ranks`` ranks the way ``--nprocs`` does; each rank does what a training rank does
before its first step with numba (imports it and loads the samplers' and the SpMM's compiled
kernels from numba's disk cache) and reports its own CPU seconds since it was forked. The
variant ``unwarmed`` takes :mod:`gnnpar.kernels.numba_warm` (the compiler's contexts) out of
``PRELOAD`` before the server starts, ``without`` takes numba out too. Prints each round's
per-rank CPU, the medians and the load average.

    python scripts/bench_rank_start.py --rounds 7
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import commit, load  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAUNCHER = """
import json, sys
from gnnpar.launcher import rank_start
drop = {"with": (), "unwarmed": ("gnnpar.kernels.numba_warm",),
        "without": ("gnnpar.kernels.numba_warm", "numba")}[sys.argv[1]]
rank_start.PRELOAD = tuple(m for m in rank_start.PRELOAD if m not in drop)
from gnnpar.launcher.spawn import spawn
sys.path.insert(0, sys.argv[3])
from bench_rank_start import rank_body
print(json.dumps(spawn(rank_body, int(sys.argv[2]), timeout_s=120)))
"""


def rank_body(rank, world):
    """A rank's first use of numba: the import and two kernel modules loaded from cache."""
    import time

    import torch

    from gnnpar.kernels import cpu_spmm
    from gnnpar.sampling import fast
    os.environ[cpu_spmm.ENV] = "numba"  # the small product on the compiled kernel
    n = 64
    indptr = torch.arange(0, 4 * n + 1, 4)
    indices = torch.randint(0, n, (4 * n,))
    A = torch.sparse_csr_tensor(indptr, indices, torch.ones(4 * n), (n, n))
    cpu_spmm.csr_mm(A, torch.randn(n, 8))
    fast._compiled()  # the samplers' kernels, loaded as a first sampled batch loads them
    return time.process_time()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    print(f"commit {commit()}  ranks {args.ranks}  load {load():.2f}")
    got = {"with": [], "unwarmed": [], "without": []}
    for r in range(args.rounds):
        for variant in got:
            res = subprocess.run([sys.executable, "-c", LAUNCHER, variant, str(args.ranks),
                                  os.path.dirname(os.path.abspath(__file__))], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
            if res.returncode != 0:
                raise SystemExit(res.stderr[-2000:])
            cpu = json.loads(res.stdout.strip().splitlines()[-1])
            got[variant].extend(cpu)
            print(f"round {r} {variant:8s} rank CPU s {[round(c, 3) for c in cpu]}  "
                  f"load {load():.2f}")
    for variant, cpu in got.items():
        print(f"{variant:8s} median rank CPU {statistics.median(cpu):.3f} s over {len(cpu)}")


if __name__ == "__main__":
    main()
