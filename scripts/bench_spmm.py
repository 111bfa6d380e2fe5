#!/usr/bin/env python
"""Local SpMM: gnnpar's kernels against torch's, each writing into a reused output.

    python scripts/bench_spmm.py                                   # CPU: rmat:scale=16,ef=16, 2 threads
    python scripts/bench_spmm.py --dataset rmat:scale=17,ef=16 --widths 64,256 --threads 1,2
    python scripts/bench_spmm.py --size-rule                       # CPU: the size rule's sweep
    python scripts/bench_spmm.py --probe --threads 1,2             # CPU: the machine's probe, again
    python scripts/bench_spmm.py --device cuda --dataset rmat:scale=20,ef=16   # Triton vs cuSPARSE
    python scripts/bench_spmm.py --device cuda --sweep    # + every Triton tile, and rows unsorted

Â·H with the GCN-normalised Â of the dataset, H (n, f), for each width f. The sides:

- ``gnnpar``: on the CPU the compiled kernel (``kernels/cpu_spmm.py``), forced on at every
  width (``GNNPAR_SPMM=numba``; column ``rule`` says which side the size rule would pick
  for this product), for each thread count, fp32; on CUDA the Triton kernel
  (``kernels/triton_spmm.py``), with H in fp32 and in bf16 (bf16 gathers, fp32 sums). It
  writes into an output allocated once.
- ``torch`` (``torch_s``): ``torch.addmm(out, A, H, beta=0, out=out)``, into an output
  allocated once, as gnnpar's own products call torch (MKL on the CPU, cuSPARSE on CUDA). Where
  torch refuses it (CUDA bf16 in some builds) the row says so and ``ratio`` uses the next one.
- ``torch fresh`` (``torch_fresh_s``): ``torch.sparse.mm(A, H)``, which allocates its output
  on every call: what a user of torch writes, for reference; not like for like.

Each side runs once per round, the sides alternating, ``--repeats`` rounds after a warm-up;
the medians are reported with ``ratio`` = gnnpar / torch (reused outputs both; below 1
gnnpar is faster) and the 1-minute load average (``load``, :func:`os.getloadavg`) read as the
row finished: with more runnable threads than cores every figure is noise.
``GNNPAR_SPMM=torch`` switches gnnpar's CPU products to torch's kernel; ``GNNPAR_SPMM_GPU=triton``
its CUDA ones to Triton.

``--size-rule`` (CPU) sweeps for the size rule of ``kernels/cpu_spmm.py`` (per dtype, the
compiled kernel serves a product at least ``min_width`` wide with at least ``min_work`` =
nnz·width multiply-adds, torch's ``addmm`` the rest): the figures behind the fixed rule
``SIZE_RULE``, and a check of the rule the machine's probe chose (``rule`` column: the side
the library picks at that thread count). It sweeps ``--rule-widths``
(default 1,4,8,16,32,64,128,256) on each graph of ``--rule-graphs`` (default rmat scales
10, 12, 14, 16, ef 16), both sides through ``cpu_spmm.csr_mm`` as the library calls it (into a
reused output; ``GNNPAR_SPMM=numba`` on one side, ``torch`` on the other, so
for fp32 the torch side is ``torch.addmm(out, A, H, beta=0, out=out)``, for bf16 the widened
copy's product rounded into ``out``, exactly the fallback). Every round visits every
(graph, width) once, both sides back to back in alternating order; a product is repeated
within a timing until it takes about ``--min-time`` seconds. It prints one JSON line per
(graph, width) with the medians, which side wins and which side the library picks, then
a table sorted by nnz·width, and per dtype the (min_width, min_work) pair among the swept
values that loses least against always picking the faster side (mean relative excess time),
beside the library's picks' loss.

``--probe`` (CPU) runs the probe that decides the size rule on this machine
(``kernels/cpu_spmm_probe.py``) now, at each of ``--threads`` and for each of ``--rule-dtypes``,
and prints one JSON line each: the probe's best times per width, the rule they give and the
rule cached for this machine (``$GNNPAR_CACHE_DIR/spmm_rule.json``), with the load average.
``--write`` replaces the cached entries with these (to re-measure on a quiet machine).

``--sweep`` (CUDA) also times every tile of ``triton_spmm.CANDIDATES`` and the default tile
with the rows in their stored order instead of longest first, one JSON line each
(``"variant"``), and prints the fastest tile per width and dtype: the figures behind
``triton_spmm.config_for``. It also times cuSPARSE with int32 indices (``cusparse-i32``) and
``torch.addmm`` with ``beta=0`` into a reused output (``cusparse-addmm``), each as a ratio to
a fresh-output ``torch.sparse.mm``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from unittest import mock

import torch

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # run from a checkout without installing

from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.datasets.normalize import propagation_matrix  # noqa: E402
from gnnpar.kernels import cpu_spmm, cpu_spmm_probe, triton_spmm  # noqa: E402
from gnnpar.kernels.local import csr_tensor  # noqa: E402

RULE_WIDTHS = "1,4,8,16,32,64,128,256"
#: from a mini-batch block's size to a full graph's
RULE_GRAPHS = tuple(f"rmat:scale={s},ef=16" for s in (10, 12, 14, 16))


def timed(fn, device, calls: int = 1) -> float:
    """Seconds per call of ``fn``, over ``calls`` calls back to back."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t) / calls


def load() -> float:
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)


def spmm_mode(mode: str):
    """``GNNPAR_SPMM`` set to ``mode`` for a ``with`` block."""
    return mock.patch.dict(os.environ, {cpu_spmm.ENV: mode})


def compiled_mm(A, h, out):
    """gnnpar's CPU product on the compiled kernel, whatever the size rule says."""
    with spmm_mode("numba"):
        return cpu_spmm.csr_mm(A, h, out)


def torch_mm(A, h, out):
    """gnnpar's CPU product on torch's kernel (``addmm`` into ``out`` for fp32)."""
    with spmm_mode("torch"):
        return cpu_spmm.csr_mm(A, h, out)


def rule_picks(nnz: int, f: int, dtype=torch.float32) -> str:
    """Which side the current size rule gives a product of ``nnz`` entries, ``f`` wide."""
    return "gnnpar" if cpu_spmm.kernel_picked(dtype, f, nnz) else "torch"


def gcn_operator(spec, device):
    g = load_dataset(spec)
    A = csr_tensor(*propagation_matrix(g, "gcn"), (g.num_nodes, g.num_nodes), device)
    return g, A


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="rmat:scale=16,ef=16")
    p.add_argument("--widths", default="16,64,256,512")
    p.add_argument("--threads", default="2", help="comma list of torch thread counts (CPU)")
    p.add_argument("--repeats", type=int, default=5, help="rounds (medians reported)")
    p.add_argument("--device", default="cpu", help="cpu (numba kernel) or cuda (Triton)")
    p.add_argument("--sweep", action="store_true",
                   help="CUDA: also time every Triton tile and the unsorted row order")
    p.add_argument("--size-rule", action="store_true",
                   help="CPU: sweep widths and graph sizes for cpu_spmm's SIZE_RULE")
    p.add_argument("--rule-widths", default=RULE_WIDTHS, help="widths of --size-rule")
    p.add_argument("--rule-graphs", nargs="+", default=list(RULE_GRAPHS),
                   help="dataset specs of --size-rule (space-separated)")
    p.add_argument("--rule-dtypes", default="fp32", help="fp32 and/or bf16 (--size-rule)")
    p.add_argument("--probe", action="store_true",
                   help="CPU: run the size rule's probe now at each --threads and "
                        "--rule-dtypes; print its times and rule beside the cached one")
    p.add_argument("--write", action="store_true",
                   help="--probe: replace the cached rule with the new measurement")
    p.add_argument("--min-time", type=float, default=0.005,
                   help="--size-rule: repeat a product within one timing until about this "
                        "many seconds (default 0.005)")
    a = p.parse_args(argv)
    if a.sweep and a.device != "cuda":
        p.error("--sweep times Triton tiles: it needs --device cuda")
    if (a.size_rule or a.probe) and a.device != "cpu":
        p.error("--size-rule and --probe are the CPU kernel's rule: they need --device cpu")
    if a.write and not a.probe:
        p.error("--write replaces the probe's cached rule: it needs --probe")
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if not (triton_spmm.available() if cuda else cpu_spmm.available()):
        print("bench_spmm: the kernel is not available here (CPU: numba missing or "
              "GNNPAR_SPMM=torch; CUDA: Triton missing)", file=sys.stderr)
        return 2
    threads = [1] if cuda else [int(t) for t in a.threads.split(",")]
    if a.probe:
        return probe(a, threads)
    if a.size_rule:
        return size_rule(a, threads)
    ours_mm = triton_spmm.csr_mm if cuda else compiled_mm
    g, A = gcn_operator(a.dataset, device)
    nnz = A.values().shape[0]
    print(f"# {a.dataset} on {device}: n={g.num_nodes:,} nnz={nnz:,}; load average "
          f"{load():.2f}", file=sys.stderr)
    rows, sweep = [], []
    dtypes = (torch.float32, torch.bfloat16) if cuda else (torch.float32,)
    for t in threads:
        torch.set_num_threads(t)
        for f in (int(w) for w in a.widths.split(",")):
            for dtype in dtypes:
                rows.append(compare(A, f, dtype, ours_mm, device, t, a.repeats))
                row = rows[-1]
                if not cuda:
                    row["rule"] = rule_picks(nnz, f)
                print(json.dumps(row))
                if a.sweep:
                    h = torch.randn(g.num_nodes, f, device=device).to(dtype)
                    out = torch.empty(g.num_nodes, f, device=device, dtype=dtype)
                    sweep.extend(sweep_tiles(A, h, out, row, a.repeats, device))
                    if dtype == torch.float32:
                        sweep.extend(sweep_cusparse(A, h, out, row, a.repeats, device))
    print("\n| threads | width | dtype | gnnpar | torch addmm (reused out) | ratio | "
          "torch.sparse.mm (fresh out) | rule picks | load |\n"
          "|---|---|---|---|---|---|---|---|---|", file=sys.stderr)
    for r in rows:
        addmm = (f"{r['torch_s'] * 1e3:.2f} ms" if r.get("torch_s") is not None
                 else r.get("torch_error", "-")[:40])
        print(f"| {r['threads']} | {r['width']} | {r['dtype']} | {r['gnnpar_s'] * 1e3:.2f} ms | "
              f"{addmm} | {r['ratio']:.2f}{'' if r['ratio_vs'] == 'torch_s' else ' (vs fresh)'} | "
              f"{r['torch_fresh_s'] * 1e3:.2f} ms | {r.get('rule', '-')} | {r['load']:.2f} |",
              file=sys.stderr)
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
                  f"{best['gnnpar_s'] / r[r['ratio_vs']] if best else float('nan'):.2f} |",
                  file=sys.stderr)
        calls = [s for s in sweep if s["variant"].startswith("cusparse")]
        if calls:
            print("\n| width | cuSPARSE call | time | vs torch.sparse.mm (fresh out) | load |\n"
                  "|---|---|---|---|---|", file=sys.stderr)
        for s in calls:
            print(f"| {s['width']} | {s['variant']} | "
                  + (f"{s['variant_s'] * 1e3:.2f} ms | {s['ratio']:.2f} |" if "ratio" in s
                     else f"{s['error']} | - |") + f" {s['load']:.2f} |", file=sys.stderr)
    return 0


def compare(A, f, dtype, ours_mm, device, threads, repeats) -> dict:
    """One width and dtype: gnnpar, torch ``addmm`` into a reused output and a fresh-output
    ``torch.sparse.mm``, one call each per round, alternating; medians over ``repeats``."""
    n = A.shape[1]
    h = torch.randn(n, f, device=device).to(dtype)
    out = torch.empty(A.shape[0], f, device=device, dtype=dtype)
    ref = torch.empty_like(out)
    A_t = A if dtype == torch.float32 else A.to(dtype)
    sides = {"gnnpar_s": lambda: ours_mm(A, h, out),
             "torch_s": lambda: torch.addmm(ref, A_t, h, beta=0, out=ref),
             "torch_fresh_s": lambda: torch.sparse.mm(A_t, h)}
    row = {"device": str(device), "threads": threads, "width": f,
           "dtype": str(dtype).replace("torch.", "")}
    for key, call in list(sides.items()):
        try:
            call()  # warm-up (compiles on first use)
        except Exception as e:  # noqa: BLE001 - a refused call is a cell of the row
            row[key] = None
            row[key.replace("_s", "_error")] = f"{type(e).__name__}: {e}"[:200]
            del sides[key]
    times = {k: [] for k in sides}
    for r in range(repeats):
        for key in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            times[key].append(timed(sides[key], device))
    row.update({k: statistics.median(v) for k, v in times.items()})
    row["ratio_vs"] = "torch_s" if row.get("torch_s") else "torch_fresh_s"
    row["ratio"] = row["gnnpar_s"] / row[row["ratio_vs"]]
    row["load"] = load()
    return row


def size_rule(a, threads) -> int:
    """``--size-rule``: every (graph, width, dtype) on both sides, interleaved rounds."""
    widths = [int(w) for w in a.rule_widths.split(",")]
    dtypes = dtypes_of(a.rule_dtypes)
    cpu = torch.device("cpu")
    print(f"# size rule sweep: widths {widths}, graphs {a.rule_graphs}, threads {threads}, "
          f"{a.repeats} rounds; current rule {current_rule()}; load average {load():.2f}",
          file=sys.stderr)
    cases = []
    for spec in a.rule_graphs:
        g, A = gcn_operator(spec, cpu)
        print(f"# {spec}: n={g.num_nodes:,} nnz={A.values().shape[0]:,}", file=sys.stderr)
        for f in widths:
            for dtype in dtypes:
                h = torch.randn(g.num_nodes, f).to(dtype)
                cases.append({"graph": spec, "A": A, "h": h, "width": f, "dtype": dtype,
                              "nnz": int(A.values().shape[0]),
                              "out": torch.empty(g.num_nodes, f, dtype=dtype)})
    rows = []
    for t in threads:
        torch.set_num_threads(t)
        sides = {"gnnpar_s": compiled_mm, "torch_s": torch_mm}
        for c in cases:  # warm-up, and how many calls make one timing about --min-time long
            for mm in sides.values():
                mm(c["A"], c["h"], c["out"])
            once = max(timed(lambda: mm(c["A"], c["h"], c["out"]), cpu) for mm in sides.values())
            c["calls"] = max(1, min(1000, round(a.min_time / max(once, 1e-7))))
            c["times"] = {k: [] for k in sides}
            c["loads"] = []
        for r in range(a.repeats):
            for c in cases:
                order = list(sides) if r % 2 == 0 else list(sides)[::-1]
                for key in order:
                    mm = sides[key]
                    c["times"][key].append(
                        timed(lambda: mm(c["A"], c["h"], c["out"]), cpu, c["calls"]))
                c["loads"].append(load())
            print(f"# round {r + 1}/{a.repeats} done, load average {load():.2f}",
                  file=sys.stderr)
        for c in cases:
            row = {"graph": c["graph"], "threads": t, "width": c["width"],
                   "dtype": str(c["dtype"]).replace("torch.", ""), "nnz": c["nnz"],
                   "work": c["nnz"] * c["width"], "calls_per_timing": c["calls"],
                   **{k: statistics.median(v) for k, v in c["times"].items()},
                   "load": statistics.median(c["loads"])}
            row["ratio"] = row["gnnpar_s"] / row["torch_s"]
            row["faster"] = "gnnpar" if row["ratio"] < 1 else "torch"
            row["rule"] = rule_picks(c["nnz"], c["width"], c["dtype"])
            rows.append(row)
            print(json.dumps(row))
    for t in threads:
        torch.set_num_threads(t)  # the machine's rule at this thread count
        mine = sorted((r for r in rows if r["threads"] == t),
                      key=lambda r: (r["dtype"], r["work"]))
        print(f"\n{t} threads\n| graph | width | dtype | nnz·width | gnnpar (compiled) | "
              "torch addmm | ratio | faster | rule picks | load |\n"
              "|---|---|---|---|---|---|---|---|---|---|", file=sys.stderr)
        for r in mine:
            print(f"| {r['graph']} | {r['width']} | {r['dtype']} | {r['work']:.3g} | "
                  f"{r['gnnpar_s'] * 1e3:.3f} ms | {r['torch_s'] * 1e3:.3f} ms | "
                  f"{r['ratio']:.2f} | {r['faster']} | {r['rule']}"
                  f"{'' if r['rule'] == r['faster'] else ' (!)'} | {r['load']:.2f} |",
                  file=sys.stderr)
        for dtype in dtypes:
            name = str(dtype).replace("torch.", "")
            these = [r for r in mine if r["dtype"] == name]
            current = cpu_spmm.machine_rule(dtype) or (math.inf, math.inf)
            best = best_rule(these)
            now = picked_loss(these)
            print(f"{name}: current rule (min_width, min_work) = {current}: mean excess "
                  f"{now:.1%} over always the faster side; best swept rule "
                  f"({best[1]}, {best[2]}): {best[0]:.1%} (inf: never the kernel)",
                  file=sys.stderr)
            print(json.dumps({"what": "size_rule", "threads": t, "dtype": name,
                              "current": [str(v) for v in current], "current_excess": now,
                              "best": [str(best[1]), str(best[2])],
                              "best_excess": best[0], "load": load()}))
    return 0


def dtypes_of(spec: str):
    return [{"fp32": torch.float32, "bf16": torch.bfloat16}[d] for d in spec.split(",")]


def current_rule() -> str:
    """The rule at the current thread count: the machine's (measured) and the fixed one."""
    return ", ".join(f"{str(d).replace('torch.', '')}: {cpu_spmm.machine_rule(d)} (fixed "
                     f"{cpu_spmm.SIZE_RULE.get(d)})" for d in cpu_spmm.KERNEL_DTYPES)


def probe(a, threads) -> int:
    """``--probe``: the probe's measurement now, per thread count and dtype, beside the
    cached rule (replaced with ``--write``)."""
    for t in threads:
        torch.set_num_threads(t)
        for dtype in dtypes_of(a.rule_dtypes):
            cached = cpu_spmm_probe.cached_entry(dtype, t)
            before = load()
            t0 = time.perf_counter()
            times = cpu_spmm_probe.measure(dtype, cpu_spmm.kernel_product,
                                       cpu_spmm.probe_torch_product)
            spent = time.perf_counter() - t0
            rule = (cpu_spmm_probe.store(dtype, t, times, spent) if a.write
                    else cpu_spmm_probe.rule_of(times))
            print(json.dumps({
                "what": "probe", "threads": t, "dtype": str(dtype).replace("torch.", ""),
                "nnz": cpu_spmm_probe.probe_nnz(),
                "kernel_ms": {w: round(k * 1e3, 3) for w, (k, _) in sorted(times.items())},
                "torch_ms": {w: round(s * 1e3, 3) for w, (_, s) in sorted(times.items())},
                "rule": rule, "cached_before": cached and cached["rule"],
                "cached_load": cached and cached.get("load"), "written": a.write,
                "probe_s": round(spent, 3), "load_before": before, "load": load(),
                "cache": cpu_spmm_probe.cache_path()}))
    return 0


def picked_loss(rows) -> float:
    """Mean over ``rows`` of (time of the side the library picks, column ``rule``) / (the
    faster side's) − 1."""
    lost = [r[r["rule"] + "_s"] / min(r["gnnpar_s"], r["torch_s"]) - 1 for r in rows]
    return statistics.mean(lost) if lost else 0.0


def rule_loss(rows, min_width, min_work) -> float:
    """Mean over ``rows`` of (time of the side the rule picks) / (the faster side's) − 1."""
    lost = []
    for r in rows:
        picked = r["gnnpar_s"] if (r["width"] >= min_width and r["work"] >= min_work) \
            else r["torch_s"]
        lost.append(picked / min(r["gnnpar_s"], r["torch_s"]) - 1)
    return statistics.mean(lost) if lost else 0.0


def best_rule(rows):
    """(loss, min_width, min_work) of the swept values (and never: inf) that loses least;
    among equal losses the larger thresholds (torch for more products)."""
    widths = sorted({0, math.inf} | {r["width"] for r in rows})
    works = sorted({0} | {r["work"] for r in rows})
    loss, w, k = min((rule_loss(rows, w, k), -w, -k) for w in widths for k in works)
    return loss, -w, -k


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
        rec = {k: base[k] for k in ("device", "width", "dtype", "ratio_vs")}
        rec["torch_s"] = base[base["ratio_vs"]]
        rec.update(variant=variant, config=",".join(map(str, c)))
        try:
            def run():
                triton_spmm.csr_mm(A, h, out, config=c, order=order)
            run()
            rec["gnnpar_s"] = statistics.median(timed(run, device) for _ in range(repeats))
            rec["ratio"] = rec["gnnpar_s"] / rec["torch_s"]
        except Exception as e:  # noqa: BLE001 - one tile's failure is a row of the sweep
            rec["error"] = f"{type(e).__name__}: {e}"[:200]
        rec["load"] = load()
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
        rec["load"] = load()
        print(json.dumps(rec))
        got.append(rec)
    return got


if __name__ == "__main__":
    sys.exit(main())
