"""scripts/bench_dgl_step.py (issue 25's bound side by side) without DGL: its plan alternates
DGL's epoch, gnnpar's and the products alone, the order rotating each round, at every thread
count; bad arguments and a missing side venv exit 2 before any work; the products' timing
runs in this interpreter."""
import importlib
import os
import sys

import pytest
import torch

from .cli_util import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
step = importlib.import_module("bench_dgl_step")


def test_the_plan_alternates_the_three_sides_and_needs_no_dgl(tmp_path, capsys):
    assert step.main(["--dry-run", "--venv", str(tmp_path / "none"), "--rounds", "3",
                      "--threads", "2,1", "--gnnpar-flags", "--macrobatch 1"]) == 0
    out = capsys.readouterr().out
    assert "MISSING" in out and "bash scripts/bench_dgl.sh --setup" in out
    lines = [line for line in out.splitlines() if line.startswith("round ")]
    assert len(lines) == 3 * 2 * 3
    runs = [line.split()[:5] for line in lines]  # round R threads T side:
    for r in range(3):
        for i, t in enumerate((2, 1)):
            mine = runs[6 * r + 3 * i: 6 * r + 3 * i + 3]
            assert [(int(x[1]), int(x[3])) for x in mine] == [(r, t)] * 3
            assert [x[4].rstrip(":") for x in mine] == step.order_of(r)
    assert sorted(step.order_of(r)[0] for r in range(3)) == sorted(step.SIDES)
    gnnpar = [line for line in lines if " gnnpar: " in line]
    assert all("gnnpar-train --mode minibatch" in line and "--model sage" in line
               and "--macrobatch 1" in line for line in gnnpar)
    assert {line.split("--threads ")[1].split()[0] for line in gnnpar} == {"1", "2"}
    dgl = [line for line in lines if " dgl: " in line]
    assert all('"measure": "train"' in line and '"batch_size": 1024' in line for line in dgl)
    assert all("load average" in line for line in lines)


@pytest.mark.parametrize("argv,why", [
    (["--epochs", "1"], "--epochs"),
    (["--threads", "0"], "--threads"),
    (["--rounds", "0"], "--rounds"),
    (["--scale", "18"], "--product-layers"),
    (["--fanouts", "10,5"], "--product-layers"),
    (["--product-layers", "1,2,3"], "four positive integers"),
    (["--product-layers", "10,20,8,8"], "1 blocks for 3 layers"),
])
def test_bad_arguments_exit_2(tmp_path, capsys, argv, why):
    with pytest.raises(SystemExit) as info:
        step.main(argv + ["--dry-run", "--venv", str(tmp_path / "none")])
    assert info.value.code == 2 and why in capsys.readouterr().err


def test_a_missing_side_venv_exits_2_before_any_work(tmp_path, capsys, monkeypatch):
    def no_work(*a, **k):
        raise AssertionError("the graph was built before the venv was checked")
    monkeypatch.setattr(step.bench_dgl, "GnnparSide", no_work)
    assert step.main(["--venv", str(tmp_path / "none"), "--rounds", "1"]) == 2
    assert "bench_dgl.sh --setup" in capsys.readouterr().err


def test_the_bound_and_the_products_timing():
    assert (step.bound_for(1), step.bound_for(2), step.bound_for(4)) == (0.6, 0.5, 0.5)
    gen = torch.Generator().manual_seed(0)
    layers = [(20, 50, 8, 16), (10, 20, 16, 4)]
    plan = [{how: [step.products_mod.operands(*p, gen) for p in prods]
             for how, prods in step.products_mod.arrangements(layer, i == 0).items()}
            for i, layer in enumerate(layers)]
    before = torch.get_num_threads()
    try:
        assert step.time_products(plan, 1, 2) > 0
    finally:
        torch.set_num_threads(before)


class _FakeGnnpar:
    def __init__(self, scale, ef, args, tmp):
        self.args = args

    def export(self, path):
        open(path, "w").close()

    def train(self, epochs, threads, workers, extra):
        return {"epochs_s": [9.0] + [0.4 * (3 - threads)] * (epochs - 1), "steps": 10}


class _FakeDgl:
    hello = {"ready": True, "dgl": "fake"}

    def __init__(self, venv, npz, threads):
        self.requests = []

    def __call__(self, **req):
        self.requests.append(req)
        return {"epochs_s": [9.0] + [1.0] * (req["epochs"] - 1), "steps": 10}

    def close(self):
        pass


def test_a_run_reports_each_round_and_the_share_of_the_bound(tmp_path, capsys, monkeypatch):
    """The loop and the summary, with both training sides replaced by fakes (gnnpar 40 / 80
    ms a minibatch at 2 / 1 threads, DGL 100 ms): the warm-up epoch dropped, gnnpar / DGL
    0.4 and 0.8, the bound 0.5 x 100 and 0.6 x 100 ms, the products' share of it."""
    import json
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text("")
    monkeypatch.setattr(step.bench_dgl, "GnnparSide", _FakeGnnpar)
    monkeypatch.setattr(step.bench_dgl, "DglSide", _FakeDgl)
    before = torch.get_num_threads()
    try:
        assert step.main(["--venv", str(tmp_path / "venv"), "--rounds", "2", "--threads", "2,1",
                          "--repeats", "1", "--product-layers",
                          "20,50,8,16;10,20,16,16;5,10,16,4"]) == 0
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out
    rec = json.loads(out.strip().splitlines()[-1])
    assert [(r["round"], r["threads"]) for r in rec["rounds"]] == [(0, 2), (0, 1), (1, 2), (1, 1)]
    for r in rec["rounds"]:
        assert r["dgl"]["ms"] == pytest.approx(100.0)
        assert r["gnnpar"]["ms"] == pytest.approx(40.0 * (3 - r["threads"]))
        assert r["bound_ms"] == pytest.approx(100.0 * step.bound_for(r["threads"]))
        assert r["share"] == pytest.approx(r["products"]["ms"] / r["bound_ms"])
        assert all("load_before" in r[s] and "load_after" in r[s] for s in step.SIDES)
    assert rec["summary"]["2"]["ratio"] == pytest.approx(0.4)
    assert rec["summary"]["1"]["ratio"] == pytest.approx(0.8)
    assert "products alone" in out and "| threads |" in out
