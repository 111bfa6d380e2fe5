"""gnnpar-train refuses a flag the run would ignore (exit 2, one line naming the flag) before
it loads or spawns anything: --grid/--replication/--variant with an --algo that has no such
setting (or with auto, which picks them), the cost-model flags with a fixed --algo, mini-batch
flags in full-batch mode, and --macrobatch 0. The settings that are read still run."""
import argparse
import json

import pytest

import gnnpar.launcher.launch
import gnnpar.training.shard_source
from gnnpar.cli.options import algo_only, build_parser, check_args
from gnnpar.sampling.options import MINIBATCH_FLAGS, add_minibatch_args
from gnnpar.train import main
from gnnpar.cli.spec import RunSpec

TINY = "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02"
MB = ["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "8"]

REFUSED = [
    # --grid: read by 2d, 3d, 4d only (auto chooses its own)
    (["--algo", "1d", "--nprocs", "2", "--grid", "7x9"], "--grid"),
    (["--algo", "1d-halo", "--nprocs", "2", "--grid", "2x1"], "--grid"),
    (["--algo", "1.5d", "--nprocs", "2", "--replication", "2", "--grid", "1x2"], "--grid"),
    (["--grid", "1x1"], "--grid"),
    (["--algo", "auto", "--nprocs", "2", "--grid", "2x1"], "--grid"),
    ([*MB, "--algo", "1d", "--group-size", "2", "--grid", "2x1"], "--grid"),
    ([*MB, "--grid", "1x1"], "--grid"),
    # --replication: 1.5d only
    (["--algo", "2d", "--nprocs", "2", "--grid", "2x1", "--replication", "2"], "--replication"),
    (["--algo", "2d", "--replication", "2"], "--replication"),
    (["--algo", "1d", "--nprocs", "2", "--replication", "1"], "--replication"),
    (["--algo", "3d", "--nprocs", "2", "--grid", "1x1x2", "--replication", "2"], "--replication"),
    (["--algo", "4d", "--nprocs", "2", "--grid", "1x1x2", "--replication", "2"], "--replication"),
    (["--replication", "2"], "--replication"),
    (["--algo", "auto", "--nprocs", "2", "--replication", "2"], "--replication"),
    ([*MB, "--algo", "1d-halo", "--group-size", "2", "--replication", "2"], "--replication"),
    # --variant: 1.5d and 2d only
    (["--algo", "3d", "--variant", "bcast"], "--variant"),
    (["--algo", "4d", "--nprocs", "2", "--grid", "1x1x2", "--variant", "halo"], "--variant"),
    (["--algo", "1d", "--nprocs", "2", "--variant", "bcast"], "--variant"),
    (["--algo", "1d-halo", "--nprocs", "2", "--variant", "halo"], "--variant"),
    (["--variant", "bcast"], "--variant"),
    (["--algo", "auto", "--nprocs", "2", "--variant", "bcast"], "--variant"),
    ([*MB, "--algo", "3d", "--grid", "1x1x2", "--variant", "bcast"], "--variant"),
    # cost-model flags: only --algo auto reads them
    (["--algo", "2d", "--nprocs", "2", "--grid", "2x1", "--mem-cap", "1GB"], "--mem-cap"),
    (["--algo", "1.5d", "--nprocs", "2", "--bandwidth", "1e9"], "--bandwidth"),
    (["--algo", "1d", "--nprocs", "2", "--latency", "1e-5"], "--latency"),
    (["--mem-cap", "80GB"], "--mem-cap"),
    ([*MB, "--mem-cap", "1GB"], "--mem-cap"),
    # mini-batch flags in full-batch mode
    (["--cache-frac", "0.1"], "--cache-frac"),
    (["--no-replicate-graph"], "--no-replicate-graph"),
    (["--sampler-workers", "2"], "--sampler-workers"),
    (["--prefetch", "4"], "--prefetch"),
    (["--cache-policy", "presample"], "--cache-policy"),
    (["--replace"], "--replace"),
    (["--fanouts", "5,5"], "--fanouts"),
    (["--batch-size", "8"], "--batch-size"),
    (["--macrobatch", "2"], "--macrobatch"),
    (["--group-size", "2"], "--group-size"),
    (["--algo", "1d", "--nprocs", "2", "--cache-frac", "0.1"], "--cache-frac"),
    (["--algo", "2d", "--nprocs", "2", "--grid", "2x1", "--replace"], "--replace"),
    # --macrobatch 0: refused in both modes (it used to run as 1)
    (["--macrobatch", "0"], "--macrobatch"),
    ([*MB, "--macrobatch", "0"], "--macrobatch"),
    ([*MB, "--nprocs", "2", "--macrobatch", "0"], "--macrobatch"),
    # --comm-dtype: the wire of a distributed SpMM; serial and data-parallel runs have none
    (["--comm-dtype", "bf16"], "--comm-dtype"),
    ([*MB, "--nprocs", "2", "--comm-dtype", "fp16"], "--comm-dtype"),
    # --block-layout: full-batch 2d/3d/4d only
    (["--algo", "1d", "--nprocs", "2", "--block-layout", "parts"], "--block-layout"),
    ([*MB, "--algo", "2d", "--grid", "1x2", "--block-layout", "parts"], "--block-layout"),
]


@pytest.mark.parametrize("argv,flag", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_ignored_flag_refused_exit_2_one_line(argv, flag, no_work, capsys):
    assert main(["--dataset", TINY, "--epochs", "1", "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert flag in lines[0], lines[0]


ACCEPTED = [
    ["--algo", "2d", "--nprocs", "2", "--grid", "2x1", "--variant", "bcast"],
    ["--algo", "3d", "--nprocs", "2", "--grid", "1x1x2"],
    ["--algo", "4d", "--nprocs", "2", "--grid", "1x1x2"],
    ["--algo", "1.5d", "--nprocs", "2", "--replication", "2", "--variant", "bcast"],
    ["--algo", "auto", "--nprocs", "2", "--mem-cap", "1GB", "--bandwidth", "1e9",
     "--latency", "1e-5"],
    # a flag written out at its default value changes nothing, so it is not refused
    ["--cache-frac", "0", "--replicate-graph"],
    [*MB, "--macrobatch", "2", "--sampler-workers", "2", "--prefetch", "1", "--replace",
     "--cache-frac", "0.1", "--cache-policy", "presample", "--no-replicate-graph"],
    [*MB, "--algo", "1.5d", "--group-size", "2", "--replication", "2", "--variant", "bcast"],
    [*MB, "--algo", "2d", "--grid", "1x2", "--variant", "halo"],
    [*MB, "--algo", "3d", "--grid", "1x1x2"],
    [*MB, "--algo", "4d", "--grid", "2x1x1x2"],
    ["--algo", "1d-halo", "--nprocs", "2", "--comm-dtype", "bf16"],
    [*MB, "--algo", "2d", "--grid", "1x2", "--comm-dtype", "fp16"],
    ["--comm-dtype", "fp32"],
    ["--algo", "3d", "--nprocs", "2", "--grid", "1x1x2", "--block-layout", "parts"],
]


@pytest.mark.parametrize("argv", ACCEPTED, ids=[" ".join(a) for a in ACCEPTED])
def test_read_flags_pass_the_checks(argv):
    check_args(build_parser().parse_args(argv))


def test_every_minibatch_flag_is_in_the_table():
    p = argparse.ArgumentParser(add_help=False)
    add_minibatch_args(p)
    assert {a.dest for a in p._actions} - {"mode"} == set(MINIBATCH_FLAGS)
    defaults = build_parser().parse_args([])
    assert all(hasattr(defaults, name) for name in algo_only())


def test_help_still_gives_the_defaults(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("--sampler-workers SAMPLER_WORKERS sampler threads per rank running ahead of "
                 "the trainer (default 1; a one-process CPU run", "(default: degree)",
                 "--sample-in-bursts, --no-sample-in-bursts sampler threads run only while",
                 "(default 2 at --macrobatch 1, else one per sampler worker)"):
        assert text in out, text


def _final(path):
    with open(path) as f:
        return [json.loads(line) for line in f][-1]


def test_2d_grid_still_trains(tmp_path):
    log = tmp_path / "log.jsonl"
    assert main(["--dataset", TINY, "--epochs", "1", "--quiet", "--algo", "2d", "--grid", "2x1",
                 "--nprocs", "2", "--partitioner", "block", "--log-json", str(log)]) == 0
    final = _final(log)
    assert final["final"] and final["algo"] == "2d" and final["grid"] == [2, 1]


def test_auto_with_mem_cap_still_trains(tmp_path):
    log = tmp_path / "log.jsonl"
    assert main(["--dataset", TINY, "--epochs", "1", "--quiet", "--algo", "auto",
                 "--mem-cap", "1GB", "--nprocs", "2", "--partitioner", "block",
                 "--log-json", str(log)]) == 0
    assert _final(log)["world_size"] == 2


def test_serial_minibatch_flags_still_train(tmp_path):
    log = tmp_path / "log.jsonl"
    assert main(["--dataset", TINY, "--epochs", "1", "--quiet", *MB, "--macrobatch", "2",
                 "--sampler-workers", "2", "--prefetch", "1", "--replace",
                 "--log-json", str(log)]) == 0
    assert _final(log)["mode"] == "minibatch"


@pytest.fixture
def block_shards(tmp_path):
    from gnnpar.datasets import load_dataset
    from gnnpar.partitioners import partition_graph, write_shards
    graph = load_dataset(TINY)
    out = tmp_path / "shards"
    write_shards(graph, partition_graph(graph, 2, "block"), out)
    return str(out)


def test_partitioner_other_than_the_shards_is_refused(block_shards, no_work, capsys):
    """--partition-dir already holds shards: the run uses them as they are, so a
    --partitioner naming another method would be silently ignored."""
    assert main(["--dataset", TINY, "--epochs", "1", "--quiet", "--algo", "1d", "--nprocs",
                 "2", "--partition-dir", block_shards, "--partitioner", "random"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--partitioner random" in lines[0] and "block" in lines[0]


def test_partitioner_of_the_shards_is_accepted(block_shards):
    spec = RunSpec.of(partition_dir=block_shards, reorder="none")
    gnnpar.training.shard_source.check_shard_flags(spec.evolve(partitioner="block"))
    gnnpar.training.shard_source.check_shard_flags(spec.evolve(partitioner=None))
