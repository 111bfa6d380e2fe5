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

``--pipeline``: the whole ``gnnpar-partition`` command at several R-MAT scales::

    python scripts/bench_partition.py --pipeline --report --work /scratch/bench \
        --out-json pipeline.json --plot pipeline.png           # scales 20,21,22,23, kaminpar, 16 parts
    python scripts/bench_partition.py --pipeline --scales 14 --parts 4 --method metis --report

Strictly one command at a time, per scale:

1. *ingest*: ``load_dataset("rmat:scale=S,ef=E", cache_dir=WORK/cache-sS)`` in a plain
   ``python -c`` (no gnnpar-partition), which writes the binary cache (a cache already there is
   only read: ``cache_hit`` says which);
2. *pipeline*: ``python -m gnnpar.cli.partition_cli --dataset cache:<the cache folder> --parts P
   --method M --json [--out WORK/shards-sS-pP-M] [--report]`` (``--no-shards`` drops ``--out``);
   the phase times (``phases``: load/partition/shards/report), ``peak_rss_bytes`` and
   ``partition_call_s`` it prints with ``--json`` are kept when present, "not measured" otherwise;
3. *kaminpar call* and *metis call*: a child process each loads the cache and times only
   ``kaminpar_partition(graph, P, threads=--threads)`` (all cores by default; no ``threads`` is
   passed when the function lacks it) or ``metis_partition(graph, P)``: the whole function,
   so symmetrising the structure and (KaMinPar) writing its input file are included. METIS is
   skipped above ``--skip-metis-above`` (default 22).

Every step runs under ``/usr/bin/time -v`` (``apt-get install time``; without it the same
figures come from ``os.wait4``): wall time = "Elapsed (wall clock)", peak RSS = "Maximum
resident set size". That maximum is taken over the process and each waited-for descendant
*individually*, not their sum; KaMinPar and METIS run inside the command's process, so it is
the command's peak. The 1/5/15-minute load averages before and after each step are printed
beside its figures and stored (a busy machine makes times worthless), with the git commit
(``+dirty`` when ``git status --porcelain`` lists changes). Disk: bytes of all files under the
cache folder and the shard folder. The acceptance figure printed per scale is
``total / kaminpar call`` (issue 24: at scale 21 from a prebuilt cache, KaMinPar, 16 parts,
``--report``: <= 1.5, peak RSS <= 3 GB). ``--out-json`` gets the whole record (rewritten after
every scale), ``--plot`` a PNG of times and peak RSS against scale.
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timev, beside this script

import timev  # noqa: E402
from timev import GNU_TIME, loadavg, parse_gnu_time  # noqa: E402,F401 (parse_gnu_time: tests)

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


def child_call(a) -> dict:
    """--pipeline: load the cache folder ``a.dir`` and time only the partitioner library's call."""
    import inspect
    from gnnpar.datasets import load_dataset
    t0 = time.perf_counter()
    g = load_dataset(f"cache:{a.dir}")
    load_s = time.perf_counter() - t0
    if a.method == "kaminpar":
        from gnnpar.partitioners.kaminpar_part import kaminpar_partition as fn
    elif a.method == "metis":
        from gnnpar.partitioners.metis import metis_partition as fn
    else:
        raise SystemExit(f"--child call: no library call for method {a.method!r}")
    kw = {}
    if a.method == "kaminpar" and "threads" in inspect.signature(fn).parameters:
        kw["threads"] = a.threads
    t0 = time.perf_counter()
    part = fn(g, a.parts, seed=a.seed, **kw)
    call_s = time.perf_counter() - t0
    owner = getattr(part, "owner", None)
    return {"method": a.method, "call_s": call_s, "load_s": load_s, "n": int(g.num_nodes),
            "m": int(g.num_edges), "threads": kw.get("threads"), "vmhwm_bytes": maxrss_bytes(),
            "parts_used": None if owner is None else int(len(set(owner.tolist())))}


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
    p.add_argument("--parts", default=None,
                   help="comma list of part counts (default: 4,16,64); with --pipeline one count (default: 16)")
    p.add_argument("--methods", default=None, help="comma list of methods (default: all, both balances for metis/kaminpar)")
    p.add_argument("--feat-width", type=int, default=128, help="f for the bytes figures (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="partitioner seed (default: 0)")
    p.add_argument("--json-out", default=None, help="append JSON lines here (default: none)")
    p.add_argument("--load-check", action="store_true", help="also measure one rank's shard load vs the whole graph")
    p.add_argument("--sbm-parts", type=int, default=8, help="parts of the SBM acceptance check (default: 8)")
    g = p.add_argument_group("--pipeline mode (the whole gnnpar-partition command per R-MAT scale)")
    g.add_argument("--pipeline", action="store_true", help="benchmark the gnnpar-partition command")
    g.add_argument("--scales", default="20,21,22,23", help="comma list of R-MAT scales (default: 20,21,22,23)")
    g.add_argument("--ef", type=int, default=16, help="R-MAT edge factor (default: 16)")
    g.add_argument("--method", default=None,
                   help="partitioner of the gnnpar-partition run (default: kaminpar)")
    g.add_argument("--work", default=None, metavar="DIR",
                   help="folder for the caches (cache-sS) and shards (shards-sS-pP-M); a cache "
                        "already there is reused (default: a new temporary folder, kept)")
    g.add_argument("--report", action="store_true", help="pass --report to gnnpar-partition")
    g.add_argument("--no-shards", action="store_true",
                   help="no --out: write no shards (needs --report)")
    g.add_argument("--drop-shards", action="store_true",
                   help="delete each shard folder once its size is measured (saves disk)")
    g.add_argument("--extra-args", default="", metavar="ARGS",
                   help="more gnnpar-partition flags, one shell-quoted string; write --extra-args=--flag "
                        "when it starts with a dash (default: none)")
    g.add_argument("--threads", type=int, default=None,
                   help="threads of the separate KaMinPar call (default: os.cpu_count())")
    g.add_argument("--skip-metis-above", type=int, default=22, metavar="SCALE",
                   help="no separate METIS call above this scale (default: 22)")
    g.add_argument("--timeout", type=float, default=4 * 3600,
                   help="seconds allowed to each step before it is killed (default: 14400)")
    g.add_argument("--out-json", default=None, metavar="FILE", help="write the results here (default: none)")
    g.add_argument("--plot", default=None, metavar="PNG", help="plot time and peak RSS against scale")
    p.add_argument("--child", choices=("partition", "load", "call"), help=argparse.SUPPRESS)
    p.add_argument("--graph-file", help=argparse.SUPPRESS)
    p.add_argument("--balance", default="nodes", help=argparse.SUPPRESS)
    p.add_argument("--what", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        if a.child in ("partition", "call"):
            a.parts = int(a.parts)
        child = {"partition": child_partition, "load": child_load, "call": child_call}[a.child]
        print(json.dumps(child(a)))
        return 0
    if a.pipeline:
        if a.json_out:
            p.error("--pipeline writes one JSON object: use --out-json FILE, not --json-out")
        if a.no_shards and not a.report:
            p.error("--no-shards needs --report: gnnpar-partition refuses a run with nothing to do")
        return pipeline(a)
    if a.parts is None:
        a.parts = "4,16,64"

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


# ---------------------------------------------------------------------------- --pipeline
GB = 1e9
RSS_LIMIT = 3 * GB  # issue 24: peak RSS <= 3 GB at scale 21
RATIO_LIMIT = 1.5  # issue 24: whole command <= 1.5x KaMinPar's own call with all cores
PHASES = ("load", "partition", "shards", "report")
NM = "not measured"


def measure(cmd: list, timeout: float, env: dict = None) -> dict:
    """``cmd`` run alone and measured (:func:`timev.measure`) with this module's
    :data:`GNU_TIME`, which a test points elsewhere to check the ``os.wait4`` fallback."""
    return timev.measure(cmd, timeout, env=env, gnu_time=GNU_TIME)


def last_json(stdout: str):
    """The last line of ``stdout`` that parses as a JSON object, or None."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def tree_bytes(path: str):
    """Sum of the sizes of the regular files under ``path`` (links not followed); None if absent."""
    if not path or not os.path.exists(path):
        return None
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(top, name)):
                total += st.st_size
    return total


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        if head.returncode != 0:
            return "unknown"
        st = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
        return head.stdout.strip() + ("+dirty" if st.returncode != 0 or st.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def child_env() -> dict:
    """The environment of every step: ours, with this checkout first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def find_cache_folder(cache_dir: str) -> str:
    """The one cache folder ``load_dataset(..., cache_dir=cache_dir)`` wrote (it holds meta.json)."""
    found = [os.path.join(cache_dir, e) for e in sorted(os.listdir(cache_dir))
             if os.path.isfile(os.path.join(cache_dir, e, "meta.json"))]
    if len(found) != 1:
        raise RuntimeError(f"expected one cache folder in {cache_dir}, found {len(found)}: {found}")
    return found[0]


def fmt_s(v) -> str:
    return NM if v is None else f"{v:9.2f} s"


def fmt_gb(v) -> str:
    if v is None:
        return NM
    return f"{v / GB:7.3f} GB" if v >= GB / 10 else f"{v / 1e6:7.1f} MB"


def fmt_load(rec: dict) -> str:
    b, e = rec.get("load_before"), rec.get("load_after")
    if not b:
        return "load n/a"
    return f"load {b[0]:.2f}" + (f" -> {e[0]:.2f}" if e else "")


def say_step(label: str, rec: dict, extra: str = "") -> None:
    if rec.get("skipped"):
        print(f"  {label:<26} {NM} ({rec['skipped']})", flush=True)
        return
    err = f"  ERROR {rec['error']}" if rec.get("error") else ""
    print(f"  {label:<26} wall {fmt_s(rec.get('wall_s'))}  peak RSS {fmt_gb(rec.get('max_rss_bytes'))}"
          f"{extra}  {fmt_load(rec)}{err}", flush=True)


def num(v):
    """``v`` if it is a real number (not bool), else None."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def cli_fields(cli) -> dict:
    """What the bench keeps of the JSON object ``gnnpar-partition --json`` printed (None: none
    printed): ``phases`` (each of PHASES, None when missing, plus any other numeric phase),
    ``peak_rss_bytes``, ``partition_call_s``, ``partition_s`` (None when missing) and a few
    quality figures when present."""
    cli = cli if isinstance(cli, dict) else {}
    phases = cli.get("phases") if isinstance(cli.get("phases"), dict) else {}
    out = {"phases": {k: num(phases.get(k)) for k in PHASES}, "json_printed": bool(cli)}
    out["phases"].update({k: num(v) for k, v in phases.items() if k not in PHASES and num(v) is not None})
    for k in ("peak_rss_bytes", "partition_call_s", "partition_s"):
        out[k] = num(cli.get(k))
    for k in ("edge_cut_fraction", "vertex_balance", "edge_balance", "halo_total", "halo_max"):
        if num(cli.get(k)) is not None:
            out[k] = cli[k]
    return out


def pipeline_scale(a, scale: int, work: str, env: dict) -> dict:
    spec = f"rmat:scale={scale},ef={a.ef}"
    cache_dir = os.path.join(work, f"cache-s{scale}-ef{a.ef}")
    shard_dir = None if a.no_shards else os.path.join(work, f"shards-s{scale}-ef{a.ef}-p{a.parts}-{a.method}")
    rec = {"scale": scale, "spec": spec, "cache_dir": cache_dir, "shard_dir": shard_dir}
    print(f"# scale {scale}: {spec}, {a.parts} parts, {a.method}"
          f"{', --report' if a.report else ''}{', shards' if shard_dir else ', no shards'}", flush=True)

    # 1. ingest: build (or read) the cache without gnnpar-partition
    os.makedirs(cache_dir, exist_ok=True)
    had_cache = any(os.path.isfile(os.path.join(cache_dir, e, "meta.json")) for e in os.listdir(cache_dir))
    ing = measure([sys.executable, "-c",
                   "import sys; from gnnpar.datasets import load_dataset; "
                   "load_dataset(sys.argv[1], cache_dir=sys.argv[2])", spec, cache_dir], a.timeout, env)
    ing.pop("_stdout")
    ing["cache_hit"] = had_cache
    rec["ingest"] = ing
    say_step("ingest" + (" (cache hit)" if had_cache else ""), ing)
    if ing.get("error"):
        return rec
    folder = find_cache_folder(cache_dir)
    rec["cache_folder"] = folder
    rec["cache_bytes"] = tree_bytes(folder)

    # 2. the whole gnnpar-partition command from the cache
    import shlex
    cmd = [sys.executable, "-m", "gnnpar.cli.partition_cli", "--dataset", f"cache:{folder}",
           "--parts", str(a.parts), "--method", a.method, "--seed", str(a.seed), "--json"]
    if shard_dir:
        cmd += ["--out", shard_dir]
    if a.report:
        cmd += ["--report"]
    cmd += shlex.split(a.extra_args)
    pipe = measure(cmd, a.timeout, env)
    pipe.update(cli_fields(last_json(pipe.pop("_stdout"))))
    rec["pipeline"] = pipe
    say_step("pipeline (total)", pipe)
    for k in list(PHASES) + [k for k in pipe["phases"] if k not in PHASES]:
        print(f"    phase {k:<20} {fmt_s(pipe['phases'][k])}  {fmt_load(pipe)}", flush=True)
    print(f"    peak_rss_bytes (self)      {fmt_gb(pipe['peak_rss_bytes'])}  {fmt_load(pipe)}", flush=True)
    print(f"    partition_call_s           {fmt_s(pipe['partition_call_s'])}  {fmt_load(pipe)}", flush=True)
    if pipe["partition_s"] is not None:
        print(f"    partition_s (report)       {fmt_s(pipe['partition_s'])}  {fmt_load(pipe)}", flush=True)
    rec["shard_bytes"] = tree_bytes(shard_dir) if shard_dir else None
    if shard_dir and a.drop_shards and os.path.isdir(shard_dir):
        import shutil
        shutil.rmtree(shard_dir)
        rec["shards_dropped"] = True

    # 3. the partitioner libraries' own calls, one child process each
    for method in ("kaminpar", "metis"):
        key = f"{method}_call"
        if method == "metis" and scale > a.skip_metis_above:
            rec[key] = {"skipped": f"scale {scale} > --skip-metis-above {a.skip_metis_above}"}
            say_step(f"{method} call", rec[key])
            continue
        r = measure([sys.executable, os.path.abspath(__file__), "--child", "call", "--method", method,
                     "--dir", folder, "--parts", str(a.parts), "--seed", str(a.seed),
                     "--threads", str(a.threads)], a.timeout, env)
        out = last_json(r.pop("_stdout")) or {}
        r.update({k: out.get(k) for k in ("call_s", "load_s", "threads", "vmhwm_bytes", "n", "m")})
        rec[key] = r
        thr = f" ({r['threads']} threads)" if r.get("threads") else ""
        say_step(f"{method} call{thr}", r, f"  call {fmt_s(num(r.get('call_s')))}")

    # figures
    print(f"  cache on disk {fmt_gb(rec['cache_bytes'])}, shards on disk "
          f"{fmt_gb(rec['shard_bytes']) if shard_dir else 'none written'}", flush=True)
    total = num(pipe.get("wall_s")) if not pipe.get("error") else None
    kcall = num(rec["kaminpar_call"].get("call_s"))
    rec["ratio_total_vs_kaminpar_call"] = total / kcall if total and kcall else None
    peak = num(pipe.get("max_rss_bytes")) if not pipe.get("error") else None
    ratio = rec["ratio_total_vs_kaminpar_call"]
    rec["acceptance"] = {"ratio_ok": None if ratio is None else ratio <= RATIO_LIMIT,
                         "rss_ok": None if peak is None else peak <= RSS_LIMIT}
    print(f"  total / kaminpar call = {NM if ratio is None else f'{ratio:.2f}'} (<= {RATIO_LIMIT}), "
          f"peak RSS {fmt_gb(peak)} (<= {RSS_LIMIT / GB:g} GB){' [acceptance scale]' if scale == 21 else ''}"
          f"  {fmt_load(pipe)}", flush=True)
    return rec


def summary_table(results: list) -> None:
    cols = ["scale", "ingest_s", "total_s", "load_s", "part_s", "shards_s", "report_s", "kmp_s",
            "metis_s", "ratio", "rss_GB", "kmpRSS", "metRSS", "cache_GB", "shard_GB", "load1"]
    print("# " + " ".join(f"{c:>8}" for c in cols), flush=True)

    def f(v, scale=1.0):
        return f"{'-':>8}" if v is None else f"{v / scale:8.2f}"

    for r in results:
        pipe, ph = r.get("pipeline", {}), r.get("pipeline", {}).get("phases", {})
        row = [f"{r['scale']:8d}", f(num(r.get("ingest", {}).get("wall_s"))), f(num(pipe.get("wall_s"))),
               f(ph.get("load")), f(ph.get("partition")), f(ph.get("shards")), f(ph.get("report")),
               f(num(r.get("kaminpar_call", {}).get("call_s"))), f(num(r.get("metis_call", {}).get("call_s"))),
               f(r.get("ratio_total_vs_kaminpar_call")), f(num(pipe.get("max_rss_bytes")), GB),
               f(num(r.get("kaminpar_call", {}).get("max_rss_bytes")), GB),
               f(num(r.get("metis_call", {}).get("max_rss_bytes")), GB),
               f(r.get("cache_bytes"), GB), f(r.get("shard_bytes"), GB),
               f((pipe.get("load_before") or [None])[0])]
        print("# " + " ".join(row), flush=True)


def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def plot_pipeline(results: list, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    nan = float("nan")

    def series(get):
        ys = []
        for r in results:
            try:
                v = get(r)
            except (KeyError, TypeError, AttributeError):
                v = None
            ys.append(nan if num(v) is None else v)
        return ys

    xs = [r["scale"] for r in results]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.8))
    times = [("total (gnnpar-partition)", lambda r: r["pipeline"]["wall_s"], "k-o")]
    times += [(f"phase {k}", (lambda k: lambda r: r["pipeline"]["phases"][k])(k), "--.") for k in PHASES]
    times += [("partition call in the command", lambda r: r["pipeline"]["partition_call_s"], "g--+"),
              ("KaMinPar call", lambda r: r["kaminpar_call"]["call_s"], "b-s"),
              ("METIS call", lambda r: r["metis_call"]["call_s"], "r-^"),
              ("ingest (cache build)", lambda r: r["ingest"]["wall_s"], ":x")]
    for label, get, style in times:
        ys = series(get)
        if any(y == y for y in ys):
            ax_t.plot(xs, ys, style, label=label)
    ax_t.set_yscale("log")
    ax_t.set_xlabel("R-MAT scale")
    ax_t.set_ylabel("seconds")
    ax_t.set_title("time")
    ax_t.legend(fontsize=8)
    mems = [("gnnpar-partition (time -v)", lambda r: r["pipeline"]["max_rss_bytes"] / GB, "k-o"),
            ("gnnpar-partition (self)", lambda r: r["pipeline"]["peak_rss_bytes"] / GB, "k--d"),
            ("KaMinPar call process", lambda r: r["kaminpar_call"]["max_rss_bytes"] / GB, "b-s"),
            ("METIS call process", lambda r: r["metis_call"]["max_rss_bytes"] / GB, "r-^"),
            ("ingest", lambda r: r["ingest"]["max_rss_bytes"] / GB, ":x")]
    for label, get, style in mems:
        ys = series(get)
        if any(y == y for y in ys):
            ax_m.plot(xs, ys, style, label=label)
    ax_m.axhline(RSS_LIMIT / GB, color="grey", lw=0.8, ls=":", label="3 GB (scale-21 target)")
    ax_m.set_xlabel("R-MAT scale")
    ax_m.set_ylabel("peak RSS, GB")
    ax_m.set_title("peak RSS")
    ax_m.legend(fontsize=8)
    for ax in (ax_t, ax_m):
        ax.set_xticks(xs)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pipeline(a) -> int:
    import platform
    a.parts = int(a.parts) if a.parts is not None else 16
    a.method = a.method or "kaminpar"
    a.threads = a.threads or os.cpu_count() or 1
    scales = [int(v) for v in a.scales.split(",") if v.strip()]
    work = os.path.abspath(a.work) if a.work else tempfile.mkdtemp(prefix="bench-pipeline-")
    os.makedirs(work, exist_ok=True)
    out_json = os.path.abspath(a.out_json) if a.out_json else None
    plot = os.path.abspath(a.plot) if a.plot else None
    commit = git_commit()
    try:
        import psutil
        mem_total = psutil.virtual_memory().total
    except ImportError:
        mem_total = None
    doc = {"kind": "pipeline_bench", "git": commit, "host": platform.node(), "cpus": os.cpu_count(),
           "mem_total_bytes": mem_total, "python": sys.version.split()[0],
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "time_tool": GNU_TIME if os.access(GNU_TIME, os.X_OK) else "os.wait4",
           "args": {"scales": scales, "ef": a.ef, "parts": a.parts, "method": a.method, "report": a.report,
                    "shards": not a.no_shards, "threads": a.threads, "seed": a.seed,
                    "skip_metis_above": a.skip_metis_above, "extra_args": a.extra_args, "work": work},
           "results": []}
    print(f"# gnnpar-partition pipeline bench at {commit} on {doc['host']} ({doc['cpus']} cpus), work {work}, "
          f"load {loadavg()}", flush=True)
    if doc["time_tool"] != GNU_TIME:
        print(f"# {GNU_TIME} missing (apt-get install time): figures from os.wait4", flush=True)
    env = child_env()
    for scale in scales:
        doc["results"].append(pipeline_scale(a, scale, work, env))
        if out_json:
            write_json(out_json, doc)
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    summary_table(doc["results"])
    if out_json:
        write_json(out_json, doc)
        print(f"# results: {out_json}", flush=True)
    if plot:
        plot_pipeline(doc["results"], plot, f"gnnpar-partition, R-MAT ef={a.ef}, {a.parts} parts, {a.method}"
                      f"{', --report' if a.report else ''}, {doc['cpus']} cpus, {commit}")
        print(f"# plot: {plot}", flush=True)
    failed = [r["scale"] for r in doc["results"]
              if any(isinstance(r.get(k), dict) and r[k].get("error") for k in ("ingest", "pipeline"))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
