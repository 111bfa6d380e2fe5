"""scripts/bench_partition.py --pipeline end to end on tiny R-MAT graphs: one JSON entry per
scale with wall time and peak RSS of every step, disk sizes, the ratio to KaMinPar's own call,
and the plot; plus the /usr/bin/time parser, the os.wait4 fallback and the tolerant reading of
gnnpar-partition's --json fields (phases, peak_rss_bytes, partition_call_s may be absent)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from .cli_util import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "bench_partition.py")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_partition_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _number_or_none(v):
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)


def _run(tmp_path, *args):
    res = subprocess.run([sys.executable, SCRIPT, "--pipeline", *args], cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def _check_step(m, step):
    assert m["rc"] == 0 and not m.get("error"), (step, m)
    assert m["wall_s"] > 0 and m["max_rss_bytes"] > 0, (step, m)
    assert len(m["load_before"]) == 3 and len(m["load_after"]) == 3


def _check_pipeline(pipe, r):
    assert "cache:" + r["cache_folder"] in pipe["command"] and "--report" in pipe["command"]
    assert pipe["json_printed"]
    # the --json fields of gnnpar-partition: numbers when printed, None ("not measured") when not
    assert set(pipe["phases"]) >= {"load", "partition", "shards", "report"}
    assert all(_number_or_none(v) for v in pipe["phases"].values())
    for k in ("peak_rss_bytes", "partition_call_s", "partition_s"):
        assert _number_or_none(pipe[k]), (k, pipe[k])


def test_pipeline(tmp_path):
    """Two scales, no shards (quick): every step measured, METIS skipped above 8, the plot."""
    pytest.importorskip("kaminpar")
    pytest.importorskip("pymetis")
    pytest.importorskip("matplotlib")
    out, png, work = tmp_path / "pipe.json", tmp_path / "pipe.png", tmp_path / "work"
    res = _run(tmp_path, "--scales", "8,9", "--parts", "2", "--method", "kaminpar", "--report",
               "--no-shards", "--skip-metis-above", "8", "--work", str(work),
               "--out-json", str(out), "--plot", str(png))
    doc = json.loads(out.read_text())
    assert doc["kind"] == "pipeline_bench" and doc["git"] and doc["cpus"] >= 1
    assert doc["args"]["parts"] == 2 and doc["args"]["method"] == "kaminpar"
    assert [r["scale"] for r in doc["results"]] == [8, 9]
    for r in doc["results"]:
        assert r["spec"] == f"rmat:scale={r['scale']},ef=16"
        for step in ("ingest", "pipeline", "kaminpar_call"):
            _check_step(r[step], step)
        assert r["ingest"]["cache_hit"] is False
        assert os.path.isfile(os.path.join(r["cache_folder"], "meta.json"))
        assert r["cache_bytes"] > 0 and r["shard_bytes"] is None
        pipe = r["pipeline"]
        _check_pipeline(pipe, r)
        assert "--out" not in pipe["command"] and "kaminpar" in pipe["command"]
        kc = r["kaminpar_call"]
        assert kc["call_s"] > 0 and kc["threads"] == os.cpu_count()
        assert r["ratio_total_vs_kaminpar_call"] == pytest.approx(pipe["wall_s"] / kc["call_s"])
        assert r["acceptance"]["rss_ok"] is True
    mc8, mc9 = (r["metis_call"] for r in doc["results"])
    _check_step(mc8, "metis_call")
    assert mc8["call_s"] > 0 and mc8["threads"] is None
    assert "skipped" in mc9  # scale 9 > --skip-metis-above 8
    assert png.stat().st_size > 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "total / kaminpar call" in res.stdout and "not measured" in res.stdout


@pytest.mark.slow  # writing shards costs 5-15 s on a 2-core machine (the shard kernels compile)
def test_pipeline_shards(tmp_path):
    pytest.importorskip("kaminpar")
    out, work = tmp_path / "pipe.json", tmp_path / "work"
    _run(tmp_path, "--scales", "8", "--parts", "2", "--method", "kaminpar", "--report",
         "--skip-metis-above", "0", "--work", str(work), "--out-json", str(out))
    (r,) = json.loads(out.read_text())["results"]
    for step in ("ingest", "pipeline", "kaminpar_call"):
        _check_step(r[step], step)
    pipe = r["pipeline"]
    _check_pipeline(pipe, r)
    assert pipe["command"][pipe["command"].index("--out") + 1] == r["shard_dir"]
    assert r["shard_bytes"] > 0 and os.path.isfile(os.path.join(r["shard_dir"], "meta.json"))
    assert r["ingest"]["cache_hit"] is False
    # again from the same cache, METIS this time, --drop-shards: measured, then removed
    _run(tmp_path, "--scales", "8", "--parts", "2", "--method", "metis", "--report", "--drop-shards",
         "--skip-metis-above", "0", "--work", str(work), "--out-json", str(out))
    (r2,) = json.loads(out.read_text())["results"]
    assert r2["ingest"]["cache_hit"] is True and r2["cache_folder"] == r["cache_folder"]
    assert "metis" in r2["pipeline"]["command"]
    _check_step(r2["pipeline"], "pipeline")
    assert r2["shard_bytes"] > 0 and r2["shards_dropped"] and not os.path.exists(r2["shard_dir"])


def test_pipeline_refusals():
    for extra, msg in ((["--no-shards"], "--no-shards needs --report"),
                       (["--json-out", "x.jsonl"], "use --out-json")):
        res = subprocess.run([sys.executable, SCRIPT, "--pipeline", *extra], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and msg in res.stderr


def test_cli_fields_tolerant():
    b = _bench()
    empty = b.cli_fields(None)
    assert empty["phases"] == {"load": None, "partition": None, "shards": None, "report": None}
    assert empty["peak_rss_bytes"] is None and empty["partition_call_s"] is None
    assert not empty["json_printed"]
    full = b.cli_fields({"phases": {"load": 1.5, "partition": 2, "shards": 0.5, "extra": 0.1},
                         "peak_rss_bytes": 123, "partition_call_s": 1.9, "edge_cut_fraction": 0.2,
                         "halo": [1, 2]})
    assert full["phases"] == {"load": 1.5, "partition": 2, "shards": 0.5, "report": None, "extra": 0.1}
    assert full["peak_rss_bytes"] == 123 and full["partition_call_s"] == 1.9
    assert full["edge_cut_fraction"] == 0.2 and "halo" not in full
    odd = b.cli_fields({"phases": "?", "peak_rss_bytes": True, "partition_call_s": "1"})
    assert odd["peak_rss_bytes"] is None and odd["partition_call_s"] is None
    assert all(v is None for v in odd["phases"].values())


GNU_TIME_V = """\tCommand being timed: "python -c pass"
\tUser time (seconds): 0.32
\tSystem time (seconds): 0.05
\tPercent of CPU this job got: 135%
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.50
\tMaximum resident set size (kbytes): 59952
\tExit status: 3
"""


def test_parse_gnu_time():
    b = _bench()
    got = b.parse_gnu_time(GNU_TIME_V)
    assert got == {"user_s": 0.32, "sys_s": 0.05, "cpu_percent": 135.0,
                   "wall_s": pytest.approx(3723.5), "max_rss_bytes": 59952 * 1024, "exit_status": 3}
    assert b.parse_gnu_time("\tElapsed (wall clock) time (h:mm:ss or m:ss): 0:00.28\n") == {
        "wall_s": pytest.approx(0.28)}
    assert b.parse_gnu_time("garbage\n") == {}


@pytest.mark.parametrize("gnu", [True, False])
def test_measure(tmp_path, gnu):
    b = _bench()
    if gnu and not os.access(b.GNU_TIME, os.X_OK):
        pytest.skip("no /usr/bin/time (apt-get install time)")
    if not gnu:
        b.GNU_TIME = str(tmp_path / "no-such-time")
    # a child that holds ~200 MB: the peak RSS must see it
    code = "import sys; b = bytearray(200 << 20); print('{\"x\": 1}'); sys.exit(3)"
    m = b.measure([sys.executable, "-c", code], timeout=60)
    assert m["rss_source"] == ("gnu-time" if gnu else "wait4")
    assert m["rc"] == 3 and m["error"] and not m["timed_out"]
    assert m["max_rss_bytes"] > 200 << 20 and m["wall_s"] > 0
    assert b.last_json(m["_stdout"]) == {"x": 1}
    t = b.measure([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert t["timed_out"] and "timed out" in t["error"] and t["wall_s_outer"] < 20


def test_tree_bytes(tmp_path):
    b = _bench()
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_bytes(b"y" * 5)
    os.symlink(tmp_path / "a", tmp_path / "d" / "link")
    assert b.tree_bytes(str(tmp_path)) == 15
    assert b.tree_bytes(str(tmp_path / "missing")) is None
