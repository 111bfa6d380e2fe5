#!/usr/bin/env python
"""Local SpMM on CPU: gnnpar's compiled kernel (kernels/cpu_spmm.py) against torch.sparse.mm.

    python scripts/bench_spmm.py                                   # rmat:scale=16,ef=16, 2 threads
    python scripts/bench_spmm.py --dataset rmat:scale=17,ef=16 --widths 64,256 --threads 1,2

Â·H with the GCN-normalised Â of the dataset, H (n, f) float32, for each width f and thread
count; the two run alternately, ``--repeats`` times each after a warm-up, and the medians are
reported with their ratio (ours / torch: below 1 is faster). Both give the same numbers (the
tests check it bit for bit); ``GNNPAR_SPMM=torch`` switches gnnpar itself to torch's kernel.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # run from a checkout without installing

from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.datasets.normalize import propagation_matrix  # noqa: E402
from gnnpar.kernels.cpu_spmm import available, csr_mm  # noqa: E402
from gnnpar.kernels.local import csr_tensor  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="rmat:scale=16,ef=16")
    p.add_argument("--widths", default="16,64,256,512")
    p.add_argument("--threads", default="2")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    if not available():
        print("bench_spmm: the compiled kernel is not available (numba missing or "
              "GNNPAR_SPMM=torch)", file=sys.stderr)
        return 2
    g = load_dataset(a.dataset)
    A = csr_tensor(*propagation_matrix(g, "gcn"), (g.num_nodes, g.num_nodes))
    print(f"# {a.dataset}: n={g.num_nodes:,} nnz={A.values().shape[0]:,}", file=sys.stderr)
    rows = []
    for threads in (int(t) for t in a.threads.split(",")):
        torch.set_num_threads(threads)
        for f in (int(w) for w in a.widths.split(",")):
            h = torch.randn(g.num_nodes, f)
            out = torch.empty(g.num_nodes, f)
            ours, theirs = [], []
            csr_mm(A, h, out)  # warm-up (compiles on first use)
            torch.sparse.mm(A, h)
            for _ in range(a.repeats):
                t = time.perf_counter()
                csr_mm(A, h, out)
                ours.append(time.perf_counter() - t)
                t = time.perf_counter()
                torch.sparse.mm(A, h)
                theirs.append(time.perf_counter() - t)
            row = {"threads": threads, "width": f, "gnnpar_s": statistics.median(ours),
                   "torch_s": statistics.median(theirs)}
            row["ratio"] = row["gnnpar_s"] / row["torch_s"]
            rows.append(row)
            print(json.dumps(row))
    print("\n| threads | width | gnnpar | torch.sparse.mm | ratio |\n|---|---|---|---|---|",
          file=sys.stderr)
    for r in rows:
        print(f"| {r['threads']} | {r['width']} | {r['gnnpar_s'] * 1e3:.1f} ms | "
              f"{r['torch_s'] * 1e3:.1f} ms | {r['ratio']:.2f} |", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
