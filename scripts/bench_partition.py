"""Benchmark every partitioner: time, peak memory, edge cut, balance, halo sizes.

    python scripts/bench_partition.py                       # rmat:scale=18 and an SBM, 4/16/64 parts
    python scripts/bench_partition.py --graphs sbm --parts 8 --methods metis,random
    python scripts/bench_partition.py --json-out bench.jsonl --load-check

Each (graph, parts, method, balance) runs in its own child process, one at a time, so peak
memory figures never mix and at most one core is busy with partitioning. A child loads the graph
from an .npz the parent wrote once, records its RSS, partitions while a thread samples RSS every
5 ms, and reports ``peak_mb`` = highest RSS during partitioning minus RSS before it (the
partitioner's own footprint, input graph excluded) and ``maxrss_mb`` (whole-process high-water
mark). Quality figures come from :func:`gnnpar.partitioners.report` on the same partition.

``--load-check`` writes METIS shards of the first graph at 8 parts and compares the peak RSS of
a process that loads one rank's shard (memory-mapped, every array read) with one that loads the
whole graph (both after the same imports; the import-only RSS is reported too).

Output: a table on stdout and one JSON object per line in ``--json-out``; the last lines compare
METIS with random per graph and part count, and give the SBM acceptance figure
(METIS halo total vs (P-1)*n rows of a 1D all-gather).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# 8 blocks, mean in-block degree 10, mean cross-block degree 0.5 (n = 100,000: 12,500 per block)
SBM_N, SBM_BLOCKS = 100_000, 8
SBM_SPEC = (f"sbm:n={SBM_N},blocks={SBM_BLOCKS},p_in={10 / (SBM_N / SBM_BLOCKS - 1):.9g},"
            f"p_out={0.5 / (SBM_N - SBM_N / SBM_BLOCKS):.9g}")
GRAPHS = {"rmat": "rmat:scale=18,ef=16", "sbm": SBM_SPEC}
CONFIGS = [("block", "nodes"), ("random", "nodes"), ("metis", "nodes"), ("metis", "edges"),
           ("kaminpar", "nodes"), ("kaminpar", "edges")]
MB = 1 << 20


# ---------------------------------------------------------------------------- child side
def rss() -> int:
    import psutil
    return psutil.Process().memory_info().rss


def maxrss_bytes() -> int:
    """Peak RSS of this process image. VmHWM belongs to the address space and starts afresh at
    exec; ru_maxrss would carry over the high-water mark of the (large) parent that forked us."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PeakSampler:
    """Highest RSS seen by a background thread while the ``with`` block runs."""

    def __enter__(self):
        self.peak, self._stop = rss(), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())


def save_graph(g, path: str) -> None:
    arrays = {k: getattr(g, k) for k in ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")}
    if g.edge_weight is not None:
        arrays["edge_weight"] = g.edge_weight
    import numpy as np
    np.savez(path, num_classes=g.num_classes, **arrays)


def read_graph(path: str):
    import numpy as np
    from gnnpar.datasets import Graph
    with np.load(path) as z:
        kw = {k: z[k] for k in z.files if k != "num_classes"}
        return Graph(num_classes=int(z["num_classes"]), **kw)


def child_partition(a) -> dict:
    import gnnpar.partitioners as gp
    g = read_graph(a.graph_file)
    base = rss()
    t0 = time.perf_counter()
    with PeakSampler() as peak:
        part = gp.partition_graph(g, a.parts, a.method, seed=a.seed, balance=a.balance)
    seconds = time.perf_counter() - t0
    rep = gp.report(g, part, feat_width=a.feat_width)
    rep.pop("halo")
    return {**rep, "balance": a.balance, "time_s": seconds, "peak_mb": (peak.peak - base) / MB,
            "maxrss_mb": maxrss_bytes() / MB}


def child_load(a) -> dict:
    import numpy as np
    import gnnpar.partitioners as gp
    base = rss()
    if a.what == "shard":
        s = gp.load_shard(a.dir, a.rank, mmap=True)
        touched = [s.global_ids, s.indptr, s.indices, s.raw_weight, s.orig_edge, s.halo_ids,
                   s.send_local, s.x, s.y, s.train_mask, *s.values.values()]
        n_rows = s.n_local
    elif a.what == "graph":
        g = read_graph(a.graph_file)
        touched = [g.indptr, g.indices, g.x, g.y, g.train_mask]
        n_rows = g.num_nodes
    else:
        touched, n_rows = [], 0
    # read every byte; the buffered float64 reduction makes no full-size temporary
    checksum = float(sum(np.asarray(t).sum(dtype=np.float64) for t in touched))
    return {"what": a.what, "rows": n_rows, "import_rss_mb": base / MB,
            "maxrss_mb": maxrss_bytes() / MB, "checksum": checksum}


# ---------------------------------------------------------------------------- parent side
def run_child(args: list, timeout: int = 1800) -> dict:
    r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1], "rc": r.returncode}
    return json.loads(r.stdout.strip().splitlines()[-1])


def fmt_row(r: dict) -> str:
    if "error" in r:
        return f"{r['graph']:>5} {r['parts']:>4} {r['method']:>8} {r['balance']:>5}  ERROR {r['error']}"
    return (f"{r['graph']:>5} {r['parts']:>4} {r['method']:>8} {r['balance']:>5} {r['time_s']:8.2f} "
            f"{r['peak_mb']:8.0f} {100 * r['edge_cut_fraction']:7.2f} {r['vertex_balance']:6.3f} "
            f"{r['edge_balance']:6.3f} {r['halo_total']:10,d} {r['halo_max']:9,d} "
            f"{r.get('halo_total_vs_random', float('nan')):6.3f} {r.get('halo_max_vs_random', float('nan')):6.3f}")


HEADER = (f"{'graph':>5} {'P':>4} {'method':>8} {'bal':>5} {'time_s':>8} {'peak_mb':>8} {'cut%':>7} "
          f"{'vbal':>6} {'ebal':>6} {'halo_tot':>10} {'halo_max':>9} {'tot/rnd':>6} {'max/rnd':>6}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graphs", default="rmat,sbm", help="comma list of rmat,sbm (default: both)")
    p.add_argument("--parts", default="4,16,64", help="comma list of part counts (default: 4,16,64)")
    p.add_argument("--methods", default=None, help="comma list of methods (default: all, both balances for metis/kaminpar)")
    p.add_argument("--feat-width", type=int, default=128, help="f for the bytes figures (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="partitioner seed (default: 0)")
    p.add_argument("--json-out", default=None, help="append JSON lines here (default: none)")
    p.add_argument("--load-check", action="store_true", help="also measure one rank's shard load vs the whole graph")
    p.add_argument("--sbm-parts", type=int, default=8, help="parts of the SBM acceptance check (default: 8)")
    p.add_argument("--child", choices=("partition", "load"), help=argparse.SUPPRESS)
    p.add_argument("--graph-file", help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--balance", default="nodes", help=argparse.SUPPRESS)
    p.add_argument("--what", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        if a.child == "partition":
            a.parts = int(a.parts)
        print(json.dumps(child_partition(a) if a.child == "partition" else child_load(a)))
        return 0

    from gnnpar.datasets import load_dataset
    parts_list = [int(v) for v in a.parts.split(",")]
    configs = CONFIGS if not a.methods else [c for c in CONFIGS if c[0] in a.methods.split(",")]
    out = open(a.json_out, "a") if a.json_out else None
    emit = (lambda rec: (out.write(json.dumps(rec) + "\n"), out.flush())) if out else (lambda rec: None)
    tmp = tempfile.mkdtemp(prefix="bench-partition-")
    results = []
    print(HEADER, flush=True)
    for gname in a.graphs.split(","):
        spec = GRAPHS[gname]
        g = load_dataset(spec)
        gfile = os.path.join(tmp, f"{gname}.npz")
        save_graph(g, gfile)
        info = {"graph": gname, "spec": spec, "n": g.num_nodes, "m": g.num_edges}
        print(f"# {gname}: {spec}  n={g.num_nodes:,} m={g.num_edges:,}", flush=True)
        emit({"kind": "graph", **info})
        del g
        plist = sorted(set(parts_list + ([a.sbm_parts] if gname == "sbm" else [])))
        for parts in plist:
            rows = []
            for method, balance in configs:
                r = run_child(["--child", "partition", "--graph-file", gfile, "--parts", str(parts),
                               "--method", method, "--balance", balance, "--seed", str(a.seed),
                               "--feat-width", str(a.feat_width)])
                rows.append({"kind": "partition", "graph": gname, "parts": parts, "method": method,
                             "balance": balance, **r})
            rnd = next((r for r in rows if r["method"] == "random" and "error" not in r), None)
            for r in rows:
                if rnd and "error" not in r:
                    r["halo_total_vs_random"] = r["halo_total"] / max(rnd["halo_total"], 1)
                    r["halo_max_vs_random"] = r["halo_max"] / max(rnd["halo_max"], 1)
                print(fmt_row(r), flush=True)
                emit(r)
            results += rows
    if a.load_check:
        results.append(load_check(a, tmp, emit))
    summarize(results, emit)
    if out:
        out.close()
    return 0


def load_check(a, tmp: str, emit) -> dict:
    import gnnpar.partitioners as gp
    gname = a.graphs.split(",")[0]
    gfile = os.path.join(tmp, f"{gname}.npz")
    g = read_graph(gfile)
    shard_dir = os.path.join(tmp, "shards")
    part = gp.partition_graph(g, 8, "metis", seed=a.seed)
    gp.write_shards(g, part, shard_dir)
    del g, part
    rec = {"kind": "load", "graph": gname, "parts": 8}
    for what in ("imports", "graph", "shard"):
        r = run_child(["--child", "load", "--what", what, "--graph-file", gfile, "--dir", shard_dir, "--rank", "0"])
        rec[f"{what}_maxrss_mb"] = r.get("maxrss_mb")
    base = rec["imports_maxrss_mb"]
    rec["graph_over_imports_mb"] = rec["graph_maxrss_mb"] - base
    rec["shard_over_imports_mb"] = rec["shard_maxrss_mb"] - base
    print(f"# load {gname} at 8 parts: peak RSS imports only {base:.0f} MB, whole graph "
          f"{rec['graph_maxrss_mb']:.0f} MB (+{rec['graph_over_imports_mb']:.0f}), one rank's shard "
          f"{rec['shard_maxrss_mb']:.0f} MB (+{rec['shard_over_imports_mb']:.0f})", flush=True)
    emit(rec)
    return rec


def summarize(results: list, emit) -> None:
    print("# METIS vs random (halo total ratio, worst part's halo ratio):", flush=True)
    for r in results:
        if r.get("kind") == "partition" and r["method"] == "metis" and "error" not in r:
            print(f"#   {r['graph']} P={r['parts']} balance={r['balance']}: total {r['halo_total_vs_random']:.3f}, "
                  f"max {r['halo_max_vs_random']:.3f}", flush=True)
    for r in results:
        if (r.get("kind") == "partition" and r["graph"] == "sbm" and r["method"] == "metis"
                and r["balance"] == "nodes" and r["parts"] == 8 and "error" not in r):
            rows = (r["parts"] - 1) * r["n"]
            rec = {"kind": "sbm_acceptance", "parts": 8, "halo_total": r["halo_total"],
                   "allgather_rows": rows, "ratio": r["halo_total"] / rows}
            print(f"# SBM at 8 parts: METIS halo total {r['halo_total']:,} rows vs (P-1)*n = {rows:,} "
                  f"-> {rec['ratio']:.4f} (needs <= 0.2)", flush=True)
            emit(rec)


if __name__ == "__main__":
    sys.exit(main())
