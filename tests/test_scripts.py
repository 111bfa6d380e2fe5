"""Launcher scripts: every template and run_local.sh pass `bash -n`; their dry runs print
the command each knob should produce; run_local.sh really trains (spawn and pipeline)."""
import glob
import json
import os
import subprocess

import pytest

from .cli_util import ROOT
TEMPLATES = sorted(glob.glob(os.path.join(ROOT, "scripts", "slurm", "*.sbatch")))
RUN_LOCAL = os.path.join(ROOT, "scripts", "run_local.sh")


def clean_env(**over):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=ROOT, PYTHON="python3" if not over.get("PYTHON") else over["PYTHON"])
    env.update({k: str(v) for k, v in over.items()})
    return env


def dry(script, cwd, **knobs):
    res = subprocess.run(["bash", script], env=clean_env(DRY_RUN=1, **knobs), cwd=cwd,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [line.split() for line in res.stdout.splitlines() if line.strip()]


def test_all_templates_exist_and_parse():
    names = {os.path.basename(t) for t in TEMPLATES}
    assert names == {"single_node_gpu.sbatch", "multi_node_gpu.sbatch", "cpu_cluster.sbatch",
                     "partition_then_train.sbatch"}
    for script in TEMPLATES + [RUN_LOCAL]:
        res = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        assert res.returncode == 0, (script, res.stderr)
        text = open(script).read()
        assert "DRY_RUN" in text and "Knobs" in text, script  # documented at the top


def test_bash_n_catches_a_broken_script(tmp_path):
    bad = tmp_path / "bad.sbatch"
    bad.write_text(open(TEMPLATES[0]).read().replace("esac", "") + "\nif true; then\n")
    assert subprocess.run(["bash", "-n", str(bad)], capture_output=True).returncode != 0


def test_cpu_cluster_dry_run(tmp_path):
    (cmd,) = dry(os.path.join(ROOT, "scripts/slurm/cpu_cluster.sbatch"), tmp_path, ALGO="2d",
                 GRID="2x2", EPOCHS=7, DATASET="rmat:scale=10,ef=4", EXTRA_ARGS="--hidden 16")
    assert cmd[:2] == ["srun", "--kill-on-bad-exit=1"]
    assert cmd[2:5] == ["python3", "-m", "gnnpar.train"]
    flags = " ".join(cmd)
    for part in ("--algo 2d", "--grid 2x2", "--epochs 7", "--backend gloo", "--hidden 16",
                 r"--dataset rmat:scale=10\,ef=4"):
        assert part in flags
    (cmd,) = dry(os.path.join(ROOT, "scripts/slurm/cpu_cluster.sbatch"), tmp_path,
                 TRAIN_CMD="python3 probe.py", TRAIN_ARGS="--out x", SRUN_ARGS="-n 2")
    assert cmd == ["srun", "--kill-on-bad-exit=1", "-n", "2", "python3", "probe.py", "--out", "x"]


def test_gpu_templates_dry_run(tmp_path):
    (cmd,) = dry(os.path.join(ROOT, "scripts/slurm/single_node_gpu.sbatch"), tmp_path,
                 NPROC_PER_NODE=8, GRID="2x4")
    flags = " ".join(cmd)
    assert "torch.distributed.run --standalone --nnodes=1 --nproc-per-node=8" in flags
    assert "--grid 2x4" in flags and "--backend auto" in flags
    (cmd,) = dry(os.path.join(ROOT, "scripts/slurm/multi_node_gpu.sbatch"), tmp_path,
                 SLURM_JOB_NUM_NODES=3, SLURM_JOB_NODELIST="gpu[07-09]", NPROC_PER_NODE=2,
                 GRID="2x3", RDZV_PORT=29411)
    flags = " ".join(cmd)
    assert "srun --nodes=3 --ntasks-per-node=1" in flags
    assert "--rdzv-backend=c10d --rdzv-endpoint=gpu07:29411" in flags
    assert "--nnodes=3 --nproc-per-node=2" in flags and "--grid 2x3" in flags


def test_pipeline_dry_run(tmp_path):
    submit = dry(os.path.join(ROOT, "scripts/slurm/partition_then_train.sbatch"), tmp_path,
                 TRAIN_NODES=2, TRAIN_TASKS_PER_NODE=3)
    assert submit[0][:4] == ["env", "PHASE=partition", "PARTS=6", "sbatch"]
    assert submit[1][:3] == ["env", "PHASE=train", "sbatch"]
    assert any(a.startswith("--dependency=afterok") for a in submit[1])
    both = dry(os.path.join(ROOT, "scripts/slurm/partition_then_train.sbatch"), tmp_path,
               PHASE="both", SLURM_NTASKS=4, PARTITION_DIR="/shared/shards", GRID="2x2",
               ALGO="2d")
    assert both[0][:3] == ["srun", "--nodes=1", "--ntasks=1"]
    assert "gnnpar.cli.partition_cli" in both[0] and "--parts 4" in " ".join(both[0])
    assert "--grid 2x2" in " ".join(both[0])
    assert "--partition-dir /shared/shards" in " ".join(both[1])
    res = subprocess.run(["bash", os.path.join(ROOT, "scripts/slurm/partition_then_train.sbatch")],
                         env=clean_env(PHASE="nonsense"), cwd=tmp_path, capture_output=True,
                         text=True)
    assert res.returncode == 2 and "unknown PHASE" in res.stderr


def test_run_local_dry_run_modes(tmp_path):
    expect = {"spawn": ["python3", "-m", "gnnpar.train", "--nprocs", "3"],
              "torchrun": ["python3", "-m", "torch.distributed.run", "--standalone"],
              "mpirun": ["mpirun", "-n", "3", "python3", "-m", "gnnpar.train"]}
    for mode, head in expect.items():
        (cmd,) = dry(RUN_LOCAL, tmp_path, MODE=mode, NPROCS=3)
        assert cmd[:len(head)] == head, (mode, cmd)
    part, train = dry(RUN_LOCAL, tmp_path, MODE="pipeline", NPROCS=3)
    assert "gnnpar.cli.partition_cli" in part and "--partition-dir" in train
    res = subprocess.run(["bash", RUN_LOCAL], env=clean_env(MODE="x"), capture_output=True,
                         text=True)
    assert res.returncode == 2 and "unknown MODE" in res.stderr


@pytest.mark.parametrize("mode", ["spawn", "pipeline"])
def test_run_local_trains(tmp_path, mode):
    import sys
    res = subprocess.run(["bash", RUN_LOCAL], cwd=tmp_path, capture_output=True, text=True,
                         env=clean_env(MODE=mode, NPROCS=2, EPOCHS=2, PYTHON=sys.executable,
                                       DATASET="rmat:scale=8,ef=4"), timeout=300)
    assert res.returncode == 0, res.stderr
    recs = [json.loads(line) for line in open(tmp_path / "gnnpar-local.jsonl")]
    assert [r["epoch"] for r in recs[:-1]] == [0, 1] and recs[-1]["final"]
    assert recs[-1]["world_size"] == 2 and recs[-1]["algo"] == "1d-halo"
    if mode == "pipeline":
        assert sorted(os.listdir(tmp_path / "gnnpar-shards-local")) == [
            ".gnnpar-lock", ".gnnpar-owner.json", "meta.json", "part-00000", "part-00001"]


@pytest.mark.parametrize("sample_on", ["host", "device"])
def test_bench_minibatch_runs_on_cpu(tmp_path, sample_on):
    """scripts/bench_minibatch.py on a small graph: both measurements, a summary, the JSON."""
    import sys
    out = tmp_path / "b.jsonl"
    res = subprocess.run([sys.executable, "scripts/bench_minibatch.py", "--dataset",
                          "rmat:scale=9,ef=4", "--hidden", "16", "--batch-size", "64",
                          "--max-steps", "3", "--repeats", "1", "--resident", "2",
                          "--sample-on", sample_on, "--json", str(out)], cwd=ROOT,
                         capture_output=True, text=True, env=clean_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    recs = [json.loads(line) for line in open(out)]
    assert [r["what"] for r in recs] == ["end_to_end", "compute_only", "summary"]
    assert recs[0]["steps"] == recs[1]["steps"] == 3
    s = recs[-1]
    assert s["sample_on"] == sample_on and s["features_on"] == "host"
    assert s["end_to_end_mb_per_s"] > 0 and s["compute_only_mb_per_s"] > 0
    assert 0 <= s["stall_share"] <= 1 and "end-to-end epoch / compute-only" in res.stderr


def test_bench_step_products_counts_each_layers_products():
    """Layer 0 (8 -> 16, the input layer): 4 products of 2*50*8*16 flops (two forward, two
    weight gradients, no input gradient); layer 1 (16 -> 4, so the neighbour term projects
    its 50 sources): 2*20*16*4 for each self product, 2*50*16*4 for each neighbour one,
    input gradients included: 78,080 flops. Bad --layers are refused."""
    import sys
    cmd = [sys.executable, "scripts/bench_step_products.py", "--rounds", "1", "--repeats", "1"]
    res = subprocess.run(cmd + ["--layers", "50,80,8,16;20,50,16,4"], cwd=ROOT,
                         capture_output=True, text=True, env=clean_env(), timeout=120)
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout.strip().splitlines()[-1])
    assert rec["gflop"] == pytest.approx(78080 / 1e9)
    assert set(rec["threads"]) == {"1", "2"} and "load" in res.stdout
    bad = subprocess.run(cmd + ["--layers", "1,2,3"], cwd=ROOT, capture_output=True, text=True,
                         env=clean_env(), timeout=120)
    assert bad.returncode == 2 and "four positive integers" in bad.stderr


def test_bench_spmm_runs(tmp_path):
    import sys
    res = subprocess.run([sys.executable, "scripts/bench_spmm.py", "--dataset",
                          "rmat:scale=8,ef=4", "--widths", "8", "--repeats", "1"], cwd=ROOT,
                         capture_output=True, text=True, env=clean_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    row = json.loads(res.stdout.splitlines()[0])
    assert row["width"] == 8 and row["gnnpar_s"] > 0 and row["torch_s"] > 0
    assert row["torch_fresh_s"] > 0 and row["ratio_vs"] == "torch_s" and row["load"] >= 0


def test_bench_spmm_size_rule_runs(tmp_path):
    """--size-rule: one row per (graph, width), each naming the faster side and the rule's
    pick, then the best swept (min_width, min_work) per dtype."""
    import sys
    res = subprocess.run([sys.executable, "scripts/bench_spmm.py", "--size-rule",
                          "--rule-graphs", "rmat:scale=8,ef=4", "--rule-widths", "1,32",
                          "--repeats", "1", "--min-time", "0"], cwd=ROOT,
                         capture_output=True, text=True, env=clean_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["width"] for r in rows[:-1]] == [1, 32]
    assert all(r["faster"] in ("gnnpar", "torch") and r["rule"] in ("gnnpar", "torch")
               for r in rows[:-1])
    assert rows[-1]["what"] == "size_rule" and len(rows[-1]["best"]) == 2


def test_bench_dgl_dry_run_needs_no_dgl(tmp_path):
    """DGL is never a dependency: the driver plans its rounds without the side venv, and
    refuses to measure (exit 2, naming the setup command) when the venv is missing."""
    import sys
    base = [sys.executable, "scripts/bench_dgl.py", "--venv", str(tmp_path / "none")]
    dry = subprocess.run(base + ["--dry-run", "--rounds", "1"], cwd=ROOT, capture_output=True,
                         text=True, env=clean_env(), timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "full-batch step, scale 16" in dry.stdout + dry.stderr
    train = subprocess.run(base + ["--dry-run", "--rounds", "1", "--measures", "train"],
                           cwd=ROOT, capture_output=True, text=True, env=clean_env(),
                           timeout=120)
    assert train.returncode == 0, train.stderr
    assert "mini-batch SAGE epoch [15,10,5] b1024, scale 17, 2 threads" in train.stdout
    real = subprocess.run(base + ["--rounds", "1", "--measures", "step", "--scales", "8"],
                          cwd=ROOT, capture_output=True, text=True, env=clean_env(),
                          timeout=120)
    assert real.returncode == 2 and "bench_dgl.sh --setup" in real.stderr


def test_bench_rank_start_reports_every_variant():
    """scripts/bench_rank_start.py, one round of one rank: a rank CPU time for numba and its
    compiler set up in the fork server, for the compiler left out, for numba left out, and
    their medians."""
    import sys
    res = subprocess.run([sys.executable, "scripts/bench_rank_start.py", "--rounds", "1",
                          "--ranks", "1"], cwd=ROOT, capture_output=True, text=True,
                         env=clean_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [ln.split() for ln in res.stdout.splitlines() if "median rank CPU" in ln]
    assert [r[0] for r in rows] == ["with", "unwarmed", "without"]
    assert all(0 < float(r[4]) < 60 for r in rows) and "load" in res.stdout


def test_bench_bf16_dense_times_every_side():
    """scripts/bench_bf16_dense.py, one round of one epoch on a small graph: the three training
    runs (bf16 with each dense product, fp32), the probe's products, the ratio and the JSON
    line with the commit and the load."""
    import json
    import sys
    res = subprocess.run([sys.executable, "scripts/bench_bf16_dense.py", "--dataset",
                          "sbm:n=300,blocks=3,p_in=0.05,p_out=0.005,feat=8,seed=0",
                          "--epochs", "1", "--rounds", "1", "--threads", "1"], cwd=ROOT,
                         capture_output=True, text=True, env=clean_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    medians = [ln.split() for ln in res.stdout.splitlines() if " median " in ln]
    assert [m[0] for m in medians] == ["train_bf16_gemm", "train_fp32_gemms", "train_fp32_run"]
    assert all(0 <= float(m[5]) <= 1 for m in medians)  # test accuracies
    assert "train_fp32_gemms / train_bf16_gemm = " in res.stdout
    record = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(record["times_s"]) == {m[0] for m in medians}
    assert all(len(t) == 1 and t[0] > 0 for t in record["times_s"].values())
    [probe] = record["probes"]
    assert probe and all(native > 0 and up > 0 for native, up in probe.values())
    assert record["commit"] and record["threads"] == 1 and record["load_end"] >= 0


def test_bench_server_fork_times_both_starts():
    """scripts/bench_server_fork.py, one round: a forked and a new-interpreter server's run,
    each with its tree's CPU and wall seconds, the medians and the load."""
    import sys
    res = subprocess.run([sys.executable, "scripts/bench_server_fork.py", "--rounds", "1"],
                         cwd=ROOT, capture_output=True, text=True, env=clean_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    medians = [ln.split() for ln in res.stdout.splitlines() if " median " in ln]
    assert [m[0] for m in medians] == ["forked", "interpreter"]
    assert all(0 < float(m[3]) < 120 for m in medians), res.stdout
    assert "load" in res.stdout.splitlines()[0]
