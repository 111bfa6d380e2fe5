"""gnnpar.launcher.bootstrap: launcher detection from fake environments, backend choice, and real
mpirun / torchrun launches of tests/rank_probe.py (2 ranks, gloo all-reduce + 1D SpMM)."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from gnnpar.launcher import bootstrap
from gnnpar.launcher.bootstrap import (WorldInfo, detect_world, expand_hostlist, first_host,
                                       init_distributed, resolve_backend, shutdown, slurm_port)
from gnnpar.datasets import InputError

from .cli_util import ROOT
from .required import missing as missing_part
PROBE = os.path.join(ROOT, "tests", "rank_probe.py")


# ------------------------------------------------------------------ host lists
@pytest.mark.parametrize("text, hosts", [
    ("node[01-03,7],other", ["node01", "node02", "node03", "node7", "other"]),
    ("a1", ["a1"]),
    ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("r[1-2]-n[1,3]", ["r1-n1", "r1-n3", "r2-n1", "r2-n3"]),
    ("x[1-2].cluster,y", ["x1.cluster", "x2.cluster", "y"]),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["node[1-3", "node1-3]", "node[3-1]", "node[a-b]", "", "n[[1]]"])
def test_expand_hostlist_rejects_malformed(bad):
    with pytest.raises(ValueError):
        expand_hostlist(bad)


def test_first_host_without_scontrol(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert first_host("node[01-03,7],other") == "node01"
    with pytest.raises(InputError, match="MASTER_ADDR"):
        first_host("node[1-")


# ------------------------------------------------------------------ detection
def slurm_env(**over):
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
           "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_JOB_ID": "4242",
           "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "login,cn[01-02]",
           "SLURM_STEP_NODELIST": "cn[01-02]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    env.update(over)
    return {k: v for k, v in env.items() if v is not None}


def test_torchrun_variables_come_first():
    env = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "h0", "MASTER_PORT": "29500", **slurm_env()}
    info = detect_world(env=env)
    assert info == WorldInfo(2, 4, 0, "h0", 29500, "torchrun", 2)
    assert info.launched and info.init_method == "env://"


def test_slurm_task():
    info = detect_world(env=slurm_env())
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert info.source == "slurm" and info.master_addr == "cn01"  # the step's, not the job's
    assert info.master_port == slurm_port("4242", "0")
    assert info.init_method == f"tcp://cn01:{info.master_port}"


def test_slurm_port_is_stable_and_differs_between_jobs_and_steps():
    ports = {slurm_port(str(j), str(s)) for j in range(100, 140) for s in range(2)}
    assert len(ports) == 80
    assert all(bootstrap.SLURM_PORT_BASE <= p < 32768 for p in ports)
    assert slurm_port("4242", "1") == slurm_port("4242", "1")


def test_slurm_falls_back_to_job_nodelist_and_honours_master_overrides():
    env = slurm_env(SLURM_STEP_NODELIST=None, SLURM_STEP_NUM_TASKS=None)
    info = detect_world(env=env)
    assert info.master_addr == "login" and info.world_size == 4
    env = slurm_env(MASTER_ADDR="10.1.2.3", MASTER_PORT="23456")
    info = detect_world(env=env)
    assert (info.master_addr, info.master_port) == ("10.1.2.3", 23456)


def test_slurm_batch_script_is_not_a_rank():
    # the batch script of an sbatch --ntasks=4 job carries SLURM_PROCID=0 but is no task
    for step in (None, "batch", "4294967294"):
        env = slurm_env(SLURM_PROCID="0", SLURM_STEP_ID=step, SLURM_STEP_NUM_TASKS=None,
                        SLURM_STEP_NODELIST=None)
        assert detect_world(env=env).source == "single"
        assert detect_world(2, env=env).source == "local"
    assert detect_world(env=slurm_env(SLURM_STEP_ID=None, SLURM_STEPID="0")).source == "slurm"


def test_slurm_without_any_nodelist_is_a_clear_error():
    env = slurm_env(SLURM_STEP_NODELIST=None, SLURM_JOB_NODELIST=None)
    with pytest.raises(InputError, match="MASTER_ADDR"):
        detect_world(env=env)


def test_mpi_detection_dispatch(monkeypatch):
    seen = []

    def fake(env):
        seen.append(env)
        return WorldInfo(1, 2, 1, "127.0.0.1", 1234, "mpi", 2)

    monkeypatch.setattr(bootstrap, "_from_mpi", fake)
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        assert detect_world(env={var: "1"}).source == "mpi"
    # srun --mpi=pmi2: both agree, SLURM wins and needs no mpi4py
    assert detect_world(env=slurm_env(PMI_RANK="3", PMI_SIZE="4")).source == "slurm"
    # mpirun inside an allocation: inherited SLURM_PROCID=0 disagrees with MPI's numbering
    assert detect_world(env=slurm_env(SLURM_PROCID="0", PMI_RANK="1", PMI_SIZE="2")).source \
        == "mpi"
    assert len(seen) == 4


def test_mpi_without_mpi4py_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(InputError, match="mpi4py"):
        detect_world(env={"PMI_RANK": "0", "PMI_SIZE": "2"})


def test_local_and_single():
    assert detect_world(env={}) == WorldInfo(0, 1, 0, None, None, "single", 1)
    local = detect_world(4, env={})
    assert (local.source, local.world_size, local.launched) == ("local", 4, False)
    with pytest.raises(InputError, match="--nprocs"):
        detect_world(0, env={})


def test_nprocs_under_a_multi_rank_launcher_is_refused():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    with pytest.raises(InputError, match="drop --nprocs"):
        detect_world(2, env=env)
    one = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert detect_world(3, env=one).source == "local"


@pytest.mark.parametrize("env, match", [
    ({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "not within"),
    ({"RANK": "x", "WORLD_SIZE": "4"}, "not an integer"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR"),
])
def test_bad_launcher_values(env, match):
    with pytest.raises(InputError, match=match):
        detect_world(env=env)


def test_reads_os_environ_by_default(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("SLURM_", "PMI_", "OMPI_", "PMIX_")) or k in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_ADDR", "a")
    monkeypatch.setenv("MASTER_PORT", "5")
    assert detect_world().rank == 1


# ------------------------------------------------------------------ backend and devices
def fake_gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_backend_auto_uses_nccl_only_when_each_rank_owns_a_gpu(monkeypatch):
    two_local = WorldInfo(1, 4, 1, "h", 1, "torchrun", 2)
    fake_gpus(monkeypatch, 2)
    assert resolve_backend("auto", two_local) == ("nccl", 1)
    fake_gpus(monkeypatch, 1)
    assert resolve_backend("auto", two_local) == ("gloo", None)
    with pytest.raises(InputError, match="one GPU per rank"):
        resolve_backend("nccl", two_local)
    fake_gpus(monkeypatch, 0)
    assert resolve_backend("auto", two_local) == ("gloo", None)
    assert resolve_backend("gloo", two_local) == ("gloo", None)


def test_slurm_gpus_per_task_binding(monkeypatch):
    fake_gpus(monkeypatch, 1)
    info = WorldInfo(1, 2, 1, "h", 1, "slurm", 2)
    assert resolve_backend("auto", info) == ("gloo", None)
    monkeypatch.setenv("SLURM_GPUS_PER_TASK", "1")
    assert resolve_backend("auto", info) == ("nccl", 0)


def test_backend_refusals():
    info = WorldInfo(0, 1, 0, None, None, "single", 1)
    if not torch.distributed.is_mpi_available():
        with pytest.raises(InputError, match="no MPI backend"):
            resolve_backend("mpi", info)
    with pytest.raises(InputError, match="unknown --backend"):
        resolve_backend("ucx", info)


def test_init_single_world_and_local_parent():
    info = detect_world(env={})
    ctx = init_distributed(info, "gloo", timeout=10)
    try:
        t = torch.tensor([5.0])
        torch.distributed.all_reduce(t)
        assert (ctx.backend, str(ctx.device), float(t[0])) == ("gloo", "cpu", 5.0)
        assert torch.distributed.get_world_size() == 1
    finally:
        shutdown()
    shutdown()  # twice is fine
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="children"):
        init_distributed(detect_world(2, env={}))


# ------------------------------------------------------------------ real launchers
def clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PMI_", "OMPI_", "PMIX_", "MASTER_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def read_probe(out, world):
    recs = []
    for r in range(world):
        with open(os.path.join(out, f"rank-{r}.json")) as fh:
            recs.append(json.load(fh))
    return recs


def check_probe(recs, source, world):
    assert [r["rank"] for r in recs] == list(range(world))
    assert {r["source"] for r in recs} == {source}
    assert {r["world_size"] for r in recs} == {world}
    assert {r["all_reduce"] for r in recs} == {world * (world + 1) / 2}
    assert len({r["pid"] for r in recs}) == world
    assert max(r["z_err"] for r in recs) < 1e-5
    assert max(r["dh_err"] for r in recs) < 1e-5
    # shutdown freed the groups: nothing of them is left for interpreter exit to tear down
    assert all(r["released"] == {"groups_freed": True, "threads": []} for r in recs), \
        [r["released"] for r in recs]


def _optimizer_refs_to_world(rank, world):
    """How many references to the world group building a torch optimizer adds (kept for
    good if torch._dynamo is first imported then: the group outlives its destruction)."""
    import torch.distributed as dist
    before = sys.getrefcount(dist.group.WORLD)
    torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
    return sys.getrefcount(dist.group.WORLD) - before


def test_spawned_trainer_ranks_import_dynamo_before_joining():
    from gnnpar.launcher.spawn import spawn
    assert spawn(_optimizer_refs_to_world, 2, dynamo_first=True, timeout_s=120) == [0, 0]


def mpirun_or_skip():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        missing_part("mpi4py is not installed (pip install mpi4py mpich)")
    exe = shutil.which("mpirun") or shutil.which("mpiexec")
    if exe is None:
        missing_part("no mpirun on PATH (pip install mpich)")
    return exe


def test_mpirun_two_ranks(tmp_path):
    exe = mpirun_or_skip()
    res = subprocess.run([exe, "-n", "2", sys.executable, PROBE, "--out", str(tmp_path)],
                         env=clean_env(), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    recs = read_probe(tmp_path, 2)
    check_probe(recs, "mpi", 2)
    assert [r["local_rank"] for r in recs] == [0, 1]
    assert len({r["master"] for r in recs}) == 1
    # a second detection (launch detects twice) gives the same world through the same store
    assert all(r["detected_again"] and r["mpi_stores"] == 1 for r in recs), recs


def test_torchrun_two_ranks(tmp_path):
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(bootstrap.free_port("127.0.0.1")), PROBE,
                          "--out", str(tmp_path)],
                         env=clean_env(), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    recs = read_probe(tmp_path, 2)
    check_probe(recs, "torchrun", 2)
    assert [r["local_rank"] for r in recs] == [0, 1]
