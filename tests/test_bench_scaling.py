"""scripts/bench_scaling.py end to end on a tiny graph: the sweep's runs, its JSON lines and
table, speedups against the one-rank baseline, and the cost model's prediction per run."""
import json
import subprocess
import sys

import pytest

from gnnpar.cli.calibrate import save

from .cli_util import ROOT

RATES = {"bandwidth": 1e8, "latency": 1e-4, "spmm_rate": 1e9, "dense_rate": 1e10,
         "elementwise_rate": 1e8}


def test_sweep_runs_and_predicts(tmp_path):
    cal = tmp_path / "rates.json"
    save(RATES, str(cal))
    out = tmp_path / "runs.jsonl"
    res = subprocess.run([sys.executable, "scripts/bench_scaling.py", "--scale", "8", "--ef", "4",
                          "--hidden", "8", "--layers", "2", "--epochs", "3", "--worlds", "1,2",
                          "--algos", "1d-halo", "--cores", "1", "--partitioner", "random",
                          "--calibration", str(cal), "--plot", "", "--json-out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["run"], r["world_size"], r["threads"]) for r in rows] == [
        ("1 rank x 1 thread", 1, 1), ("1d-halo", 2, 1)]
    base = rows[0]
    assert base["speedup_1x1"] == 1.0 and base["bytes_max_rank"] == 0
    for r in rows:
        assert r["epoch_s"] > 0 and 0 <= r["comm_share"] <= 1
        assert r["speedup_1x1"] == base["epoch_s"] / r["epoch_s"]
        assert r["predicted_s"] == pytest.approx(
            r["predicted_compute_s"] + r["predicted_comm_s"] + r["predicted_fixed_s"])
        assert r["predicted_fixed_s"] > 0  # the machine's default fixed costs
        assert r["predicted_over_measured"] == pytest.approx(r["predicted_s"] / r["epoch_s"])
    two = rows[1:]
    assert all(r["bytes_max_rank"] > 0 and r["predicted_comm_s"] > 0 for r in two)
    # the model's bytes are the run's: same partition, layout and seed
    assert all(r["predicted_bytes_max_rank"] == r["bytes_max_rank"] for r in rows)
    assert "pred/med" in res.stdout and "1d-halo" in res.stdout
    assert "of the measured epoch: " in res.stdout and "of 2 runs" in res.stdout
