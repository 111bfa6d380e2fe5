"""OGB folders through the real command: ``python -m gnnpar.cli.partition_cli --dataset ogb:DIR
--cache-dir C ...`` in a subprocess.

A damaged ``raw/edge.csv.gz`` (truncated; a line with one column; a node id out of range)
exits 2 with one line on stderr naming the file (and the line), and leaves nothing in ``C``:
no folder :func:`load_cache` accepts, no temporary folder. Each damage is tried in a tiny
file (one read block) and in one of 3.5M edges, where the damage lies past the first 16 MiB
block the reader inflates. A good folder, in either layout, gives exit 0 and the graph
the in-memory reader gives; a second run maps the cache: the source is then damaged with its
size and mtime kept (the cache key), so only a cache hit can succeed, and a control run
with a fresh cache folder exits 2. The folders are written by ``scripts/bench_ogb_ingest.py``
(its writer is checked here against :func:`graph_from_arrays`, and the script run once at
a tiny size).
"""
import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from gnnpar.datasets import InputError, graph_from_arrays, load_cache, read_ogb

from .cli_util import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "bench_ogb_ingest.py")
SMALL = dict(edges=3000, nodes=60, feat=4, classes=3, seed=1)
BIG = dict(edges=3_500_000, nodes=100_000, feat=2, classes=3, seed=2)  # ~40 MiB of edge text
BAD_LINE = {"small": 1234, "big": 2_000_000}  # "big": in the second 16 MiB block


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_ogb_ingest_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cli(root, cache):
    return subprocess.run([sys.executable, "-m", "gnnpar.cli.partition_cli", "--dataset", f"ogb:{root}",
                           "--cache-dir", str(cache), "--parts", "2", "--method", "block", "--report",
                           "--quiet"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT, "PYTHONDONTWRITEBYTECODE": "1"})


def _write(bench, root, layout, size):
    writer = bench.write_csv_folder if layout == "csv" else bench.write_npz_folder
    writer(str(root), size["edges"], size["nodes"], size["feat"], size["classes"], size["seed"])
    return str(root)


def _expected(bench, size, directed=False):
    """The graph the bench writer's folder holds, built in memory from its generators."""
    e, n, f = size["edges"], size["nodes"], size["feat"]
    edges = np.concatenate([np.stack([s, d]) for s, d in bench.edge_chunks(e, n, size["seed"])], axis=1)
    x = bench.features_float32(np.concatenate(list(bench.feature_chunks(n, f, size["seed"]))))
    y = np.concatenate(list(bench.label_chunks(n, size["classes"], size["seed"])))
    masks = []
    for part in ("train", "valid", "test"):
        m = np.zeros(n, dtype=bool)
        m[np.concatenate(list(bench.split_chunks(n, part)))] = True
        masks.append(m)
    return graph_from_arrays(edges, x, y, masks, int(y.max()) + 1, directed=directed)


def _edge_file(bench, path, size, bad_line=None, bad_text=None):
    """``edge.csv.gz`` of ``size``'s edges, line ``bad_line`` (1-based) replaced by ``bad_text``."""
    with gzip.open(path, "wb", compresslevel=1) as f:
        line = 1
        for src, dst in bench.edge_chunks(size["edges"], size["nodes"], size["seed"]):
            rows = np.stack([src, dst], axis=1)
            if bad_line is not None and line <= bad_line < line + len(rows):
                k = bad_line - line
                bench.write_text(f, rows[:k])
                f.write(bad_text.encode() + b"\n")
                bench.write_text(f, rows[k + 1:])
            else:
                bench.write_text(f, rows)
            line += len(rows)


def _assert_no_cache(cache):
    entries = sorted(os.listdir(cache)) if os.path.isdir(cache) else []
    for name in entries:
        path = os.path.join(cache, name)
        if os.path.isdir(path):
            with pytest.raises(InputError):
                load_cache(path)
    assert not [e for e in entries if ".tmp-" in e or ".old-" in e], f"temporary folder left: {entries}"
    assert entries == [], entries


def _error_line(res):
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gnnpar-partition: error: "), res.stderr
    return lines[0]


@pytest.mark.parametrize("where", ["small", "big"])
@pytest.mark.parametrize("what", ["truncated", "short_line", "out_of_range"])
def test_a_damaged_edge_file_exits_2_naming_it_and_leaves_no_cache(tmp_path, bench, what, where):
    size = SMALL if where == "small" else BIG
    root = _write(bench, tmp_path / "ogb", "csv", dict(size, edges=1))  # edges written below
    edge_file = os.path.join(root, "raw", "edge.csv.gz")
    n, line = size["nodes"], BAD_LINE[where]
    if what == "truncated":
        _edge_file(bench, edge_file, size)
        with open(edge_file, "rb") as f:
            data = f.read()
        with open(edge_file, "wb") as f:
            f.write(data[:len(data) // 2])
        msg = rf"cannot decompress {re.escape(edge_file)} \(after line ([0-9,]+)\)"
    elif what == "short_line":
        _edge_file(bench, edge_file, size, line, "17")
        msg = (rf"{re.escape(edge_file)} line {line}: expected 2 comma-separated int64 value\(s\), "
               rf"got '17'")
    else:
        _edge_file(bench, edge_file, size, line, f"3,{n}")
        msg = rf"{re.escape(edge_file)} line {line}: edge endpoint {n} is out of range \[0, {n}\)"
    cache = tmp_path / "cache"
    res = _cli(root, cache)
    assert res.returncode == 2, res.stdout + res.stderr
    found = re.search(msg, _error_line(res))
    assert found, res.stderr
    if what == "truncated" and where == "big":
        # at least one whole block was read before the damage, and no line past the cut is named
        good = int(found.group(1).replace(",", ""))
        assert 0 < good < size["edges"] // 2 + 1, res.stderr
    _assert_no_cache(cache)


def _damage_keeping_stamp(path):
    """Zero the first bytes of ``path``, keeping its size and mtime (what the cache key sees)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(b"\0" * 64)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size


@pytest.mark.parametrize("layout", ["csv", "npz"])
def test_a_good_folder_builds_the_cache_then_hits_it(tmp_path, bench, layout):
    root = _write(bench, tmp_path / "ogb", layout, SMALL)
    want = _expected(bench, SMALL)
    assert read_ogb(root).fingerprint() == want.fingerprint()
    cache = tmp_path / "cache"
    first = _cli(root, cache)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "peak resident memory" in first.stdout
    (entry,) = os.listdir(cache)
    folder = cache / entry
    g = load_cache(str(folder), verify=True)
    assert g.fingerprint() == want.fingerprint() and g.meta["split"] == "bench"
    inode, meta_mtime = os.stat(folder).st_ino, os.stat(folder / "meta.json").st_mtime_ns

    source = os.path.join(root, "raw", "edge.csv.gz" if layout == "csv" else "data.npz")
    _damage_keeping_stamp(source)
    second = _cli(root, cache)  # only the cache can give the graph now
    assert second.returncode == 0, second.stdout + second.stderr
    assert os.listdir(cache) == [entry]
    assert os.stat(folder).st_ino == inode and os.stat(folder / "meta.json").st_mtime_ns == meta_mtime
    assert load_cache(str(folder), verify=True).fingerprint() == want.fingerprint()

    control = _cli(root, tmp_path / "fresh")  # the damage is seen when the files are read
    assert control.returncode == 2 and source in _error_line(control), control.stderr
    _assert_no_cache(tmp_path / "fresh")


def test_the_bench_script_at_a_tiny_size(tmp_path, bench):
    out = tmp_path / "r.json"
    res = subprocess.run([sys.executable, SCRIPT, "--edges", "5000", "--nodes", "200", "--feat", "3",
                          "--layout", "both", "--work", str(tmp_path / "w"), "--out-json", str(out)],
                         capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads(out.read_text())
    assert re.fullmatch(r"[0-9a-f]{4,}(\+dirty)?|unknown", rec["commit"]) and rec["commit"] in res.stdout
    assert [r["layout"] for r in rec["results"]] == ["csv", "npz"]
    entries = {r["stored_entries"] for r in rec["results"]}
    assert len(entries) == 1 and 0 < entries.pop() <= 2 * 5000  # the same graph in both layouts
    for r in rec["results"]:
        assert r["rc"] == 0 and not r.get("error"), r
        assert r["edges"] == 5000 and r["input_bytes"] > 0 and r["cache_bytes"] > 0
        assert r["wall_s"] > 0 and r["max_rss_bytes"] > 0
        assert r["rss_per_edge"] == pytest.approx(r["max_rss_bytes"] / 5000)
        assert len(r["load_before"]) == 3 and len(r["load_after"]) == 3
    assert sorted(os.listdir(tmp_path / "w")) == []  # without --keep: inputs and caches removed
