#!/usr/bin/env python
"""Rows, runner and table of scripts/gpu_check.sh (read its header). No torch import here."""
import argparse
import concurrent.futures as cf
import glob
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
FB = ["--dataset", "rmat:scale=15,ef=8", "--hidden", "64", "--layers", "3", "--quiet"]
MB = ["--mode", "minibatch", "--fanouts", "10,5", "--batch-size", "256", "--layers", "2",
      "--dataset", "rmat:scale=14,ef=8", "--epochs", "4", "--hidden", "64", "--quiet"]
EPOCHS, RESUME_EPOCHS = 5, 8  # full batch: a run, then a resumed run continuing to 8
#: algorithm -> its --grid (2d/3d/4d) or 1.5d's --replication at world sizes 1, 2, 4; only the
#: flags an algorithm reads are passed (gnnpar-train refuses the others)
FULL = {"1d": None, "1d-halo": None, "1.5d": ("1", "1", "2"), "2d": ("1x1", "2x1", "2x2"),
        "3d": ("1x1x1", "1x2x1", "1x2x2"), "4d": ("1x1x1x1", "1x1x2x1", "1x1x2x2")}


def rows(dev, out, work):
    train = [PY, "-m", "gnnpar.train", "--device", dev]
    nccl = "nccl" if dev == "cuda" else "gloo"
    R = []

    def row(name, mode, algo, backend, world, cmd, kind="train", timeout=120, why="--cpu mode",
            **kw):
        kw.setdefault("log", f"{out}/rows/{name}.jsonl")
        cmd = cmd + ["--log-json", kw["log"]] if kind in ("train", "resume") else cmd
        R.append(dict(name=name, mode=mode, algo=algo, backend=backend, world=world, cmd=cmd,
                      kind=kind, timeout=timeout, skip_why=why, **kw))
    row("cuda-tests", "tests", "test_cuda.py", "nccl+gloo", "1,2,4",
        [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "tests/test_cuda.py"],
        kind="tests" if dev == "cuda" else "skip", timeout=240)
    row("fb-serial", "fullbatch", "serial", "-", 1, train + FB + ["--epochs", str(EPOCHS)])
    for world in (1, 2, 4):
        for algo, grids in FULL.items():
            g = grids[(1, 2, 4).index(world)] if grids else None
            label = algo if g is None else f"{algo} c{g}" if algo == "1.5d" else f"{algo} {g}"
            flags = [] if g in (None, "1") else [
                "--replication" if algo == "1.5d" else "--grid", g]
            backend = nccl if world == 1 else "gloo"
            name = f"fb-{algo}-w{world}-{backend}"
            cmd = train + FB + ["--algo", algo, "--nprocs", str(world), "--backend", backend,
                                "--partitioner", "random", "--timeout", "100"] + flags
            ck = os.path.join(work, name + "-ckpt")  # world 1: checkpoint, resume with more epochs
            row(name, "fullbatch", label, backend, world,
                cmd + ["--epochs", str(EPOCHS)] + (["--checkpoint-dir", ck] if world == 1 else []))
            if world == 1:
                row(name + "-resume", "fb resume", label, backend, 1,
                    cmd + ["--epochs", str(RESUME_EPOCHS), "--checkpoint-dir", ck, "--resume"],
                    kind="resume", ckpt=ck, log=R[-1]["log"], after=name)
    dist = ["--backend", "gloo", "--partitioner", "random", "--timeout", "100"]
    row("mb-serial", "minibatch", "serial", "-", 1, train + MB)
    row("mb-dp-w2", "minibatch", "data parallel", "gloo", 2, train + MB + ["--nprocs", "2"] + dist)
    row("mb-1d-halo-g2-w4", "minibatch", "1d-halo g2", "gloo", 4,
        train + MB + ["--nprocs", "4", "--group-size", "2", "--algo", "1d-halo"] + dist)
    row("mb-4d-w4", "minibatch", "4d 2x1x2x1", "gloo", 4,
        train + MB + ["--algo", "4d", "--grid", "2x1x2x1", "--nprocs", "4"] + dist)
    # GAT (issue 26): full batch serial and 2d on 2 ranks, data-parallel mini batch
    gat = ["--model", "gat", "--heads", "4"]
    row("fb-gat-serial", "fullbatch", "gat serial", "-", 1,
        train + FB + gat + ["--epochs", str(EPOCHS)])
    row("fb-gat-2d-w2", "fullbatch", "gat 2d 2x1", "gloo", 2,
        train + FB + gat + ["--epochs", str(EPOCHS), "--algo", "2d", "--grid", "2x1",
                            "--nprocs", "2"] + dist)
    row("mb-gat-dp-w2", "minibatch", "gat data parallel", "gloo", 2,
        train + MB + gat + ["--nprocs", "2"] + dist)
    row("bench-single", "bench", "serial vs PyG", "-", 1,
        [PY, "scripts/bench_single.py", "--dataset",
         os.environ.get("GPU_BENCH_DATASET", "rmat:scale=20,ef=16"), "--device", dev,
         "--warmup", "3", "--repeats", "7"], kind="bench" if dev == "cuda" else "skip",
        timeout=240)
    # issue 26's GPU figure: GAT (2 layers, 4 heads x 64) step vs PyG GATConv
    row("bench-gat", "bench", "gat vs PyG", "-", 1,
        [PY, "scripts/bench_single.py", "--model", "gat", "--dataset",
         os.environ.get("GPU_BENCH_DATASET", "rmat:scale=20,ef=16"), "--device", dev,
         "--warmup", "2", "--repeats", "5", "--rounds", "1", "--skip", "dgl"],
        kind="bench" if dev == "cuda" else "skip", timeout=240)
    # issue 11's figures: end to end vs compute only, 3-layer SAGE, 15,10,5, batch 1024
    row("bench-minibatch", "bench", "minibatch e2e vs compute", "-", 1,
        [PY, "scripts/bench_minibatch.py", "--device", dev, "--repeats", "2", "--json",
         f"{out}/bench_minibatch.jsonl"], timeout=240, kind="bench" if dev == "cuda" else "skip")
    # issue 14's kernel figures: Triton vs cuSPARSE at widths 64-512, fp32 and bf16 features
    row("bench-spmm", "bench", "triton vs cusparse", "-", 1,
        [PY, "scripts/bench_spmm.py", "--device", dev, "--dataset", "rmat:scale=20,ef=16",
         "--widths", "64,256,512", "--repeats", "3", "--sweep"], timeout=240,
        kind="bench" if dev == "cuda" else "skip")
    return R


def epoch_time(path, first=0):
    """(every epoch record of the run's JSON log, median epoch_s of epochs after ``first``,
    the first epoch this run trained: 0, or where a resumed run continued)."""
    eps = [r for r in (json.loads(line) for line in open(path) if line.strip())
           if not r.get("final")]
    mine = [r for r in eps if r["epoch"] > first]
    return eps, statistics.median(r["epoch_s"] for r in mine) if mine else None


def ckpt_epoch(ck):
    steps = [int(os.path.basename(p)[5:-3]) for p in glob.glob(f"{ck}/rank-00000/ckpt-*.pt")]
    return max(steps) if steps else None


def run_row(r, a, lock, deadline):
    left = deadline - time.time() - (0 if r["kind"] == "bench" else a.bench_reserve)
    if r["kind"] == "skip":
        return r.update(status="skipped: " + r["skip_why"], ok=True, t="-")
    if left < 10:
        return r.update(status="FAIL: budget", ok=False, t="-")
    before = ckpt_epoch(r["ckpt"]) if r["kind"] == "resume" else None
    cmd = ["timeout", "-k", "10", str(int(min(r["timeout"], left)))] + r["cmd"]
    t0 = time.time()
    with open(os.path.join(a.out, "rows", r["name"] + ".log"), "w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, errors="replace")
        for line in p.stdout:
            f.write(line)
            if r["kind"] == "bench":  # the bench runs alone: show it as it goes
                sys.stdout.write(line)
        rc = p.wait()
    wall, t = time.time() - t0, None
    r.update(ok=rc == 0, status="ok" if rc == 0 else f"FAIL rc={rc}" + (
        " (timeout)" if rc in (124, 137) else ""))
    try:
        if r["kind"] in ("tests", "bench"):
            t = wall
            if r["name"] == "bench-single":
                t = json.loads(open(f.name).read().strip().splitlines()[-1])["gnnpar"]["epoch_s"]
        elif rc == 0:
            resumed = r["kind"] == "resume" and before is not None
            eps, t = epoch_time(r["log"], before + 1 if resumed else 0)
            if r["kind"] == "resume":
                # --resume cuts the log back to the checkpoint: every epoch once, in order
                got = [e["epoch"] for e in eps]
                if not resumed or got != list(range(RESUME_EPOCHS)):
                    r.update(ok=False, status=f"FAIL: log epochs {got[:8]}, checkpoint "
                                              f"epoch {before}")
    except Exception as e:  # noqa: BLE001 - a missing/odd log fails the row, not the script
        r.update(ok=False, status=f"FAIL rc={rc} ({type(e).__name__}: {e})"[:60])
    r["t"] = "-" if t is None else f"{t:.3f}s"
    with lock, open(os.path.join(a.out, "gpu_check.log"), "a") as log:
        log.write(f"\n===== {r['name']}: {shlex.join(cmd)}\n{open(f.name).read()}"
                  f"----- {r['name']}: {r['status']} (wall {wall:.1f}s)\n")
        print(f"[{time.time() - a.t0:6.1f}s] {r['name']}: {r['status']}", flush=True)


def table(R):
    head = ("row", "mode", "algorithm", "backend", "world", "status", "epoch time")
    lines = [(r["name"], r["mode"], r["algo"], r["backend"], str(r["world"]), r["status"],
              r.get("t", "-")) for r in R]
    w = [max(len(x[i]) for x in [head] + lines) for i in range(len(head))]
    fmt = lambda x: " | ".join(c.ljust(n) for c, n in zip(x, w)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), "-+-".join("-" * n for n in w)] + [fmt(x) for x in lines])


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--cpu", action="store_true")
    a = p.parse_args()
    a.dry_run |= os.environ.get("GPU_CHECK_DRY_RUN", "") not in ("", "0")
    a.cpu |= os.environ.get("GPU_CHECK_DEVICE", "cuda") == "cpu"
    dev = "cpu" if a.cpu else "cuda"
    a.out = os.environ.get("OUT", "/tmp/gnnpar-gpu")
    a.jobs = int(os.environ.get("GPU_CHECK_JOBS", "2" if a.cpu else "4"))
    a.budget = float(os.environ.get("GPU_CHECK_BUDGET", "1800" if a.cpu else "450"))
    a.bench_reserve = 0 if a.cpu else 150
    work = "$WORK" if a.dry_run else tempfile.mkdtemp(prefix="gnnpar-gpu-check-")
    R = rows(dev, a.out, work)
    if a.dry_run:
        for r in R:
            print(" | ".join([r["name"], r["mode"], r["algo"], r["backend"], str(r["world"]),
                              "SKIP " + r["skip_why"] if r["kind"] == "skip" else
                              f"timeout -k 10 {r['timeout']} " + shlex.join(r["cmd"])]))
        return 0
    shutil.rmtree(os.path.join(a.out, "rows"), ignore_errors=True)
    os.makedirs(os.path.join(a.out, "rows"))
    gpu = "" if a.cpu else subprocess.run(
        "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv", shell=True,
        capture_output=True, text=True).stdout
    for path in ("gpu.txt", "gpu_check.log"):
        print(gpu, end="", file=open(os.path.join(a.out, path), "w"))
    print(gpu, end="")
    a.t0, lock = time.time(), threading.Lock()
    deadline = a.t0 + a.budget
    # resume rows follow their checkpointing row in one chain; the benches run alone at the end
    chains = [[r] + [s for s in R if s.get("after") == r["name"]] for r in R
              if r["kind"] in ("tests", "train", "skip") and "after" not in r]
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        list(ex.map(lambda c: [run_row(r, a, lock, deadline) for r in c], chains))
    for r in R:
        if r["kind"] == "bench":
            run_row(r, a, lock, deadline)
    shutil.rmtree(work, ignore_errors=True)  # the checkpoints
    text = table(R) + f"\n{dev}: {sum(not r['ok'] for r in R)} failed row(s), " \
                      f"{time.time() - a.t0:.0f}s (jobs {a.jobs}; epoch time: median epoch_s " \
                      f"without the first epoch; tests: wall; bench: gnnpar s/epoch)\n"
    print(text, end="", file=open(os.path.join(a.out, "table.txt"), "w"))
    print("\n" + text, end="", file=open(os.path.join(a.out, "gpu_check.log"), "a"))
    print("\n" + text, end="")
    return int(any(not r["ok"] for r in R))


if __name__ == "__main__":
    sys.exit(main())
