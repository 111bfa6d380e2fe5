"""The SLURM templates run for real on a one-node cluster (tests/slurm_fixture.py).

- cpu_cluster.sbatch, 2 srun tasks running tests/rank_probe.py: each task finds its rank,
  the world and the master through gnnpar.launcher.bootstrap's SLURM path, then a gloo all-reduce and
  a 1D SpMM checked against serial;
- cpu_cluster.sbatch with the real trainer (`srun python -m gnnpar.train --algo 1d-halo`),
  once gnnpar-train reads its world through gnnpar.launcher.bootstrap;
- single_node_gpu.sbatch on CPU (torchrun, 2 ranks, gloo): the real trainer's JSON log.
"""
import json
import os
import sys


from gnnpar.launcher.bootstrap import slurm_port

from .slurm_fixture import slurm_cluster  # noqa: F401  (the fixture)

from .cli_util import ROOT
TEMPLATES = os.path.join(ROOT, "scripts", "slurm")
SMALL = ["--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=1",
         "--time=00:10:00"]


def job_env(**knobs):
    env = {"PYTHONPATH": ROOT, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "TORCH_CPP_LOG_LEVEL": "ERROR"}
    env.update({k: str(v) for k, v in knobs.items()})
    return env


def test_cpu_cluster_template_probe(slurm_cluster, tmp_path):
    out = tmp_path / "probe"
    code, job, log = slurm_cluster.sbatch_wait(
        os.path.join(TEMPLATES, "cpu_cluster.sbatch"), SMALL, cwd=str(tmp_path),
        env=job_env(TRAIN_CMD=f"{sys.executable} {ROOT}/tests/rank_probe.py",
                    TRAIN_ARGS=f"--out {out} --timeout 60"))
    assert code == 0, log + slurm_cluster.logs()
    assert f"gnnpar-cpu: job {job}, 2 tasks" in log
    recs = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["source"] for r in recs] == ["slurm", "slurm"]
    assert [(r["rank"], r["world_size"], r["local_rank"]) for r in recs] == [(0, 2, 0), (1, 2, 1)]
    assert {r["master"] for r in recs} == {f"{slurm_cluster.host}:{slurm_port(job, '0')}"}
    assert {r["all_reduce"] for r in recs} == {3.0}
    assert max(r["z_err"] for r in recs) < 1e-5 and max(r["dh_err"] for r in recs) < 1e-5
    assert len({r["pid"] for r in recs}) == 2


def test_cpu_cluster_template_trains(slurm_cluster, tmp_path):
    code, job, log = slurm_cluster.sbatch_wait(
        os.path.join(TEMPLATES, "cpu_cluster.sbatch"), SMALL, cwd=str(tmp_path),
        env=job_env(ALGO="1d-halo", EPOCHS=2, TIMEOUT=60, LOG_JSON=str(tmp_path / "log.jsonl"),
                    DATASET="rmat:scale=8,ef=4"))
    assert code == 0, log + slurm_cluster.logs()
    recs = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    assert [r["epoch"] for r in recs[:-1]] == [0, 1] and recs[-1]["final"]
    assert recs[-1]["world_size"] == 2 and recs[-1]["algo"] == "1d-halo"


def test_single_node_template_on_cpu(slurm_cluster, tmp_path):
    # the fixture's node has no GPUs: drop the template's GPU request, run 2 gloo ranks
    script = tmp_path / "single_node_cpu.sbatch"
    text = open(os.path.join(TEMPLATES, "single_node_gpu.sbatch")).read()
    assert "#SBATCH --gpus-per-node=4\n" in text
    script.write_text(text.replace("#SBATCH --gpus-per-node=4\n", ""))
    code, job, log = slurm_cluster.sbatch_wait(
        str(script), ["--nodes=1", "--ntasks=1", "--cpus-per-task=2", "--time=00:10:00"],
        cwd=str(tmp_path),
        env=job_env(NPROC_PER_NODE=2, ALGO="1d-halo", GRID="", EPOCHS=2, DEVICE="cpu",
                    BACKEND="gloo", TIMEOUT=60, LOG_JSON=str(tmp_path / "log.jsonl"),
                    DATASET="rmat:scale=8,ef=4"))
    assert code == 0, log + slurm_cluster.logs()
    assert f"gnnpar-1node: job {job}, 2 ranks" in log
    recs = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    assert [r["epoch"] for r in recs[:-1]] == [0, 1] and recs[-1]["final"]
    assert recs[-1]["world_size"] == 2


def test_failing_job_reports_failure(slurm_cluster, tmp_path):
    code, job, log = slurm_cluster.sbatch_wait(
        os.path.join(TEMPLATES, "cpu_cluster.sbatch"), SMALL, cwd=str(tmp_path),
        env=job_env(TRAIN_CMD="false", TRAIN_ARGS=""))
    assert code != 0 and job
