"""Bounded-memory OGB ingestion: peak RSS and wall time of building the binary cache from an
OGB node-property folder, in both raw layouts.

    python scripts/bench_ogb_ingest.py --work /scratch/ogb-bench            # 50M edges, 2M nodes, 32 features
    python scripts/bench_ogb_ingest.py --edges 2000000 --nodes 200000 --feat 16 --layout both \
        --work /tmp/ogb-bench --out-json ogb-ingest.json

1. *Write* a synthetic OGB folder per layout under ``--work`` (``WORK/ogb-csv``,
   ``WORK/ogb-npz``), itself in bounded memory: ``--edges`` uniformly random directed edges
   over ``--nodes`` nodes (self loops and repeats as they fall), ``--feat`` standard normal
   features with 6 decimals, ``--classes`` random labels, and one split ``split/bench`` (node
   ``i`` goes to train when ``i % 10 < 6``, valid when ``< 8``, else test). Both layouts hold the
   same values: every chunk of edges and of feature rows has its own seeded generator.

   * ``csv``: ``raw/edge.csv.gz`` ("src,dst"), ``raw/node-feat.csv.gz``,
     ``raw/node-label.csv.gz``, ``raw/num-node-list.csv.gz``, gzip level 1 (for speed); the
     text is formatted with numpy, 2**19 values a step (tens of MB of temporaries);
   * ``npz``: ``raw/data.npz`` (``edge_index`` (2, E) int64, ``node_feat`` (N, F) float32,
     ``num_nodes_list``), stored (``--npz-deflate``: deflated, level 1), each member streamed
     into the zip; ``raw/node-label.npz`` (``node_label`` (N, 1) float32);
   * both: ``split/bench/{train,valid,test}.csv.gz``.

   A folder written before with the same parameters (``WORK/ogb-LAYOUT.params.json``; kept
   with ``--keep``) is reused.

2. *Ingest*, per layout, in a separate child process and alone::

       python -c "from gnnpar.datasets import load_dataset; load_dataset('ogb:DIR', cache_dir=C)"

   cold: ``C`` is a fresh folder each time (deleted after, unless ``--keep``). The child runs
   under ``/usr/bin/time -v`` (``apt-get install time``; without it ``os.wait4`` gives the same
   rusage): wall time = "Elapsed (wall clock)", peak RSS = "Maximum resident set size". The peak
   RSS of ``python -c "import gnnpar.datasets"`` is measured once too (``import_rss``): what
   every child holds before reading a byte.

Printed per layout: input bytes (the folder's files), edges (lines of the edge file / columns
of ``edge_index``), stored CSR entries (both directions, repeats merged: from the cache's
meta.json), wall time, peak RSS, cache bytes, peak RSS per edge and (peak RSS - import RSS)
per edge; beside them the 1/5/15-minute load averages before and after (a busy machine makes
times worthless) and the git commit (``+dirty`` when ``git status --porcelain`` lists
changes). ``--out-json F`` writes the whole record. Exit status 1 when an ingestion failed.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timev, beside this script

import timev  # noqa: E402
from timev import GNU_TIME, loadavg  # noqa: E402

EDGE_CHUNK = 1 << 20  # edges per generator chunk (fixed: the graph does not depend on it elsewhere)
TOKENS = 1 << 21  # feature values per chunk of rows
NODE_CHUNK = 1 << 21  # labels / split ids per chunk
RENDER = 1 << 19  # values rendered as text per step (~25 bytes of temporaries each)
FRAC_DIGITS = 6
SPLIT = "bench"
MiB = float(1 << 20)


# ---------------------------------------------------------------- text in numpy
def _ndigits(v: np.ndarray) -> np.ndarray:
    """Decimal digits of non-negative integers (0 has one)."""
    n = np.ones(v.shape, dtype=np.int64)
    t = v // 10
    while t.any():
        n += t > 0
        t //= 10
    return n


def render_csv(ipart: np.ndarray, ncols: int, neg: np.ndarray = None, frac: np.ndarray = None,
               fdigits: int = 0) -> bytes:
    """Rows of comma-separated numbers as bytes, built with numpy alone (no per-value Python).

    The values are flat, row-major, ``ncols`` a row: value ``k`` is ``-`` if ``neg[k]``, then
    ``ipart[k]`` (a non-negative integer), then, with ``frac``, a point and ``frac[k]`` as
    ``fdigits`` digits."""
    ipart = np.asarray(ipart, dtype=np.int64).ravel()
    count = ipart.size
    if count == 0:
        return b""
    nd = _ndigits(ipart)
    sign = np.zeros(count, dtype=np.int64) if neg is None else np.asarray(neg, dtype=np.int64).ravel()
    tail = fdigits + 1 if frac is not None else 0
    length = sign + nd + tail + 1  # the separator or newline after each value
    end = np.cumsum(length)
    start = end - length
    buf = np.empty(int(end[-1]) + 1, dtype=np.uint8)  # the last byte takes writes of no digit
    trash = buf.size - 1
    buf[start[sign > 0]] = ord("-")
    first = start + sign
    low = ipart.copy()
    for k in range(int(nd.max())):
        buf[np.where(nd > k, first + nd - 1 - k, trash)] = (low % 10 + 48).astype(np.uint8)
        low //= 10
    if frac is not None:
        point = first + nd
        buf[point] = ord(".")
        low = np.asarray(frac, dtype=np.int64).ravel().copy()
        for k in range(fdigits):
            buf[point + fdigits - k] = (low % 10 + 48).astype(np.uint8)
            low //= 10
    sep = np.full(count, ord(","), dtype=np.uint8)
    sep[ncols - 1::ncols] = ord("\n")
    buf[end - 1] = sep
    return buf[:-1].tobytes()


def render_decimals(units: np.ndarray, fdigits: int = FRAC_DIGITS) -> bytes:
    """``units`` / 10**fdigits, a row each ``units.shape[1]`` values, as CSV text."""
    units = np.asarray(units, dtype=np.int64)
    ncols = units.shape[1] if units.ndim == 2 else 1
    mag = np.abs(units)
    scale = 10 ** fdigits
    return render_csv(mag // scale, ncols, neg=units < 0, frac=mag % scale, fdigits=fdigits)


# ---------------------------------------------------------------- the synthetic graph
def edge_chunks(edges: int, nodes: int, seed: int):
    """(src, dst) int64 chunks of the graph's edges, each chunk from its own generator."""
    for c, first in enumerate(range(0, edges, EDGE_CHUNK)):
        k = min(EDGE_CHUNK, edges - first)
        rng = np.random.default_rng([seed, 1, c])
        yield rng.integers(0, nodes, k), rng.integers(0, nodes, k)


def feature_chunks(nodes: int, feat: int, seed: int):
    """Feature rows in units of 10**-FRAC_DIGITS (int64), a chunk of rows at a time."""
    rows = max(1, TOKENS // max(feat, 1))
    for c, first in enumerate(range(0, nodes, rows)):
        k = min(rows, nodes - first)
        rng = np.random.default_rng([seed, 2, c])
        yield np.rint(rng.standard_normal((k, feat)) * 10 ** FRAC_DIGITS).astype(np.int64)


def features_float32(units: np.ndarray) -> np.ndarray:
    """What the CSV text of ``units`` parses to."""
    return (units / float(10 ** FRAC_DIGITS)).astype(np.float32)


def label_chunks(nodes: int, classes: int, seed: int):
    for c, first in enumerate(range(0, nodes, NODE_CHUNK)):
        k = min(NODE_CHUNK, nodes - first)
        yield np.random.default_rng([seed, 3, c]).integers(0, classes, k)


def split_chunks(nodes: int, part: str):
    """Node ids of one split part, ascending, a chunk at a time: i % 10 < 6 train, < 8 valid."""
    lo, hi = {"train": (0, 6), "valid": (6, 8), "test": (8, 10)}[part]
    for first in range(0, nodes, NODE_CHUNK):
        ids = np.arange(first, min(nodes, first + NODE_CHUNK), dtype=np.int64)
        r = ids % 10
        yield ids[(r >= lo) & (r < hi)]


def write_text(f, values: np.ndarray, decimals: bool = False) -> None:
    """Rows of ``values`` (2-D; units of 10**-FRAC_DIGITS when ``decimals``) to ``f`` as CSV,
    at most :data:`RENDER` values per step."""
    values = values.reshape(len(values), -1)
    step = max(1, RENDER // values.shape[1])
    for first in range(0, len(values), step):
        rows = values[first:first + step]
        f.write(render_decimals(rows) if decimals else render_csv(rows, values.shape[1]))


def _gz(path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return gzip.open(path, "wb", compresslevel=1)


def write_splits(root: str, nodes: int) -> None:
    for part in ("train", "valid", "test"):
        with _gz(os.path.join(root, "split", SPLIT, f"{part}.csv.gz")) as f:
            for ids in split_chunks(nodes, part):
                write_text(f, ids)


def write_csv_folder(root: str, edges: int, nodes: int, feat: int, classes: int, seed: int) -> None:
    """The CSV layout of the synthetic graph."""
    raw = os.path.join(root, "raw")
    with _gz(os.path.join(raw, "edge.csv.gz")) as f:
        for src, dst in edge_chunks(edges, nodes, seed):
            write_text(f, np.stack([src, dst], axis=1))
    with _gz(os.path.join(raw, "node-feat.csv.gz")) as f:
        for units in feature_chunks(nodes, feat, seed):
            write_text(f, units, decimals=True)
    with _gz(os.path.join(raw, "node-label.csv.gz")) as f:
        for y in label_chunks(nodes, classes, seed):
            write_text(f, y)
    with _gz(os.path.join(raw, "num-node-list.csv.gz")) as f:
        write_text(f, np.array([nodes]))
    write_splits(root, nodes)


class NpzStream:
    """An ``.npz`` written member by member, each member's data appended in pieces (np.savez
    needs every array whole)."""

    def __init__(self, path: str, deflate: bool = False):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        kw = {"compression": zipfile.ZIP_DEFLATED, "compresslevel": 1} if deflate else \
            {"compression": zipfile.ZIP_STORED}
        self.zf = zipfile.ZipFile(path, "w", allowZip64=True, **kw)

    def member(self, key: str, dtype, shape, pieces) -> None:
        dtype = np.dtype(dtype)
        want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        done = 0
        with self.zf.open(f"{key}.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                    "shape": tuple(int(s) for s in shape)})
            for piece in pieces:
                piece = np.ascontiguousarray(piece, dtype=dtype)
                f.write(memoryview(piece).cast("B"))
                done += piece.nbytes
        if done != want:
            raise AssertionError(f"{key}: wrote {done} bytes, the shape needs {want}")

    def close(self) -> None:
        self.zf.close()


def write_npz_folder(root: str, edges: int, nodes: int, feat: int, classes: int, seed: int,
                     deflate: bool = False) -> None:
    """The binary layout (ogbn-papers100M's) of the same graph."""
    raw = os.path.join(root, "raw")

    def edge_rows():  # (2, E) in C order: every source, then every destination (drawn twice)
        for src, _ in edge_chunks(edges, nodes, seed):
            yield src
        for _, dst in edge_chunks(edges, nodes, seed):
            yield dst

    z = NpzStream(os.path.join(raw, "data.npz"), deflate)
    try:
        z.member("edge_index", np.int64, (2, edges), edge_rows())
        z.member("node_feat", np.float32, (nodes, feat),
                 (features_float32(u) for u in feature_chunks(nodes, feat, seed)))
        z.member("num_nodes_list", np.int64, (1,), [np.array([nodes])])
    finally:
        z.close()
    z = NpzStream(os.path.join(raw, "node-label.npz"), deflate)
    try:
        z.member("node_label", np.float32, (nodes, 1),
                 (y.astype(np.float32)[:, None] for y in label_chunks(nodes, classes, seed)))
    finally:
        z.close()
    write_splits(root, nodes)


WRITERS = {"csv": write_csv_folder, "npz": write_npz_folder}


def prepare(work: str, layout: str, params: dict) -> tuple:
    """The OGB folder of ``layout`` under ``work`` (reused when written with ``params``
    before); returns (folder, seconds spent writing, reused)."""
    root = os.path.join(work, f"ogb-{layout}")
    stamp = os.path.join(work, f"ogb-{layout}.params.json")
    if os.path.isdir(root) and os.path.isfile(stamp):
        try:
            with open(stamp, encoding="utf-8") as f:
                if json.load(f) == params:
                    return root, 0.0, True
        except (OSError, ValueError):
            pass
    for path in (stamp, root):
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    t0 = time.perf_counter()
    kw = {"deflate": params["npz_deflate"]} if layout == "npz" else {}
    WRITERS[layout](root, params["edges"], params["nodes"], params["feat"], params["classes"],
                    params["seed"], **kw)
    took = time.perf_counter() - t0
    with open(stamp, "w", encoding="utf-8") as f:
        json.dump(params, f)
    return root, took, False


# ---------------------------------------------------------------- measuring a child
def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def measure(code: str, timeout: float) -> dict:
    """``python -c code`` alone, from the checkout, under ``/usr/bin/time -v`` (or
    ``os.wait4`` without it; :func:`timev.measure`): wall time, peak RSS, CPU times, exit
    status, load averages before and after, stderr tail. The child's stdout, the CPU share
    and the parent's wall clock are left out, so the record keeps this script's fields."""
    rec = timev.measure([sys.executable, "-c", code], timeout, env=child_env(), cwd=ROOT,
                        gnu_time=GNU_TIME)
    for key in ("cpu_percent", "wall_s_outer", "_stdout"):
        rec.pop(key, None)
    return rec


def tree_bytes(path: str) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(top, name)
            if not os.path.islink(full):
                total += os.lstat(full).st_size
    return total


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        if head.returncode != 0:
            return "unknown"
        st = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
        return head.stdout.strip() + ("+dirty" if st.returncode != 0 or st.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def stored_entries(cache: str):
    """The CSR entries of the one cache folder under ``cache`` (its meta.json), or None."""
    for name in sorted(os.listdir(cache)) if os.path.isdir(cache) else []:
        try:
            with open(os.path.join(cache, name, "meta.json"), encoding="utf-8") as f:
                return int(json.load(f)["arrays"]["indices"]["shape"][0])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
    return None


def ingest(layout: str, root: str, work: str, edges: int, import_rss, timeout: float,
           keep: bool) -> dict:
    """One cold ``load_dataset('ogb:ROOT', cache_dir=fresh folder)`` in a child, measured."""
    cache = tempfile.mkdtemp(prefix=f"cache-{layout}-", dir=work)
    code = (f"from gnnpar.datasets import load_dataset; "
            f"load_dataset({'ogb:' + root!r}, cache_dir={cache!r})")
    rec = {"layout": layout, "folder": root, "cache_dir": cache,
           "input_bytes": tree_bytes(root), "edges": edges}
    rec.update(measure(code, timeout))
    rec["cache_bytes"] = tree_bytes(cache)
    rec["stored_entries"] = stored_entries(cache)
    rss = rec.get("max_rss_bytes")
    rec["rss_per_edge"] = rss / edges if rss and edges else None
    rec["rss_above_import_per_edge"] = (rss - import_rss) / edges if rss and import_rss and edges else None
    if not keep:
        shutil.rmtree(cache, ignore_errors=True)
    return rec


def _mib(v) -> str:
    return "-" if v is None else f"{v / MiB:,.1f} MiB"


def format_row(r: dict) -> str:
    per = "-" if r.get("rss_per_edge") is None else f"{r['rss_per_edge']:.1f} B"
    above = "-" if r.get("rss_above_import_per_edge") is None else f"{r['rss_above_import_per_edge']:.1f} B"
    entries = "-" if r.get("stored_entries") is None else f"{r['stored_entries']:,}"
    return (f"{r['layout']:<5} {_mib(r['input_bytes']):>13} {r['edges']:>14,} {entries:>14} "
            f"{r['wall_s']:>8.1f} s {_mib(r.get('max_rss_bytes')):>13} {_mib(r['cache_bytes']):>13} "
            f"{per:>9} {above:>10}   load {r['load_before']} -> {r['load_after']}")


HEADER = (f"{'layout':<5} {'input':>13} {'edges':>14} {'stored':>14} {'wall':>10} {'peak RSS':>13} "
          f"{'cache':>13} {'RSS/edge':>9} {'above imp':>10}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--edges", type=int, default=50_000_000,
                   help="directed edges in the file (default: 50,000,000)")
    p.add_argument("--nodes", type=int, default=2_000_000, help="nodes (default: 2,000,000)")
    p.add_argument("--feat", type=int, default=32, help="features a node (default: 32)")
    p.add_argument("--classes", type=int, default=40, help="label classes (default: 40)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic graph (default: 0)")
    p.add_argument("--layout", choices=("csv", "npz", "both"), default="both",
                   help="raw layout(s) to write and ingest (default: both)")
    p.add_argument("--npz-deflate", action="store_true",
                   help="deflate (level 1) the npz members instead of storing them")
    p.add_argument("--work", required=True, metavar="DIR",
                   help="folder for the OGB folders and the caches (created; needs room for both)")
    p.add_argument("--keep", action="store_true",
                   help="keep the OGB folders (reused by a later run with the same sizes) and the caches")
    p.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per ingestion (default: 6 h)")
    p.add_argument("--out-json", default=None, metavar="F", help="write the record as JSON to F")
    args = p.parse_args(argv)
    if args.nodes < 10 or args.edges < 1 or args.feat < 1 or args.classes < 1:
        p.error("need --nodes >= 10 (every split part non-empty), --edges, --feat, --classes >= 1")
    if args.nodes >= 1 << 32:
        p.error("--nodes must be below 2**32")
    layouts = ("csv", "npz") if args.layout == "both" else (args.layout,)
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    params = {"edges": args.edges, "nodes": args.nodes, "feat": args.feat, "classes": args.classes,
              "seed": args.seed, "npz_deflate": bool(args.npz_deflate)}
    commit = git_commit()
    record = {"commit": commit, "params": params, "layouts": list(layouts),
              "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                          "python": platform.python_version()},
              "gnu_time": os.access(GNU_TIME, os.X_OK), "results": []}
    print(f"commit {commit}; {args.edges:,} edges, {args.nodes:,} nodes, {args.feat} features; "
          f"load average {loadavg()}; free disk under {work}: {_mib(shutil.disk_usage(work).free)}",
          flush=True)
    folders = {}
    for layout in layouts:
        root, took, reused = prepare(work, layout, params)
        folders[layout] = root
        record.setdefault("write_s", {})[layout] = round(took, 2)
        print(f"{layout}: {'reused' if reused else f'wrote in {took:.1f} s'} {root} "
              f"({_mib(tree_bytes(root))})", flush=True)
    record["writer_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    imp = measure("import gnnpar.datasets", 600)
    import_rss = imp.get("max_rss_bytes") if imp["rc"] == 0 else None
    record["import_rss_bytes"] = import_rss
    print(f"peak RSS of the writer (this process) {_mib(record['writer_peak_rss_bytes'])}; "
          f"of a child that only imports gnnpar.datasets {_mib(import_rss)}", flush=True)
    failed = False
    print(HEADER, flush=True)
    for layout in layouts:
        rec = ingest(layout, folders[layout], work, args.edges, import_rss, args.timeout, args.keep)
        record["results"].append(rec)
        print(format_row(rec), flush=True)
        if rec.get("error"):
            failed = True
            print(f"  FAILED: {rec['error']}", flush=True)
            for line in rec.get("stderr_tail", [])[-5:]:
                print(f"    {line}", flush=True)
        if args.out_json:
            with open(args.out_json, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)
    print(f"commit {commit}; load average at the end {loadavg()}; RSS/edge = peak RSS / edges "
          f"in the file; 'above imp' subtracts the import-only RSS", flush=True)
    if not args.keep:
        for layout in layouts:
            shutil.rmtree(folders[layout], ignore_errors=True)
            stamp = os.path.join(work, f"ogb-{layout}.params.json")
            if os.path.exists(stamp):
                os.remove(stamp)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
