"""gnnpar-plan and --algo auto: ranked tables at any scale, memory caps, byte sizes; the
calibration file (probe, round trip, its use by the plan and by --algo auto); exact plans."""
import os
import json
import subprocess
import sys

import pytest

from gnnpar.cli.calibrate import CALIBRATION_ENV, calibrate, save
from gnnpar.datasets import InputError
from gnnpar.kernels.cost_model import Machine, rank_algorithms
from gnnpar.cli.options import build_parser
from gnnpar.cli.plan_cli import machine_from, main, parse_bytes
from gnnpar.cli.spec import RunSpec


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
    assert "(busiest rank of the run's partition)" in r.stderr  # modelled on its partition
    final = json.loads(log.read_text().splitlines()[-1])
    assert final["algo"] in ("1d", "1d-halo", "1.5d", "2d", "3d") and final["world_size"] == 2


SLOW = {"bandwidth": 1e6, "latency": 1e-2, "spmm_rate": 1e8, "dense_rate": 1e9,
        "elementwise_rate": 1e8}
PAPERS = ["--nodes", "111059956", "--edges", "1615685872", "--features", "128", "--classes",
          "172", "--world", "64", "--json"]


def _rows(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_calibration_file_round_trip_and_plan_uses_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(CALIBRATION_ENV, raising=False)
    path = tmp_path / "rates.json"
    save({**SLOW, "threads": 1, "host": "test"}, str(path))
    assert Machine.load(str(path)) == Machine(**SLOW)  # fixed costs absent: the defaults
    free = tmp_path / "free.json"
    save({**SLOW, "step_overhead": 0.0, "layer_overhead": 0.5}, str(free))
    assert Machine.load(str(free)).fixed_s(3) == 1.5  # 0 is a fixed cost, not a missing one
    assert main(PAPERS + ["--calibration", str(path)]) == 0
    calibrated = _rows(capsys)
    assert main(PAPERS) == 0
    default = _rows(capsys)
    want = rank_algorithms(111059956, 1615685872, [128, 256, 256, 172], 64, machine=Machine(**SLOW))
    assert [r["time_s"] for r in calibrated] == pytest.approx([r["time_s"] for r in want])
    assert calibrated[0]["time_s"] > 100 * default[0]["time_s"]
    # --bandwidth still overrides the file
    assert main(PAPERS + ["--calibration", str(path), "--bandwidth", "1e12"]) == 0
    assert _rows(capsys)[0]["time_s"] < calibrated[0]["time_s"]


@pytest.mark.parametrize("bad", ['{"bandwidth": 1}', "not json",
                                 json.dumps({**SLOW, "latency": -1.0}),
                                 json.dumps({**SLOW, "spmm_rate": "fast"}),
                                 json.dumps({**SLOW, "layer_overhead": -1.0})])
def test_bad_calibration_file_is_an_input_error(tmp_path, bad):
    path = tmp_path / "rates.json"
    path.write_text(bad)
    with pytest.raises(InputError, match="rates.json"):
        Machine.load(str(path))
    assert main(PAPERS + ["--calibration", str(path)]) == 2
    assert main(PAPERS + ["--calibration", str(tmp_path / "missing.json")]) == 2


def test_auto_reads_the_calibration_from_the_run_spec(tmp_path, monkeypatch):
    """gnnpar-train's run spec carries --calibration to the launcher's plan (machine_from of
    the spec); checking the flags writes no environment variable. Without the flag the
    variable still names a file."""
    monkeypatch.delenv(CALIBRATION_ENV, raising=False)
    path = tmp_path / "rates.json"
    save(SLOW, str(path))
    spec = RunSpec.from_args(build_parser().parse_args(["--algo", "auto", "--calibration",
                                                        str(path)]))
    assert CALIBRATION_ENV not in os.environ
    assert machine_from(spec.settings()) == Machine(**SLOW)
    assert machine_from(RunSpec.of(algo="auto").settings()) == Machine()
    monkeypatch.setenv(CALIBRATION_ENV, str(path))
    assert machine_from(RunSpec.of(algo="auto").settings()) == Machine(**SLOW)


def test_calibrate_probe_writes_a_usable_file(tmp_path, capsys):
    record = calibrate(quick=True)
    for key in ("bandwidth", "latency", "spmm_rate", "dense_rate", "elementwise_rate"):
        assert record[key] > 0
    assert record["step_overhead"] >= 0 and record["layer_overhead"] >= 0
    assert record["step_overhead"] + record["layer_overhead"] > 0  # an epoch is not free
    assert Machine.from_dict(record).fixed_s(2) == pytest.approx(
        record["step_overhead"] + 2 * record["layer_overhead"])
    assert record["latency"] < 1.0 and record["spmm_rate"] < record["dense_rate"] * 100
    path = tmp_path / "cal.json"
    assert main(["--calibrate", "--calibration", str(path)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["--dataset", "sbm:n=300,blocks=3,p_in=0.05,p_out=0.005", "--world", "4",
                 "--calibration", str(path), "--json"]) == 0
    assert all(r["time_s"] > 0 for r in _rows(capsys))


def test_partitioned_plan_is_per_busiest_rank(capsys):
    spec = "sbm:n=400,blocks=4,p_in=0.05,p_out=0.002"
    assert main(["--dataset", spec, "--world", "4", "--partitioner", "metis", "--json"]) == 0
    exact = _rows(capsys)
    assert all(r["bytes"] >= r["bytes_mean"] for r in exact)
    assert [r["time_s"] for r in exact] == sorted(r["time_s"] for r in exact)
    halo = next(r for r in exact if r["algo"] == "1d-halo")
    one_d = next(r for r in exact if r["algo"] == "1d")
    assert halo["bytes"] < one_d["bytes"]  # METIS on 4 planted blocks: few rows cross
    assert main(["--nodes", "10", "--edges", "20", "--world", "2", "--partitioner",
                 "metis"]) == 2


def test_calibrate_keeps_a_file_that_is_not_a_calibration(tmp_path, monkeypatch, capsys):
    import gnnpar.cli.plan_cli as plan_cli

    def probe(**kw):
        raise AssertionError("the probe ran before the target was checked")
    monkeypatch.setattr(plan_cli, "calibrate", probe)
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}\n')
    assert main(["--calibrate", "--calibration", str(notes)]) == 2
    assert "is not a calibration file" in capsys.readouterr().err
    assert notes.read_text() == '{"mine": 1}\n'
    assert main(["--calibrate", "--calibration", str(tmp_path)]) == 2
    # an earlier calibration file is replaced, whole
    old = tmp_path / "cal.json"
    save({**Machine().to_dict()}, str(old))
    record = {**Machine(bandwidth=1e9).to_dict(), "threads": 1, "probe_s": 0.0}
    monkeypatch.setattr(plan_cli, "calibrate", lambda **kw: record)
    assert main(["--calibrate", "--calibration", str(old)]) == 0
    assert Machine.load(str(old)).bandwidth == 1e9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json", "notes.json"]


def test_auto_models_the_partition_the_run_uses():
    """--nprocs: --algo auto ranks on the busiest rank of the very partition the shards get
    (the same rows as gnnpar-plan --partitioner), and hands that partition on."""
    from gnnpar.kernels.cost_model import Structure
    from gnnpar.launcher.launch import choose_algorithm
    from gnnpar.partitioners import partition_graph
    from gnnpar.cli.plan_cli import plan
    from gnnpar.training.shard_source import load_graph
    spec = RunSpec.of(dataset="rmat:scale=9,ef=8", algo="auto", nprocs=3, partitioner="random",
                   seed=4, quiet=True)
    chosen, graph, part = choose_algorithm(spec, 3, exact=True)
    want = partition_graph(graph, 3, "random", seed=4)
    assert (part.owner == want.owner).all()
    g = load_graph(spec)
    rows = plan(g.num_nodes, g.num_edges + g.num_nodes, g.num_features, spec.model.hidden,
                g.num_classes, spec.model.layers, 3, spec.model.model, spec.settings(),
                structure=Structure.from_graph(g, want.owner, 3))
    assert chosen.parallel.algo == rows[0]["algo"]
    _, _, none = choose_algorithm(spec, 3)  # a launcher's ranks partition on their own
    assert none is None


def test_auto_models_the_runs_blocks_and_wire():
    """--algo auto ranks on what the run will build: ``--comm-dtype bf16`` halves every
    algorithm's feature bytes but not the gradient all-reduce nor 3d's Â pieces, and
    ``--block-layout``/``--seed`` move 2d's and 3d's blocks but not the partition's algorithms
    (1d, 1d-halo, 1.5d); the choice is the top row of those settings."""
    from gnnpar.kernels.cost_model import Structure
    from gnnpar.launcher.launch import choose_algorithm
    from gnnpar.cli.plan_cli import plan
    from gnnpar.training.shard_source import load_graph, run_partition
    spec = RunSpec.of(dataset="rmat:scale=9,ef=8", algo="auto", nprocs=4, partitioner="metis",
                   seed=4, quiet=True)
    g = load_graph(spec)
    s = Structure.from_graph(g, run_partition(spec, g, 4).owner, 4)

    def rows(**flags):
        out = plan(g.num_nodes, g.num_edges + g.num_nodes, g.num_features, spec.model.hidden,
                   g.num_classes, spec.model.layers, 4, spec.model.model,
                   spec.evolve(**flags).settings(), structure=s)
        return {(r["algo"], r["grid"], r["variant"]): r["comm_bytes_max_rank"] for r in out}, out
    fp32, _ = rows()
    bf16, ranked = rows(comm_dtype="bf16")
    for key, b in fp32.items():  # the features halve; the gradient sum (and 3d's Â) do not
        assert b / 2 < bf16[key] < b, key
    parts, _ = rows(block_layout="parts")
    seed, _ = rows(seed=5)  # the layout's seed (the partition given is the same)
    for key in fp32:
        partition_layout = key[0] in ("1d", "1d-halo", "1.5d")
        assert (parts[key] == fp32[key]) == partition_layout, key
        if partition_layout:
            assert seed[key] == fp32[key], key
    for algo in ("2d", "3d"):  # (2d bcast moves what the block sizes say, whatever the seed)
        assert any(seed[k] != fp32[k] for k in fp32 if k[0] == algo), algo
    chosen, _, _ = choose_algorithm(spec.evolve(comm_dtype="bf16"), 4, exact=True)
    assert chosen.parallel.algo == ranked[0]["algo"]
    assert chosen.parallel.grid in (None, ranked[0]["grid"])


def test_plan_for_gat_ranks_the_algorithms_that_run_it_with_its_exchanges(capsys):
    """--model gat: every candidate is ranked, its busiest rank's bytes are the cost model's
    GAT moves (kernels/cost_attention.py, tested exact in test_cost_exact.py), above GCN's at
    the same widths on 1d-halo; --heads elsewhere, or a width it does not divide, exit 2."""
    from gnnpar.kernels.cost_model import Structure, epoch_traffic
    from gnnpar.kernels.cost_terms import gat_kind
    from gnnpar.datasets import load_dataset
    from gnnpar.partitioners import partition_graph
    spec = "sbm:n=400,blocks=4,p_in=0.05,p_out=0.002"
    flags = ["--dataset", spec, "--world", "4", "--partitioner", "metis", "--json",
             "--layers", "2", "--hidden", "16"]
    assert main(flags + ["--model", "gat", "--heads", "4"]) == 0
    rows = _rows(capsys)
    assert main(flags) == 0
    gcn_rows = _rows(capsys)
    assert sorted((r["algo"], r["grid"], r["variant"]) for r in rows) == \
        sorted((r["algo"], r["grid"], r["variant"]) for r in gcn_rows)
    g = load_dataset(spec)
    s = Structure.from_graph(g, partition_graph(g, 4, "metis", seed=0).owner, 4)
    widths = [g.num_features, 16, g.num_classes]
    halo = next(r for r in rows if r["algo"] == "1d-halo")
    assert halo["comm_bytes_max_rank"] == int(epoch_traffic(s, "1d-halo", gat_kind(4),
                                                            widths)["bytes"].max())
    gcn = next(r for r in gcn_rows if r["algo"] == "1d-halo")
    assert halo["comm_bytes_max_rank"] > gcn["comm_bytes_max_rank"]
    assert main(flags + ["--heads", "4"]) == 2
    assert main(flags + ["--model", "gat", "--heads", "3"]) == 2
