#!/usr/bin/env python
"""gnnpar vs DGL 2.1.0 on the CPU, side by side on the same graphs (issue 14's table).

    bash scripts/bench_dgl.sh --setup         # once: side venv /tmp/gnnpar-dgl-venv (--venv PATH)
    python scripts/bench_dgl.py               # scales 16,17; 3 rounds; 2 threads (+1 sampling)
    bash scripts/bench_dgl.sh                 # the same through the wrapper
    python scripts/bench_dgl.py --dry-run        # what it would run
    python scripts/bench_dgl.py --measures step --scales 16 --rounds 1 --venv /tmp/gnnpar-dgl-venv
    python scripts/bench_dgl.py --measures train --train-scales 17    # mini-batch GraphSAGE epochs

DGL is never a gnnpar dependency: it lives in a side venv (torch 2.2.1, the newest DGL 2.1.0
supports) and runs as a subprocess (``scripts/bench_dgl_side.py``, one per scale, JSON lines
over stdin/stdout); gnnpar runs in this interpreter (``train``: a ``gnnpar-train`` process
per round). Each ``rmat:scale=S,ef=16`` graph is built once by gnnpar and exported to an .npz
in a temporary folder (CSR, 128-wide features, labels, train mask), which the DGL side reads.
Round r runs every measure on gnnpar, then on DGL, so load from other processes hits both
alike; the medians over ``--rounds`` are reported.

Measures (``--measures``):

- ``step``: one full-batch training step (forward + backward + Adam step, timed after
  ``--warmup`` steps, median of ``--steps``) of GCN 3 layers 128 → 256 → 256 → classes,
  dropout 0.5. gnnpar: ``build_model("gcn", …)`` on ``SerialRuntime(graph, "gcn")`` with
  ``trainer.train_step``; DGL: ``GraphConv(norm="both")`` on A' + I. Both use
  Â = D̃^{-1/2}(A'+I)D̃^{-1/2} (checked row for row before timing). At the first ``--threads``.
- ``sample``: minibatches/s of fanouts 15,10,5 (input layer first, the order both samplers
  take), batch 1024, on ``--sample-scales``. gnnpar: bulk sampler, macrobatch K=4, W = threads
  worker threads (scripts/bench_sampling.py's loop); at 1 thread also the node-wise sampler.
  DGL: ``NeighborSampler`` + ``DataLoader`` (num_workers=0, its own OpenMP threads).
- ``gather``: the same plus the 128-wide feature rows of every minibatch's input nodes,
  one (input nodes × 128) float32 tensor per minibatch on both sides. gnnpar: what the
  service does, ``FeatureStore.fetch`` of the macrobatch's union, then
  ``MacroFeatures.gather_all`` (one compiled pass per macrobatch, ``gnnpar.sampling.
  row_gather``); DGL: ``torch.index_select`` of each minibatch's ``input_nodes``.
- ``train``: one mini-batch training epoch end to end, on ``--train-scales``: GraphSAGE
  (mean), ``--fanouts`` (input layer first), batch ``--batch-size``, 3 layers, hidden 256,
  dropout 0.5, Adam (lr 0.01, weight decay 5e-4), every training seed once an epoch:
  sampling, the feature gather, forward, backward and the step. ``--epochs`` epochs per
  round; the first epoch of each round is a warm-up, the figure is the median of the
  others. Both sides get ``--train-threads`` threads in all (default 2):

  - gnnpar: the plain command a user would type, ``gnnpar-train --mode minibatch --model sage
    --layers 3 --hidden 256 --fanouts 15,10,5 --batch-size 1024 --dropout 0.5 --device cpu
    --threads T``, one process per round on the same graph (built from the same spec,
    through a dataset cache in the temporary folder). ``--threads T`` is the rank's budget:
    the trainer's torch ops and compiled SpMM run on T threads; the sampler thread (the
    CLI's default ``--sampler-workers 1``: it samples, gathers the input features and builds
    the blocks of the next minibatches while the trainer steps) runs beside it at the lowest
    OS priority, on the cycles the trainer leaves idle (``gnnpar.sampling.service``).
    ``--train-sampler-workers W`` passes ``--sampler-workers W`` (not passed by default);
    ``--gnnpar-flags`` adds flags (e.g. ``--macrobatch 1``; the CLI's defaults on a CPU
    otherwise: macrobatch 4, one macrobatch ahead per sampler worker). Both sides' processes
    start from the caller's environment plus ``OMP_NUM_THREADS=T``; gnnpar-train adds its
    own OpenMP default (``GOMP_SPINCOUNT``, ``gnnpar/__init__.py``) as it does for any user,
    the DGL side runs with none. The epoch
    time is the log's ``train_s`` (steps only). What differs: ``gnnpar-train`` has no flag
    to skip evaluation, so after each epoch it evaluates (full-graph inference, not in
    ``train_s``), and during that evaluation its sampler thread already prepares up to
    ``--prefetch`` macrobatches of the next epoch, which that epoch then finds ready. The
    report bounds that head start per epoch by the epoch's ``sampler_s`` × min(1,
    prefetch·K / steps) and gives the ratio with the bound added to gnnpar's time. gnnpar
    splits the seeds into ceil(seeds / batch) minibatches of equal size, DGL into full
    batches and a smaller last one: the same step count.
  - DGL: its own loop in the side venv (``bench_dgl_side.py``'s ``train``): ``NeighborSampler``
    + ``DataLoader`` with ``num_workers=0``, so sampling and training take turns in one thread
    of control; both use the T threads (DGL's OpenMP pool for sampling, T torch threads for
    the dense ops). No evaluation.

Ratio column: gnnpar/DGL time for the step and the training epoch (< 1: gnnpar faster),
gnnpar/DGL throughput for sampling (> 1: gnnpar faster). For ``train`` it also gives the
spread of the per-round ratios and of the epoch-to-epoch ratios (gnnpar epoch k / DGL epoch
k of the same round, k ≥ 2), and each side's per-epoch times are printed per round with the
load average. The last line is JSON with every number.

``--busy N`` holds N cores with one spinning process each during the timed rounds (after the
graphs are built), both sides alike: issue 25's "under load" figure, to set beside the same
command without it.

Mind the load average, printed at start and end (and per round for ``train``): with more
runnable threads than cores, work split over an OpenMP pool stalls at every barrier: DGL's
multi-threaded sampling (fused or not) and any op on 2 torch threads, DGL's training step
included, run many times slower. Such a load inflates the 2-thread sampling ratios and the
training-epoch ratio (both sides' training steps run on T torch threads); the 1-thread ones
suffer far less. Take figures of record on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

#: the environment as the user gave it, before gnnpar's import adds its own defaults
#: (``GOMP_SPINCOUNT``, :mod:`gnnpar`): each side's process starts from this, so the DGL side
#: runs as its users run it and gnnpar-train sets its own, as a user's command would
USER_ENV = dict(os.environ)

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # run from a checkout without installing
sys.path.insert(0, HERE)

import bench_sampling  # noqa: E402  (its throughput loop: _worker, _run_variant)
from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.datasets.normalize import propagation_matrix  # noqa: E402
from gnnpar.nn.models import build_model  # noqa: E402
from gnnpar.cli.options import parser_defaults  # noqa: E402
from gnnpar.sampling.options import pipeline_depth  # noqa: E402
from gnnpar.sampling import (BulkSampler, FeatureStore, NeighborSampler,  # noqa: E402
                             SamplerConfig, Topology)
from gnnpar.training.serial import SerialRuntime  # noqa: E402
from gnnpar.training.trainer import TrainConfig, make_optimizer, train_step  # noqa: E402

DEFAULT_VENV = os.environ.get("GNNPAR_DGL_VENV", "/tmp/gnnpar-dgl-venv")
TRAIN_HIDDEN, TRAIN_DROPOUT = 256, 0.5  # the mini-batch training comparison's model (issue 22)
MEASURES = ("step", "sample", "gather", "train")
SIDE = os.path.join(HERE, "bench_dgl_side.py")


# ---------------------------------------------------------------- gnnpar side (this process)
class GnnparSide:
    def __init__(self, scale, ef, args, tmp):
        t0 = time.perf_counter()
        self.spec, self.cache = f"rmat:scale={scale},ef={ef}", os.path.join(tmp, "cache")
        self.graph = load_dataset(self.spec, cache_dir=self.cache)
        self.args, self._rt, self._topo, self.tmp = args, None, None, tmp
        g = self.graph
        perm = np.random.default_rng(0).permutation(np.flatnonzero(g.train_mask))
        b = args.batch_size
        self.seeds = [np.sort(perm[i:i + b]) for i in range(0, perm.size - b + 1, b)]
        self.store = FeatureStore.local(g.x)
        print(f"{g.summary()} (built in {time.perf_counter() - t0:.1f} s)", flush=True)

    @property
    def runtime(self):
        if self._rt is None:
            self._rt = SerialRuntime(self.graph, "gcn")
        return self._rt

    @property
    def topo(self):
        if self._topo is None:
            self._topo = Topology.from_graph(self.graph, ("mean",))
        return self._topo

    def export(self, path):
        g = self.graph
        np.savez(path, indptr=np.asarray(g.indptr, np.int64),
                 indices=np.asarray(g.indices, np.int64), x=np.asarray(g.x, np.float32),
                 y=np.asarray(g.y, np.int64),
                 train_mask=np.asarray(g.train_mask, bool), num_classes=g.num_classes)

    def check(self, rows):
        """First ``rows`` rows of Â·x with gnnpar's gcn Â (float64, from the CSR values)."""
        indptr, indices, values = propagation_matrix(self.graph, "gcn")
        x = np.asarray(self.graph.x, np.float64)
        return np.stack([values[indptr[i]:indptr[i + 1]] @ x[indices[indptr[i]:indptr[i + 1]]]
                         for i in range(rows)])

    def step(self, threads, warmup, steps):
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        g, rt = self.graph, self.runtime
        model = build_model("gcn", g.num_features, 256, g.num_classes, 3, 0.5)
        opt = make_optimizer(model, TrainConfig())
        count = float(rt.masks["train"].sum())
        times = []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            train_step(model, opt, rt, count)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        return {"step_s": statistics.median(times), "steps_s": times}

    def sample(self, threads, gather, bulk, seconds):
        torch.set_num_threads(threads)
        a = self.args
        K = a.macrobatch if bulk else 1
        sampler = (BulkSampler if bulk else NeighborSampler)(self.topo,
                                                             SamplerConfig(a.fanouts, "mean"))
        jobs = [list(range(s, min(s + K, len(self.seeds)))) for s in range(0, len(self.seeds), K)]
        bench_sampling._worker(sampler, bulk, self.seeds, K, self.store, gather, jobs, {}, 0, 1,
                               0.0)  # warm-up: one macrobatch
        mb_s, _, per_mb = bench_sampling._run_variant(sampler, bulk, self.seeds, K, self.store,
                                                      gather, jobs, threads, seconds)
        return {"mb_s": mb_s, "edges_per_mb": per_mb}


    def train(self, epochs, threads, workers, extra):
        """One ``gnnpar-train`` process of ``epochs`` mini-batch epochs; each epoch's
        ``train_s`` from its ``--log-json``."""
        log = os.path.join(self.tmp, "gnnpar-train.jsonl")
        cmd = [sys.executable, "-m", "gnnpar.train"] + train_flags(
            self.spec, self.args, epochs, threads, workers, extra) + [
            "--cache-dir", self.cache, "--log-json", log, "--quiet"]
        env = dict(USER_ENV, OMP_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="",
                   PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [USER_ENV.get(
                       "PYTHONPATH")] if p]))
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {res.returncode}:\n{res.stderr}")
        recs = [json.loads(line) for line in open(log)]
        epochs_ = [r for r in recs if "train_s" in r and not r.get("final")]
        # Macrobatches the sampler may have made ready during the previous epoch's
        # evaluation: at most --prefetch of them, K minibatches each (a CPU run's defaults).
        k, prefetch = pipeline_depth(
            flag_value(extra, "--macrobatch", parser_defaults()["macrobatch"]),
            flag_value(extra, "--prefetch", parser_defaults()["prefetch"]),
            1 if workers is None else workers, host_samples=True)
        ahead = k * prefetch
        head = [0.0] + [r["sampler_s"] * min(1.0, ahead / max(r["steps"], 1))
                        for r in epochs_[1:]]
        return {"epochs_s": [r["train_s"] for r in epochs_], "steps": epochs_[-1]["steps"],
                "loss": epochs_[-1]["loss"], "head_start_s": head, "ready_ahead": ahead,
                "cmd": " ".join(cmd[1:])}


def train_flags(spec, a, epochs, threads, workers, extra) -> list:
    """The ``gnnpar-train`` flags of the ``train`` measure (module docstring): the plain
    command, ``--threads T``, ``--sampler-workers`` only when ``workers`` is given."""
    return (["--mode", "minibatch", "--dataset", spec, "--model", "sage", "--layers",
             str(len(a.fanouts)), "--hidden", str(TRAIN_HIDDEN), "--fanouts",
             ",".join(map(str, a.fanouts)), "--batch-size", str(a.batch_size), "--dropout",
             str(TRAIN_DROPOUT), "--epochs", str(epochs), "--device", "cpu", "--threads",
             str(threads)] + ([] if workers is None else ["--sampler-workers", str(workers)])
            + list(extra))


def flag_value(flags, name, default):
    """The integer value of ``name`` in a gnnpar-train argument list, else ``default``."""
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            return int(flags[i + 1])
        if f.startswith(name + "="):
            return int(f.split("=", 1)[1])
    return default


# ---------------------------------------------------------------- DGL side (subprocess)
class DglSide:
    def __init__(self, venv, npz, threads):
        env = dict(USER_ENV, OMP_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="",
                   DGLBACKEND="pytorch")
        self.proc = subprocess.Popen([os.path.join(venv, "bin", "python"), SIDE, npz], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the DGL side ({SIDE}) exited with {self.proc.wait()}; "
                               "its error is above")
        return json.loads(line)

    def __call__(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


# ---------------------------------------------------------------- plan
def plan(args):
    """Rows of the table: (key, label, scale, gnnpar call, DGL request). Rows with the same
    DGL request share its measurement (run once per round)."""
    rows, fan = [], ",".join(map(str, args.fanouts))
    if "step" in args.measures:
        t = args.threads[0]
        for s in args.scales:
            rows.append((f"step_s{s}_t{t}", f"full-batch step, scale {s}, {t} threads", s,
                         ("step", dict(threads=t, warmup=args.warmup, steps=args.steps)),
                         dict(measure="step", threads=t, warmup=args.warmup, steps=args.steps)))
    if "train" in args.measures:
        t, w = args.train_threads, args.train_sampler_workers
        for s in args.train_scales:
            rows.append((f"train_s{s}_t{t}", f"mini-batch SAGE epoch [{fan}] b{args.batch_size}, "
                         f"scale {s}, {t} threads", s,
                         ("train", dict(epochs=args.epochs, threads=t, workers=w,
                                        extra=args.gnnpar_flags.split())),
                         dict(measure="train", threads=t, epochs=args.epochs,
                              fanouts=list(args.fanouts), batch_size=args.batch_size,
                              hidden=TRAIN_HIDDEN, dropout=TRAIN_DROPOUT)))
    for s in args.sample_scales:
        for t in args.threads:
            for gather in [g for g in (False, True)
                           if ("gather" if g else "sample") in args.measures]:
                req = dict(measure="sample", threads=t, gather=gather, seconds=args.seconds,
                           fanouts=list(args.fanouts), batch_size=args.batch_size)
                what = "sampling + gather" if gather else "sampling"
                for bulk in [True] + ([False] if t == 1 else []):
                    who = f"bulk K={args.macrobatch} W={t}" if bulk else "node-wise W=1"
                    rows.append((f"{'gather' if gather else 'sample'}_s{s}_t{t}_"
                                 f"{'bulk' if bulk else 'node'}",
                                 f"{what} [{fan}] b{args.batch_size}, scale {s}, {t} thr ({who})",
                                 s, ("sample", dict(threads=t, gather=gather, bulk=bulk,
                                                    seconds=args.seconds)), req))
    return rows


#: the figure of each measure's result: seconds (step, train epoch) or minibatches/s
VALUE = {"step": "step_s", "sample": "mb_s", "train": "epoch_s"}


def timed_epochs(out: dict) -> list:
    """A train result's timed epochs: all but the first (the warm-up), or the only one."""
    return out["epochs_s"][1:] or out["epochs_s"]


def report_train_round(r, label, ours, theirs) -> None:
    """Set ``epoch_s`` (median of the timed epochs) and ``load`` on both sides' results of
    round ``r`` and print their epoch times."""
    load = os.getloadavg()[0]
    for out in (ours, theirs):
        out["epoch_s"], out["load"] = statistics.median(timed_epochs(out)), load
    ours["head_start_max_s"] = max(timed_epochs({"epochs_s": ours["head_start_s"]}))
    fmt = lambda out: " ".join(f"{t:.3f}" for t in out["epochs_s"])  # noqa: E731
    print(f"round {r}: {label}: epochs (s; the first a warm-up) gnnpar [{fmt(ours)}] "
          f"({ours['steps']} steps) DGL [{fmt(theirs)}] ({theirs['steps']} steps); medians "
          f"{ours['epoch_s']:.3f} / {theirs['epoch_s']:.3f} = "
          f"{ours['epoch_s'] / theirs['epoch_s']:.2f}; gnnpar's head start (sampling during "
          f"the previous epoch's evaluation, {ours['ready_ahead']} minibatches ready at most) "
          f"<= {ours['head_start_max_s']:.3f} s an epoch; load average {load:.2f}", flush=True)


def train_spread(runs: dict) -> dict:
    """How the train ratio varies: over rounds (ratio of the round medians) and from epoch to
    epoch (gnnpar epoch k / DGL epoch k of the same round, timed epochs only), and each
    side's timed epochs relative to its median."""
    rounds = [g["epoch_s"] / d["epoch_s"] for g, d in zip(runs["gnnpar"], runs["dgl"])]
    epochs = [a / b for g, d in zip(runs["gnnpar"], runs["dgl"])
              for a, b in zip(timed_epochs(g), timed_epochs(d))]
    out = {"round_ratios": rounds, "round_ratio_min": min(rounds),
           "round_ratio_max": max(rounds), "epoch_ratios": epochs,
           "epoch_ratio_min": min(epochs), "epoch_ratio_max": max(epochs),
           "load": statistics.median(g["load"] for g in runs["gnnpar"]),
           "gnnpar_head_start_max_s": max(g["head_start_max_s"] for g in runs["gnnpar"])}
    for side in ("gnnpar", "dgl"):
        times = [t for o in runs[side] for t in timed_epochs(o)]
        med = statistics.median(times)
        out[f"{side}_epoch_spread"] = [min(times) / med - 1, max(times) / med - 1]
    return out


def print_table(rows, res):
    print("\n| measure | gnnpar | DGL 2.1.0 | ratio |\n|---|---|---|---|")
    for key, label, *_ in rows:
        r = res[key]
        if key.startswith("step"):
            cells = f"{r['gnnpar']:.3f} s | {r['dgl']:.3f} s | {r['ratio']:.2f}× time"
        elif key.startswith("train"):
            cells = (f"{r['gnnpar']:.3f} s | {r['dgl']:.3f} s | {r['ratio']:.2f}× time "
                     f"(rounds {r['round_ratio_min']:.2f}–{r['round_ratio_max']:.2f}, epochs "
                     f"{r['epoch_ratio_min']:.2f}–{r['epoch_ratio_max']:.2f}; load "
                     f"{r['load']:.2f})")
        else:
            cells = f"{r['gnnpar']:.1f} mb/s | {r['dgl']:.1f} mb/s | {r['ratio']:.2f}× throughput"
        print(f"| {label} | {cells} |")
    for key, label, *_ in rows:
        if key.startswith("train"):
            r = res[key]
            g, d = r["gnnpar_epoch_spread"], r["dgl_epoch_spread"]
            print(f"{label}: timed epochs vs each side's median: gnnpar {g[0]:+.1%} to "
                  f"{g[1]:+.1%}, DGL {d[0]:+.1%} to {d[1]:+.1%}; gnnpar's head start from "
                  f"sampling during evaluation <= {r['gnnpar_head_start_max_s']:.3f} s an "
                  f"epoch (ratio <= {(r['gnnpar'] + r['gnnpar_head_start_max_s']) / r['dgl']:.2f}"
                  " without it)")


def busy_loops(n: int) -> list:
    """``n`` processes that each spin on one core until killed (``--busy``)."""
    if n:
        print(f"holding {n} core(s) with busy loops during the rounds", flush=True)
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    p.add_argument("--venv", default=DEFAULT_VENV, help="side venv with dgl (default %(default)s)")
    p.add_argument("--setup", action="store_true",
                   help="build the side venv (runs bench_dgl.sh --setup)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians reported)")
    p.add_argument("--scales", type=ints, default=[16, 17], help="rmat scales of the step")
    p.add_argument("--sample-scales", type=ints, default=[17], help="rmat scales of sampling")
    p.add_argument("--ef", type=int, default=16, help="rmat edge factor")
    p.add_argument("--threads", type=ints, default=[2, 1],
                   help="thread counts of sampling; the step runs at the first")
    p.add_argument("--measures", default="step,sample,gather",
                   help="comma list of step, sample, gather, train")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    p.add_argument("--steps", type=int, default=5, help="timed steps per round (median)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per sampling run")
    p.add_argument("--fanouts", type=ints, default=[15, 10, 5], help="input layer first")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--macrobatch", type=int, default=4, help="gnnpar bulk sampler's K")
    p.add_argument("--train-scales", type=ints, default=[17],
                   help="rmat scales of the mini-batch training epoch (--measures train)")
    p.add_argument("--epochs", type=int, default=5,
                   help="train: epochs per round and side; the first is a warm-up")
    p.add_argument("--train-threads", type=int, default=2,
                   help="train: threads on each side (gnnpar: --threads, its sampler thread "
                        "beside it at the lowest priority)")
    p.add_argument("--train-sampler-workers", type=int, default=None,
                   help="train: pass --sampler-workers W to gnnpar-train (default: not "
                        "passed, the CLI's default)")
    p.add_argument("--gnnpar-flags", default="",
                   help="train: more gnnpar-train flags, space-separated (e.g. "
                        "'--macrobatch 4'); they change only gnnpar's side")
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="hold N cores with busy loops (one process each) during the timed "
                        "rounds, both sides alike: the under-load figure (default 0)")
    p.add_argument("--json", default=None, help="also write the JSON result to PATH")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    args = p.parse_args(argv)
    if args.setup:
        return subprocess.call(["bash", os.path.join(HERE, "bench_dgl.sh"), "--setup",
                                "--venv", args.venv])
    args.measures = set(args.measures.split(","))
    if args.measures - set(MEASURES):
        p.error(f"unknown measures {sorted(args.measures - set(MEASURES))}")
    if "train" in args.measures and not (
            args.train_threads >= 1 and args.epochs >= 1
            and (args.train_sampler_workers is None or args.train_sampler_workers >= 1)):
        p.error("train needs --train-threads >= 1, --train-sampler-workers >= 1 and "
                "--epochs >= 1")
    if not {"sample", "gather"} & args.measures:
        args.sample_scales = []
    rows = plan(args)
    scales = sorted({r[2] for r in rows})
    have_venv = os.path.exists(os.path.join(args.venv, "bin", "python"))
    how = f"bash scripts/bench_dgl.sh --setup --venv {args.venv}"
    if args.dry_run:
        state = "present" if have_venv else "MISSING, make it with: " + how
        print(f"side venv {args.venv}: {state}")
        for s in scales:
            print(f"build rmat:scale={s},ef={args.ef} (gnnpar), export TMP/graph-s{s}.npz; start "
                  f"{args.venv}/bin/python {os.path.relpath(SIDE)} TMP/graph-s{s}.npz")
        if args.busy:
            print(f"then hold {args.busy} core(s) with busy loops during the rounds")
        for r in range(args.rounds):
            for key, label, s, (fn, kw), req in rows:
                what = f"gnnpar {fn}({kw})"
                if fn == "train":
                    flags = train_flags(f"rmat:scale={s},ef={args.ef}", args, **kw)
                    what = "gnnpar-train " + " ".join(flags)
                print(f"round {r}: {label}: {what} then DGL s{s} {json.dumps(req)}")
        return 0
    if not have_venv:
        print(f"no DGL side venv at {args.venv}. Make it (torch 2.2.1 + dgl 2.1.0, a few GB, "
              f"never gnnpar's own venv) with:\n    {how}", file=sys.stderr)
        return 2
    load0 = os.getloadavg()[0]
    print(f"cpus {os.cpu_count()}, load average {load0:.2f}"
          + (" (busy machine: expect noise)" if load0 > 2 else ""), flush=True)
    gp, dg, hogs = {}, {}, []
    with tempfile.TemporaryDirectory(prefix="gnnpar-bench-dgl-") as tmp:
        try:
            for s in scales:
                gp[s] = GnnparSide(s, args.ef, args, tmp)
                npz = os.path.join(tmp, f"graph-s{s}.npz")
                gp[s].export(npz)
                dg[s] = DglSide(args.venv, npz, max(args.threads + [args.train_threads]))
                ours, theirs = gp[s].check(8), np.asarray(dg[s](measure="check", rows=8)["rows"])
                err = float(np.abs(ours - theirs).max())
                print(f"scale {s}: {dg[s].hello}; Â·x rows gnnpar vs DGL max |diff| {err:.2e}",
                      flush=True)
                if err > 1e-4:
                    raise SystemExit(f"scale {s}: DGL's GCN normalisation differs from gnnpar's")
            runs = {key: {"gnnpar": [], "dgl": []} for key, *_ in rows}
            hogs += busy_loops(args.busy)
            for r in range(args.rounds):
                dgl_done = {}
                for key, label, s, (fn, kw), req in rows:
                    out = getattr(gp[s], fn)(**kw)
                    tag = (s, json.dumps(req, sort_keys=True))
                    if tag not in dgl_done:  # one DGL run per request and round
                        dgl_done[tag] = dg[s](**req)
                    runs[key]["gnnpar"].append(out)
                    runs[key]["dgl"].append(dgl_done[tag])
                    if fn == "train":
                        report_train_round(r, label, out, dgl_done[tag])
                        continue
                    v = VALUE[fn]
                    print(f"round {r}: {label}: gnnpar {out[v]:.3f}  DGL {dgl_done[tag][v]:.3f} "
                          f"{'s' if fn == 'step' else 'mb/s'}"
                          + ("" if fn == "step" else f"  (edges/mb {out['edges_per_mb']:.0f} vs "
                             f"{dgl_done[tag]['edges_per_mb']:.0f})"), flush=True)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
            for side in dg.values():
                side.close()
    res = {}
    for key, label, s, (fn, kw), req in rows:
        v = VALUE[fn]
        a = statistics.median(o[v] for o in runs[key]["gnnpar"])
        b = statistics.median(o[v] for o in runs[key]["dgl"])
        res[key] = {"label": label, "gnnpar": a, "dgl": b, "ratio": a / b, "unit": v,
                    "rounds": runs[key]}
        if fn == "train":
            res[key].update(train_spread(runs[key]))
    print_table(rows, res)
    load1 = os.getloadavg()[0]
    print(f"load average {load0:.2f} at start, {load1:.2f} at end"
          + (" (busy machine: numbers are noisy)" if max(load0, load1) > 2 else ""))
    bench_sampling.emit({"args": {k: sorted(v) if isinstance(v, set) else v
                                  for k, v in vars(args).items()},
                         "dgl": dg[scales[0]].hello if scales else None, "results": res,
                         "load_average": [load0, load1]}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
