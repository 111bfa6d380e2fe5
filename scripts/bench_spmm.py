#!/usr/bin/env python
"""Local SpMM: gnnpar's kernels against torch.sparse.mm.

    python scripts/bench_spmm.py                                   # CPU: rmat:scale=16,ef=16, 2 threads
    python scripts/bench_spmm.py --dataset rmat:scale=17,ef=16 --widths 64,256 --threads 1,2
    python scripts/bench_spmm.py --device cuda --dataset rmat:scale=20,ef=16   # Triton vs cuSPARSE

Â·H with the GCN-normalised Â of the dataset, H (n, f), for each width f: on the CPU the
compiled kernel (kernels/cpu_spmm.py) for each thread count, fp32; on CUDA the Triton kernel
(kernels/triton_spmm.py) against cuSPARSE, with H in fp32 and in bf16 (Triton: bf16 gathers,
fp32 sums). The two run alternately, ``--repeats`` times each after a warm-up, and the medians
are reported with their ratio (ours / torch: below 1 is faster). ``GNNPAR_SPMM=torch``
switches gnnpar's CPU products to torch's kernel; ``GNNPAR_SPMM_GPU=triton`` its CUDA ones to
Triton.
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
from gnnpar.kernels import triton_spmm  # noqa: E402
from gnnpar.kernels.cpu_spmm import available, csr_mm  # noqa: E402
from gnnpar.kernels.local import csr_tensor  # noqa: E402


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="rmat:scale=16,ef=16")
    p.add_argument("--widths", default="16,64,256,512")
    p.add_argument("--threads", default="2")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu", help="cpu (numba kernel) or cuda (Triton)")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if not (triton_spmm.available() if cuda else available()):
        print("bench_spmm: the kernel is not available here (CPU: numba missing or "
              "GNNPAR_SPMM=torch; CUDA: Triton missing)", file=sys.stderr)
        return 2
    ours_mm = triton_spmm.csr_mm if cuda else csr_mm
    g = load_dataset(a.dataset)
    A = csr_tensor(*propagation_matrix(g, "gcn"), (g.num_nodes, g.num_nodes), device)
    print(f"# {a.dataset} on {device}: n={g.num_nodes:,} nnz={A.values().shape[0]:,}",
          file=sys.stderr)
    rows = []
    dtypes = (torch.float32, torch.bfloat16) if cuda else (torch.float32,)
    for threads in ([1] if cuda else [int(t) for t in a.threads.split(",")]):
        torch.set_num_threads(threads)
        for f in (int(w) for w in a.widths.split(",")):
            for dtype in dtypes:
                h = torch.randn(g.num_nodes, f, device=device).to(dtype)
                out = torch.empty(g.num_nodes, f, device=device, dtype=dtype)
                A_t = A if dtype == torch.float32 else A.to(dtype)
                ours, theirs = [], []
                ours_mm(A, h, out)  # warm-up (compiles on first use)
                torch.sparse.mm(A_t, h)
                for _ in range(a.repeats):
                    ours.append(timed(lambda: ours_mm(A, h, out), device))
                    theirs.append(timed(lambda: torch.sparse.mm(A_t, h), device))
                row = {"device": str(device), "threads": threads, "width": f,
                       "dtype": str(dtype).replace("torch.", ""),
                       "gnnpar_s": statistics.median(ours),
                       "torch_s": statistics.median(theirs)}
                row["ratio"] = row["gnnpar_s"] / row["torch_s"]
                rows.append(row)
                print(json.dumps(row))
    print("\n| threads | width | dtype | gnnpar | torch.sparse.mm | ratio |\n"
          "|---|---|---|---|---|---|", file=sys.stderr)
    for r in rows:
        print(f"| {r['threads']} | {r['width']} | {r['dtype']} | {r['gnnpar_s'] * 1e3:.2f} ms | "
              f"{r['torch_s'] * 1e3:.2f} ms | {r['ratio']:.2f} |", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
