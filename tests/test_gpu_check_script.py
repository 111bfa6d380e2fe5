"""scripts/gpu_check.sh --dry-run lists every row of the GPU check without running anything:
the CUDA tests, serial and every full-batch algorithm at world size 1 on NCCL (each with a
--resume row), at 2 and 4 ranks on gloo, the four mini-batch rows, three GAT rows and the
benchmarks (GAT's among them); every
training command passes gnnpar-train's own flag checks (no training here)."""
import math
import argparse
import os
import shlex
import subprocess
import sys

import pytest

from gnnpar.cli.options import build_parser, check_args
from gnnpar.cli.spec import RunSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGOS = ("1d", "1d-halo", "1.5d", "2d", "3d", "4d")


def dry_run(*flags, **env):
    res = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", *flags], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHON": sys.executable, **env})
    assert res.returncode == 0, res.stderr
    rows = {}
    for line in res.stdout.splitlines():
        name, mode, algo, backend, world, cmd = [c.strip() for c in line.split(" | ", 5)]
        rows[name] = dict(mode=mode, backend=backend, world=world, cmd=cmd,
                          argv=[] if cmd.startswith("SKIP") else shlex.split(cmd))
    return rows


def train_args(argv):
    """The gnnpar-train part of a row's command, parsed and checked as the CLI would."""
    assert argv[:4] == ["timeout", "-k", "10", argv[3]] and argv[5:7] == ["-m", "gnnpar.train"]
    args = build_parser().parse_args(argv[7:])
    check_args(args)
    if args.mode == "fullbatch" and args.nprocs:
        on_cpu = argparse.Namespace(**{**vars(args), "device": "cpu"})  # no GPU here
        RunSpec.from_args(on_cpu).grid_shape(args.nprocs)
    return args


@pytest.fixture(scope="module")
def cuda_rows():
    return dry_run()


def test_rows_cover_every_mode(cuda_rows):
    rows = cuda_rows
    tests = rows["cuda-tests"]["cmd"]
    assert "pytest" in tests and "-m cuda tests/test_cuda.py" in tests
    serial = train_args(rows["fb-serial"]["argv"])
    assert (serial.algo, serial.nprocs, serial.device, serial.mode) == ("serial", None, "cuda",
                                                                        "fullbatch")
    for algo in ALGOS:
        first = train_args(rows[f"fb-{algo}-w1-nccl"]["argv"])
        again = train_args(rows[f"fb-{algo}-w1-nccl-resume"]["argv"])
        for a in (first, again):
            assert (a.algo, a.nprocs, a.backend, a.device) == (algo, 1, "nccl", "cuda")
        assert first.checkpoint_dir and again.checkpoint_dir == first.checkpoint_dir
        assert not first.resume and again.resume and again.epochs > first.epochs
        assert again.log_json == first.log_json  # the resumed run appends to the same log
        for world in (2, 4):
            a = train_args(rows[f"fb-{algo}-w{world}-gloo"]["argv"])
            assert (a.algo, a.nprocs, a.backend, a.device) == (algo, world, "gloo", "cuda")
            assert a.partitioner == "random"
            if algo in ("2d", "3d", "4d"):
                assert math.prod(int(d) for d in a.grid.split("x")) == world
    mb = {n: train_args(rows[n]["argv"]) for n in
          ("mb-serial", "mb-dp-w2", "mb-1d-halo-g2-w4", "mb-4d-w4")}
    assert all(a.mode == "minibatch" and a.device == "cuda" and a.fanouts == "10,5"
               for a in mb.values())
    assert mb["mb-serial"].nprocs is None
    assert (mb["mb-dp-w2"].nprocs, mb["mb-dp-w2"].backend) == (2, "gloo")
    g = mb["mb-1d-halo-g2-w4"]
    assert (g.nprocs, g.group_size, g.algo, g.backend) == (4, 2, "1d-halo", "gloo")
    d = mb["mb-4d-w4"]
    assert (d.nprocs, d.algo, d.grid, d.backend) == (4, "4d", "2x1x2x1", "gloo")
    gat = {n: train_args(rows[n]["argv"]) for n in ("fb-gat-serial", "fb-gat-2d-w2",
                                                     "mb-gat-dp-w2")}
    assert all(a.model == "gat" and a.heads == 4 and a.device == "cuda" for a in gat.values())
    assert (gat["fb-gat-2d-w2"].algo, gat["fb-gat-2d-w2"].nprocs) == ("2d", 2)
    assert gat["mb-gat-dp-w2"].mode == "minibatch"
    assert "scripts/bench_single.py --model gat" in rows["bench-gat"]["cmd"]
    assert "--device cuda" in rows["bench-gat"]["cmd"]
    bench = rows["bench-single"]["cmd"]
    assert "scripts/bench_single.py" in bench and "rmat:scale=20,ef=16" in bench
    assert "--device cuda" in bench
    assert "scripts/bench_minibatch.py" in rows["bench-minibatch"]["cmd"]
    assert "--device cuda" in rows["bench-minibatch"]["cmd"]
    # only world size 1 runs NCCL (NCCL refuses two ranks on one GPU)
    assert {r["world"] for r in rows.values() if r["backend"] == "nccl"} == {"1"}
    assert len([r for r in rows.values() if r["argv"]]) == 1 + 1 + 12 + 12 + 4 + 3 + 4
    assert "--device cuda" in rows["bench-spmm"]["cmd"]


@pytest.mark.parametrize("how", [("--cpu",), {"GPU_CHECK_DEVICE": "cpu"}])
def test_cpu_mode_uses_gloo_and_skips_gpu_rows(how, cuda_rows):
    rows = dry_run(*how) if isinstance(how, tuple) else dry_run(**how)
    assert rows["cuda-tests"]["cmd"].startswith("SKIP")
    assert rows["bench-single"]["cmd"].startswith("SKIP")
    trained = [train_args(r["argv"]) for r in rows.values() if "gnnpar.train" in r["cmd"]]
    assert len(trained) == len([r for r in cuda_rows.values() if "gnnpar.train" in r["cmd"]])
    assert all(a.device == "cpu" and a.backend in ("gloo", "auto") for a in trained)
