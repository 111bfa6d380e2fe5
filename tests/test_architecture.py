"""The written contracts (docs/architecture.md): the frozen run spec, the Protocols every
runtime, engine and shard satisfies, and typed errors across the spawn boundary."""
import dataclasses

import pytest

from gnnpar.datasets import InputError
from gnnpar.interfaces import CommStats, MiniBatchEngine, Runtime, Shard, ShardRows
from gnnpar.cli.options import build_parser
from gnnpar.partitioners import partition_graph, write_shards
from gnnpar.partitioners.shards import load_shard
from gnnpar.training.minibatch_loop import DataParallel
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import SpawnError, spawn
from gnnpar.cli.spec import SECTION_OF, SECTIONS, RunSpec

from .graphs import random_graph


def test_run_spec_defaults_are_the_parsers():
    parsed = vars(build_parser().parse_args([]))
    spec = RunSpec.of()
    for name, section in SECTION_OF.items():
        # the device is resolved, never "auto"; the weight decay by task (below)
        if name in parsed and name not in ("device", "weight_decay"):
            assert getattr(getattr(spec, section), name) == parsed[name], name
    assert parsed["weight_decay"] is None
    assert spec.train.weight_decay == 5e-4 and RunSpec.of(task="link").train.weight_decay == 0.0
    assert RunSpec.of(task="link", weight_decay=1e-3).train.weight_decay == 1e-3
    assert set(parsed) <= set(SECTION_OF)  # every flag has a field


def test_run_spec_sections_are_the_help_groups():
    """One section per ``gnnpar-train --help`` group, holding that group's flags, so a reader's
    ``spec.<section>.<flag>`` names the group the flag is documented in."""
    titles = {"data": "data", "model": "model", "train": "training", "output": "output",
              "link": "link prediction", "parallel": "distributed full-batch",
              "batch": "mini-batch training (--mode minibatch)", "checkpoint": "checkpoints"}
    groups = {g.title: {a.dest for a in g._group_actions}
              for g in build_parser()._action_groups}
    assert list(titles) == list(SECTIONS)
    for name, cls in SECTIONS.items():
        derived = {"grid_dims"} if name == "parallel" else set()
        assert {f.name for f in dataclasses.fields(cls)} - derived == groups[titles[name]], name
    with pytest.raises(TypeError, match="no flag grid_dims, nosuch"):
        RunSpec.of(nosuch=1, grid_dims=(2, 2))


def test_run_spec_is_frozen_and_resolved_once():
    args = build_parser().parse_args(["--algo", "2d", "--nprocs", "4", "--grid", "2x2",
                                      "--mode", "minibatch", "--fanouts", "5,3",
                                      "--batch-size", "8", "--group-size", "4"])
    spec = RunSpec.from_args(args)
    assert spec.train.device in ("cpu", "cuda") and spec.parallel.grid_dims == (2, 2)
    assert spec.batch.fanouts == (5, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.parallel.algo = "1d"
    moved = spec.evolve(grid="4x1")
    assert (moved.parallel.grid_dims, spec.parallel.grid_dims) == ((4, 1), (2, 2))
    assert spec.grid_shape(4) == {"row": 2, "col": 2}
    with pytest.raises(InputError, match="gives 4 ranks but the world size is 3"):
        spec.grid_shape(3)
    with pytest.raises(InputError, match="--layers"):  # refused when made, not later
        RunSpec.from_args(build_parser().parse_args(["--layers", "0"]))


def test_runtimes_engines_and_shards_satisfy_their_protocols(tmp_path):
    g = random_graph(60, 300, seed=0)
    assert isinstance(SerialRuntime(g, "gcn"), Runtime)
    assert isinstance(DataParallel(), MiniBatchEngine)
    assert DataParallel().comm_stats() == CommStats(0, 0, 0.0)
    assert SerialRuntime(g, "gcn").comm_stats() == CommStats()
    write_shards(g, partition_graph(g, 2, "block"), str(tmp_path / "s"), norms=("gcn",))
    shard = load_shard(str(tmp_path / "s"), 1, world_size=2)
    assert isinstance(shard, Shard) and isinstance(shard, ShardRows)


def _fail_with(rank, world, exc):
    if rank == 1:
        raise exc
    return rank


@pytest.mark.parametrize("exc,kind,code", [
    (InputError("--grid 3x3: bad: really"), "input", 2),
    (SystemExit(143), "exit", 143),
    (ValueError("x: y"), "error", None)])
def test_a_ranks_failure_arrives_typed_with_its_own_message(exc, kind, code):
    with pytest.raises(SpawnError) as info:
        spawn(_fail_with, 2, args=(exc,), timeout_s=60)
    f = info.value.failure
    assert (info.value.rank, f.kind, f.exit_code) == (1, kind, code), (f.message, f.detail)
    assert f.message == str(exc)  # the message as raised, never cut at a ": "
    assert info.value.headline.startswith(f"rank 1 failed: {type(exc).__name__}")


def test_cli_serial_and_two_ranks_share_one_setup_path(tmp_path):
    """Serial and --nprocs runs go through gnnpar.training.rank.run_rank: same log fields."""
    import json
    from gnnpar.train import main
    for extra, name in (([], "serial"), (["--algo", "1d", "--nprocs", "2"], "dist")):
        log = tmp_path / f"{name}.jsonl"
        assert main(["--epochs", "2", "--dropout", "0", "--quiet", "--log-json", str(log),
                     *extra]) == 0
        recs = [json.loads(line) for line in open(log)]
        assert recs[-1]["final"] and {"loss", "comm_bytes", "peak_mem_bytes"} <= set(recs[0])
    a = json.loads(open(tmp_path / "serial.jsonl").readlines()[-1])
    b = json.loads(open(tmp_path / "dist.jsonl").readlines()[-1])
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert a["algo"] == "serial" and b["algo"] == "1d" and b["world_size"] == 2


def _agree_body(rank, world):
    from gnnpar.training.checkpoint import agree_on_failure
    mine = {1: (0, "I: looks like a prefix"), 2: (1, "other")}.get(rank)
    return agree_on_failure(mine), agree_on_failure(None)


def test_ranks_agree_on_a_typed_failure_not_on_its_text():
    """Setup failures agreed across ranks carry their kind as a number: a message that starts
    like an old text tag is taken as words, the lowest failing rank wins."""
    for agreed, none in spawn(_agree_body, 3, timeout_s=60):
        assert agreed == (0, "I: looks like a prefix") and none is None


def test_the_library_reads_the_run_spec_by_its_sections():
    """No ``getattr(spec, name, default)`` in the library: a reader names the section and the
    field (``spec.parallel.algo``), so a misspelt or moved field fails at once."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parent.parent
    found = [f"{p.relative_to(root)}:{i}" for d in ("gnnpar", "kernels", "partitioners", "datasets")
             for p in sorted((root / d).rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if "getattr(spec" in line]
    assert found == []
