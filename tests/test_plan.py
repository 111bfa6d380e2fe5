"""gnnpar-plan and --algo auto: ranked tables at any scale, memory caps, byte sizes."""
import json
import subprocess
import sys

import pytest

from gnnpar.datasets import InputError
from gnnpar.plan_cli import main, parse_bytes


def test_parse_bytes():
    assert parse_bytes("80GB") == 80e9 and parse_bytes("2GiB") == 2 * 2 ** 30
    assert parse_bytes("1e6") == 1e6
    with pytest.raises(InputError, match="byte size"):
        parse_bytes("lots")


def test_papers100m_scale_ranks_every_algorithm(capsys):
    assert main(["--nodes", "111059956", "--edges", "1615685872", "--features", "128",
                 "--classes", "172", "--world", "1024", "--mem-cap", "80GB", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["algo"] for r in rows} >= {"1d", "1d-halo", "1.5d", "2d", "3d"}
    fits = [r for r in rows if r["fits"]]
    assert fits and fits == rows[:len(fits)]
    assert [r["time_s"] for r in fits] == sorted(r["time_s"] for r in fits)
    assert all(r["memory"] <= 80e9 for r in fits)


def test_tight_cap_marks_rows_and_auto_refuses():
    assert main(["--nodes", "1000000", "--edges", "30000000", "--world", "4",
                 "--mem-cap", "1MB", "--json"]) == 0
    r = subprocess.run([sys.executable, "-m", "gnnpar.train", "--algo", "auto", "--nprocs", "2",
                        "--mem-cap", "1KB", "--quiet"], capture_output=True, text=True)
    assert r.returncode == 2 and "no algorithm fits" in r.stderr


def test_auto_picks_and_trains(tmp_path):
    log = tmp_path / "log.jsonl"
    r = subprocess.run([sys.executable, "-m", "gnnpar.train", "--algo", "auto", "--nprocs", "2",
                        "--epochs", "2", "--log-json", str(log)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "--algo auto chose" in r.stderr
    final = json.loads(log.read_text().splitlines()[-1])
    assert final["algo"] in ("1d", "1d-halo", "1.5d", "2d", "3d") and final["world_size"] == 2
