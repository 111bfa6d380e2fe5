#!/usr/bin/env python
"""Local SpMM: gnnpar's kernels against torch.sparse.mm.

    python scripts/bench_spmm.py                                   # CPU: rmat:scale=16,ef=16, 2 threads
    python scripts/bench_spmm.py --dataset rmat:scale=17,ef=16 --widths 64,256 --threads 1,2
    python scripts/bench_spmm.py --device cuda --dataset rmat:scale=20,ef=16   # Triton vs cuSPARSE
    python scripts/bench_spmm.py --device cuda --sweep    # + every Triton tile, and rows unsorted

Â·H with the GCN-normalised Â of the dataset, H (n, f), for each width f: on the CPU the
compiled kernel (kernels/cpu_spmm.py) for each thread count, fp32; on CUDA the Triton kernel
(kernels/triton_spmm.py) against cuSPARSE, with H in fp32 and in bf16 (Triton: bf16 gathers,
fp32 sums). The two run alternately, ``--repeats`` times each after a warm-up, and the medians
are reported with their ratio (ours / torch: below 1 is faster). ``GNNPAR_SPMM=torch``
switches gnnpar's CPU products to torch's kernel; ``GNNPAR_SPMM_GPU=triton`` its CUDA ones to
Triton.

``--sweep`` (CUDA) also times every tile of ``triton_spmm.CANDIDATES`` and the default tile
with the rows in their stored order instead of longest first, one JSON line each
(``"variant"``), and prints the fastest tile per width and dtype: the figures behind
``triton_spmm.config_for``. It also times two ways of calling cuSPARSE that gnnpar does not
use yet (fp32 only): int32 indices (``cusparse-i32``) and ``torch.addmm`` with ``beta=0`` into
a reused output (``cusparse-addmm``), each as a ratio to the ``torch.sparse.mm`` row.
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
    p.add_argument("--sweep", action="store_true",
                   help="CUDA: also time every Triton tile and the unsorted row order")
    a = p.parse_args(argv)
    if a.sweep and a.device != "cuda":
        p.error("--sweep times Triton tiles: it needs --device cuda")
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
    rows, sweep = [], []
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
                if a.sweep:
                    sweep.extend(sweep_tiles(A, h, out, row, a.repeats, device))
                    if dtype == torch.float32:
                        sweep.extend(sweep_cusparse(A, h, out, row, a.repeats, device))
    print("\n| threads | width | dtype | gnnpar | torch.sparse.mm | ratio |\n"
          "|---|---|---|---|---|---|", file=sys.stderr)
    for r in rows:
        print(f"| {r['threads']} | {r['width']} | {r['dtype']} | {r['gnnpar_s'] * 1e3:.2f} ms | "
              f"{r['torch_s'] * 1e3:.2f} ms | {r['ratio']:.2f} |", file=sys.stderr)
    if sweep:
        print("\n| width | dtype | default tile | fastest tile | its time | unsorted rows | "
              "vs cuSPARSE |\n|---|---|---|---|---|---|---|", file=sys.stderr)
        for r in rows:
            mine = [s for s in sweep if (s["width"], s["dtype"]) == (r["width"], r["dtype"])]
            tiles = [s for s in mine if s["variant"] == "tile" and "gnnpar_s" in s]
            best = min(tiles, key=lambda s: s["gnnpar_s"]) if tiles else None
            unsorted = [s["gnnpar_s"] for s in mine if s["variant"] == "unsorted"]
            print(f"| {r['width']} | {r['dtype']} | {r['gnnpar_s'] * 1e3:.2f} ms | "
                  f"{best['config'] if best else '-'} | "
                  f"{best['gnnpar_s'] * 1e3 if best else float('nan'):.2f} ms | "
                  f"{unsorted[0] * 1e3 if unsorted else float('nan'):.2f} ms | "
                  f"{best['gnnpar_s'] / r['torch_s'] if best else float('nan'):.2f} |",
                  file=sys.stderr)
        calls = [s for s in sweep if s["variant"].startswith("cusparse")]
        if calls:
            print("\n| width | cuSPARSE call | time | vs torch.sparse.mm |\n|---|---|---|---|",
                  file=sys.stderr)
        for s in calls:
            print(f"| {s['width']} | {s['variant']} | "
                  + (f"{s['variant_s'] * 1e3:.2f} ms | {s['ratio']:.2f} |" if "ratio" in s
                     else f"{s['error']} | - |"), file=sys.stderr)
    return 0


def sweep_tiles(A, h, out, base, repeats, device):
    """Every candidate tile (capped at the width) and the default tile with unsorted rows,
    each timed ``repeats`` times after a warm-up: JSON lines like ``base`` plus
    ``variant``/``config`` (a tile that fails to compile or launch is reported, not fatal)."""
    f = h.shape[1]
    tiles = dict.fromkeys(triton_spmm.capped(c, f) for c in triton_spmm.CANDIDATES)
    ident = torch.arange(A.shape[0], dtype=torch.int32, device=device)
    runs = [("tile", c, None) for c in tiles]
    runs.append(("unsorted", triton_spmm.config_for(f, h.dtype), ident))
    got = []
    for variant, c, order in runs:
        rec = {k: base[k] for k in ("device", "width", "dtype", "torch_s")}
        rec.update(variant=variant, config=",".join(map(str, c)))
        try:
            def run():
                triton_spmm.csr_mm(A, h, out, config=c, order=order)
            run()
            rec["gnnpar_s"] = statistics.median(timed(run, device) for _ in range(repeats))
            rec["ratio"] = rec["gnnpar_s"] / rec["torch_s"]
        except Exception as e:  # noqa: BLE001 - one tile's failure is a row of the sweep
            rec["error"] = f"{type(e).__name__}: {e}"[:200]
        print(json.dumps(rec))
        got.append(rec)
    return got


def sweep_cusparse(A, h, out, base, repeats, device):
    """cuSPARSE called with int32 indices and through ``addmm(beta=0)`` into ``out``: JSON
    lines like ``base`` plus ``variant`` and ``torch_s`` of this variant's own run, interleaved
    with ``torch.sparse.mm`` as usual (``ratio`` below 1: the variant is faster)."""
    A32 = torch.sparse_csr_tensor(A.crow_indices().int(), A.col_indices().int(), A.values(),
                                  size=A.shape, check_invariants=False)
    calls = {"cusparse-i32": lambda: torch.sparse.mm(A32, h),
             "cusparse-addmm": lambda: torch.addmm(out, A, h, beta=0, out=out)}
    got = []
    for variant, call in calls.items():
        rec = {k: base[k] for k in ("device", "width", "dtype")}
        rec["variant"] = variant
        try:
            call()
            mine, theirs = [], []
            for _ in range(repeats):
                mine.append(timed(call, device))
                theirs.append(timed(lambda: torch.sparse.mm(A, h), device))
            rec.update(variant_s=statistics.median(mine), torch_s=statistics.median(theirs))
            rec["ratio"] = rec["variant_s"] / rec["torch_s"]
        except Exception as e:  # noqa: BLE001 - a refused call is a row of the sweep
            rec["error"] = f"{type(e).__name__}: {e}"[:200]
        print(json.dumps(rec))
        got.append(rec)
    return got


if __name__ == "__main__":
    sys.exit(main())
