"""The device rule of ``gnnpar.kernels.comm``: every collective goes through it, and every
process group gnnpar makes can carry host tensors, so every mode is legal under NCCL.

NCCL carries only CUDA tensors. A CPU-only machine can ask for a group with the same
restriction, ``cuda:gloo`` (torch refuses a CPU tensor on it with NCCL's own error, "No
backend type associated with device type cpu"). Asked for such a backend, gnnpar's launch
path must add a host route (as it turns ``nccl`` into ``cpu:gloo,cuda:nccl``); these tests
run every mode through it — full batch with every algorithm, checkpoints and ``--resume``,
mini batch data parallel, grouped and 4d, evaluation, SIGTERM agreement — and check that a
group without the route is refused with a clear error. On a GPU, ``tests/test_cuda.py`` runs
the same modes on CUDA tensors.
"""
import ast
import glob
import json
import os

import pytest
import torch
import torch.distributed as dist

from gnnpar.training.rank import run_rank
from gnnpar.training.shard_source import ShardSource
from gnnpar.cli.spec import RunSpec
from gnnpar.kernels.comm import (AUDIT_ENV, DIST_CALLS, Comm, CommDeviceError, control_all_reduce,
                                 device_routes, process_group_backend)
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.cli.options import build_parser
from gnnpar.launcher.spawn import SpawnError, spawn

from .cli_util import ROOT

PACKAGE_DIRS = ("gnnpar", "kernels", "partitioners", "datasets", "scripts")
CUDA_ONLY = "cuda:gloo"  # a group that, like NCCL's, has no backend for CPU tensors
DATA = ["--dataset", "sbm:n=90,blocks=3,p_in=0.2,p_out=0.02,feat=8,seed=1", "--epochs", "2",
        "--hidden", "8", "--quiet", "--seed", "3"]


def _dist_names(tree):
    """Names bound to ``torch.distributed`` in a module, and names imported from it."""
    aliases, imported = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch.distributed":
                    aliases.add(a.asname or "torch.distributed")
        elif isinstance(node, ast.ImportFrom):
            if node.module == "torch" and any(a.name == "distributed" for a in node.names):
                aliases.update(a.asname or a.name for a in node.names if a.name == "distributed")
            if node.module == "torch.distributed":
                imported.update(a.name for a in node.names if a.name in DIST_CALLS)
    return aliases, imported


def collective_calls(path):
    """``(line, name)`` of every ``torch.distributed`` collective a source file calls."""
    tree = ast.parse(open(path).read(), path)
    aliases, imported = _dist_names(tree)
    found = [(0, f"from torch.distributed import {n}") for n in sorted(imported)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in DIST_CALLS + ("new_group",):
            if ast.unparse(node.value) in aliases | {"torch.distributed"}:
                found.append((node.lineno, node.attr))
    return found


def test_no_module_but_comm_calls_a_collective():
    allowed = {os.path.join("kernels", "comm.py"): set(DIST_CALLS),
               os.path.join("kernels", "grid.py"): {"new_group"}}
    offenders = []
    for folder in PACKAGE_DIRS:
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
            rel = os.path.relpath(path, ROOT)
            offenders += [f"{rel}:{line} {name}" for line, name in collective_calls(path)
                          if name not in allowed.get(rel, ())]
    assert not offenders, "collectives outside kernels/comm.py:\n" + "\n".join(offenders)
    # the scan itself finds what it looks for
    assert {n for _, n in collective_calls(os.path.join(ROOT, "kernels", "comm.py"))} >= {
        "all_reduce", "all_gather", "all_to_all_single", "broadcast", "reduce_scatter",
        "init_process_group"}


def test_new_group_inherits_the_world_backend():
    src = open(os.path.join(ROOT, "kernels", "grid.py")).read()
    calls = [n for n in ast.walk(ast.parse(src))
             if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("new_group")]
    assert calls and all(not n.keywords and len(n.args) == 1 for n in calls)


def test_process_group_backend_gives_host_tensors_a_route():
    assert process_group_backend("nccl") == "cpu:gloo,cuda:nccl"
    assert process_group_backend("gloo") == "gloo"
    assert process_group_backend("mpi") == "mpi"
    assert process_group_backend(CUDA_ONLY) == "cpu:gloo,cuda:gloo"
    assert device_routes("nccl") == {"cuda": "nccl"}
    assert device_routes("cpu:gloo,cuda:nccl") == {"cpu": "gloo", "cuda": "nccl"}
    for name in ("nccl", "gloo", "mpi", CUDA_ONLY):
        assert "cpu" in device_routes(process_group_backend(name))


def refused_body(rank, world):
    """On a CUDA-only subgroup, a host tensor is refused by Comm with a clear error (and by
    torch with NCCL's own words when Comm is bypassed)."""
    grid = ProcessGrid.create({"row": world})
    grid.groups[("row",)] = dist.new_group(list(range(world)), backend=CUDA_ONLY)
    seen = {}
    for name, call in (("comm", lambda: Comm(grid).all_reduce(torch.ones(3), "row")),
                       ("control", lambda: control_all_reduce(torch.ones(1), "max",
                                                              grid.group("row"))),
                       ("torch", lambda: dist.all_reduce(torch.ones(3), group=grid.group("row")))):
        try:
            call()
            seen[name] = "ran"
        except CommDeviceError as e:
            seen[name] = f"CommDeviceError: {e}"
        except RuntimeError as e:
            seen[name] = f"RuntimeError: {e}"
    return seen


def test_comm_refuses_a_tensor_its_group_cannot_carry():
    seen = spawn(refused_body, 2, timeout_s=60)[0]
    assert seen["comm"].startswith("CommDeviceError") and "cpu tensor" in seen["comm"]
    assert "'cuda:gloo'" in seen["comm"] and "tests.test_comm_rule" in seen["comm"]
    assert seen["control"].startswith("CommDeviceError")
    assert "No backend type associated with device type cpu" in seen["torch"]


# ---------------------------------------------------------------- every mode, CUDA-only group
def mode_cases(world):
    """(full-batch, mini-batch) ``(algo, extra flags)`` lists for world size 1 or 4."""
    if world == 1:
        return ([("1d", []), ("1d-halo", []), ("1.5d", ["--replication", "1"]),
                 ("2d", ["--grid", "1x1"]), ("3d", ["--grid", "1x1x1"]),
                 ("4d", ["--grid", "1x1x1x1"])],
                [("serial", []), ("4d", ["--grid", "1x1x1x1"])])
    assert world == 4
    return ([("1d", []), ("1d-halo", []), ("1.5d", ["--replication", "2"]),
             ("2d", ["--grid", "2x2"]), ("3d", ["--grid", "1x2x2"]),
             ("4d", ["--grid", "1x2x1x2"])],
            [("serial", []), ("1d-halo", ["--group-size", "2"]), ("4d", ["--grid", "2x1x2x1"])])


def _args(argv, device):
    return RunSpec.from_args(build_parser().parse_args(argv)).evolve(device=device)


def rank_body(rank, world, spec, folder):
    """The launchers' per-rank entry, shards cut in memory (``folder`` None)."""
    return run_rank(spec, rank, world, ShardSource(folder))


def every_mode_body(rank, world, ckpt_root, device="cpu"):
    """Every mode through ``rank_body`` (the launchers' per-rank entry); final records."""
    full, mini = mode_cases(world)
    finals = {}
    for algo, extra in full:
        finals[f"full {algo}"] = rank_body(rank, world, _args(
            ["--algo", algo, *extra, *DATA, "--partitioner", "random"], device), None)
    mb = ["--mode", "minibatch", "--fanouts", "3,3", "--batch-size", "16", "--macrobatch", "2",
          "--partitioner", "random", *DATA]
    for algo, extra in mini:
        finals[f"mini {algo}"] = rank_body(rank, world, _args(["--algo", algo, *extra, *mb],
                                                              device), None)
    full_ckpt = ["--algo", full[3][0], *full[3][1], *DATA, "--partitioner", "random"]
    for mode, argv in (("full", full_ckpt), ("mini", mb)):
        ckpt = ["--checkpoint-dir", os.path.join(ckpt_root, mode)]
        rank_body(rank, world, _args([*argv, *ckpt, "--epochs", "1"], device), None)
        finals[f"{mode} resumed"] = rank_body(rank, world, _args([*argv, *ckpt, "--resume"],
                                                                 device), None)
    return finals


def check_finals(finals, world):
    full, mini = mode_cases(world)
    assert set(finals) == ({f"full {a}" for a, _ in full} | {f"mini {a}" for a, _ in mini}
                           | {"full resumed", "mini resumed"})
    for name, final in finals.items():
        assert torch.isfinite(torch.tensor(final["loss"])), name
        assert 0.0 <= final["test_acc"] <= 1.0, name


def records_of(prefix):
    out = []
    for path in glob.glob(prefix + ".*"):
        with open(path) as f:
            out += [json.loads(line) for line in f]
    return out


def test_every_mode_runs_when_asked_for_a_cuda_only_backend(tmp_path, monkeypatch):
    """Launched with ``cuda:gloo`` (NCCL's restriction), every mode runs: the launcher added a
    host route, and every collective of every mode went through the checked entry."""
    audit = str(tmp_path / "audit")
    monkeypatch.setenv(AUDIT_ENV, audit)
    try:
        finals = spawn(every_mode_body, 4, args=(str(tmp_path / "ckpt"),), backend=CUDA_ONLY,
                       timeout_s=600)[0]
    except SpawnError as e:
        pytest.fail(f"a mode broke on a CUDA-only group: {e}")
    check_finals(finals, 4)
    records = records_of(audit)
    assert records, "the audit recorded nothing"
    assert {r["backend"] for r in records} == {"cpu:gloo,cuda:gloo"}  # the host route added
    for r in records:
        assert set(r["devices"]) <= set(device_routes(r["backend"])), r
        assert r["caller"].startswith("gnnpar."), r
    phases = {r["phase"] for r in records}
    assert {"setup", "forward", "backward", "grad_sync", "control", "features"} <= phases
    callers = {r["caller"].split(":")[0] for r in records}
    # metric sums and the gradient sum of every runtime and engine: the one Reducer
    assert {"gnnpar.training.checkpoint", "gnnpar.launcher.watchdog", "gnnpar.interfaces"} <= callers
