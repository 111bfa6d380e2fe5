"""The algorithm registry (gnnpar.kernels.algorithms) is the one place an algorithm's facts
live: every entry is complete, and the CLI's --algo choices, the flag checks, the cost model
and --algo auto read it. A toy algorithm (tests/toy_ring.py) added with one register() line
is accepted by the CLI and trains through the real runtime exactly like the serial trainer.
"""
import inspect
from types import SimpleNamespace

import pytest
import torch

from gnnpar.datasets import InputError
from gnnpar.training.distributed import DistRuntime
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels import cost_model
from gnnpar.kernels.algorithms import (ALGORITHMS, cost_names, get, group_grid_shape, make_grid,
                                       names, register)
from gnnpar.kernels.cost_terms import Cost, Structure
from gnnpar.kernels.entry import LAYOUT_FLAGS, Algorithm, GroupRule
from gnnpar.kernels.grid import AXES
from gnnpar.nn.models import GNN
from gnnpar.cli.options import algo_choices, algo_only, build_parser, check_algo_flags
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn
from gnnpar.training.trainer import TrainConfig, fit

from .graphs import random_graph
from .toy_ring import RING

BUILTIN = ("1d", "1d-halo", "1.5d", "2d", "3d", "4d")
SETTINGS = SimpleNamespace(layers=3, variant="bcast")


def with_ring():
    """Add the toy algorithm (once per process: the parent and every spawned rank)."""
    if RING.name not in ALGORITHMS:
        register(RING)


@pytest.fixture
def ring():
    with_ring()
    yield RING
    ALGORITHMS.pop(RING.name)


def sample_dims(entry: Algorithm):
    return (1,) * len(entry.axes) if "grid" in entry.flags else None


# ---------------------------------------------------------------- (a) entries are complete
def test_builtin_order():
    assert names()[:len(BUILTIN)] == BUILTIN


@pytest.mark.parametrize("name", BUILTIN)
def test_entry_is_complete(name):
    entry = get(name)
    assert entry.name == name and isinstance(entry, Algorithm)
    assert entry.axes and set(entry.axes) <= set(AXES)
    assert set(entry.flags) <= set(LAYOUT_FLAGS)
    assert list(entry.grid(1, sample_dims(entry), 1)) == list(entry.axes)
    for combo in entry.combos(entry.axes):
        assert set(combo) <= set(entry.axes)
    builder = inspect.signature(entry.builder)
    for per_group in (False, True) if entry.group else (False,):
        kw = entry.options(SETTINGS, per_group)
        builder.bind(None, None, "gcn", None, **kw)  # every option is a builder parameter
    if "variant" in entry.flags:
        assert entry.options(SETTINGS)["variant"] == "bcast"
    assert entry.group is None or (isinstance(entry.group, GroupRule)
                                   and callable(entry.group.size))
    assert isinstance(entry.cost, Cost)
    assert callable(entry.cost.exact) and callable(entry.cost.estimate)


def test_unknown_name_lists_the_choices():
    with pytest.raises(InputError, match="choose one of 1d, 1d-halo, 1.5d, 2d, 3d, 4d"):
        get("5d")


def test_register_refuses_a_taken_or_reserved_name():
    with pytest.raises(ValueError, match="already registered"):
        register(get("1d"))
    with pytest.raises(ValueError, match="reserved"):
        register(Algorithm("auto", ("row",), RING.shape, RING.builder))


# ---------------------------------------------------------------- readers use the registry
def test_cli_choices_and_flag_rules_come_from_the_registry():
    assert algo_choices() == ("serial", *names(), "auto")
    action = next(a for a in build_parser()._actions if a.dest == "algo")
    assert tuple(action.choices) == algo_choices()
    rules = algo_only()
    for flag in LAYOUT_FLAGS:
        assert rules[flag] == tuple(n for n, a in ALGORITHMS.items() if flag in a.flags)
    assert rules["grid"] == ("2d", "3d", "4d") and rules["variant"] == ("1.5d", "2d")


def test_cost_model_and_auto_come_from_the_registry():
    assert cost_names() == tuple(n for n, a in ALGORITHMS.items() if a.cost)
    auto = {n for n, a in ALGORITHMS.items() if a.cost and a.cost.candidates}
    assert {algo for algo, _, _ in cost_model.candidates(12)} == auto == set(BUILTIN) - {"4d"}
    rows = cost_model.rank_algorithms(10**5, 10**6, [16, 32, 4], 12)
    assert {r["algo"] for r in rows} == auto


# ---------------------------------------------------------------- the toy "1d-ring"
def test_toy_is_one_register_line_away(ring):
    args = build_parser().parse_args(["--algo", "1d-ring"])
    assert args.algo == "1d-ring" and "1d-ring" in algo_choices()
    assert make_grid("1d-ring", 1).shape == {"row": 1}
    for flag, value in (("grid", "2x1"), ("replication", 2), ("variant", "halo")):
        args = build_parser().parse_args(["--algo", "1d-ring"])
        setattr(args, flag, value)
        with pytest.raises(InputError, match=f"--{flag} is read only by --algo .*1d-ring ignores"):
            check_algo_flags(args)
    # no cost-model entry: skipped by --algo auto, refused by name with a clear message
    assert "1d-ring" not in {a for a, _, _ in cost_model.candidates(4)}
    s = Structure.from_graph(random_graph(n=10), [0] * 10, 1)
    with pytest.raises(InputError, match="1d-ring has no cost-model entry"):
        cost_model.epoch_traffic(s, "1d-ring", "gcn", [4, 3])
    with pytest.raises(InputError, match="cannot run a sampled subgraph"):
        group_grid_shape("1d-ring", 2, 2)


def test_toy_is_gone_when_not_registered():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--algo", "1d-ring"])


def ring_rank(rank, world, n):
    """Train 3 epochs serially and with "1d-ring" on this rank's shard; both loss curves."""
    with_ring()
    g = random_graph(n=n, f=6, classes=3, seed=11)
    shard = build_shard(g, partition_graph(g, world, "random", seed=3), rank, norms=("gcn",))
    curves = {}
    for how in ("serial", "1d-ring"):
        torch.manual_seed(1)
        model = GNN("gcn", 6, 7, 3, layers=3, dropout=0.0)
        rt = (SerialRuntime(g, model.norm, "cpu") if how == "serial" else
              DistRuntime(make_grid(how, world), shard, algorithm(how), model.norm, "cpu"))
        curves[how] = [r["loss"] for r in fit(model, rt, TrainConfig(epochs=3, lr=0.05))]
    return {"curves": curves, "op": type(rt.op).__name__, "sizes": rt.op.sizes}


@pytest.mark.parametrize("world", [2, 3])
def test_toy_trains_like_serial(world):
    n = 47
    for out in spawn(ring_rank, world, args=(n,), timeout_s=240):
        assert out["op"] == "OpRing"
        assert sum(out["sizes"]) == n and len(set(out["sizes"])) > 1  # uneven blocks
        serial, ring_losses = out["curves"]["serial"], out["curves"]["1d-ring"]
        assert ring_losses == pytest.approx(serial, rel=1e-5, abs=0)
