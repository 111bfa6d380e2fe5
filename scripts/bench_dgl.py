#!/usr/bin/env python
"""gnnpar vs DGL 2.1.0 on the CPU, side by side on the same graphs (issue 14's table).

    bash scripts/bench_dgl.sh --setup         # once: side venv /tmp/gnnpar-dgl-venv (--venv PATH)
    python scripts/bench_dgl.py               # scales 16,17; 3 rounds; 2 threads (+1 sampling)
    bash scripts/bench_dgl.sh                 # the same through the wrapper
    python scripts/bench_dgl.py --dry-run        # what it would run
    python scripts/bench_dgl.py --measures step --scales 16 --rounds 1 --venv /tmp/gnnpar-dgl-venv

DGL is never a gnnpar dependency: it lives in a side venv (torch 2.2.1, the newest DGL 2.1.0
supports) and runs as a subprocess (``scripts/bench_dgl_side.py``, one per scale, JSON lines
over stdin/stdout); gnnpar runs in this interpreter. Each ``rmat:scale=S,ef=16`` graph is
built once by gnnpar and exported to an .npz in a temporary folder (CSR, 128-wide features,
labels, train mask), which the DGL side reads. Round r runs every measure on gnnpar, then on
DGL, so load from other processes hits both alike; the medians over ``--rounds`` are reported.

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

Ratio column: gnnpar/DGL time for the step (< 1: gnnpar faster), gnnpar/DGL throughput for
sampling (> 1: gnnpar faster). The last line is JSON with every number. Mind the load average
printed at start and end: with more runnable threads than cores, DGL's multi-threaded
(OpenMP) sampling collapses (5-30 mb/s instead of 150 on 2 busy cores, fused or not), which
inflates the 2-thread sampling ratios; the 1-thread ones and the step suffer far less.
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

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing
sys.path.insert(0, HERE)

import bench_sampling  # noqa: E402  (its throughput loop: _worker, _run_variant)
from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.datasets.normalize import propagation_matrix  # noqa: E402
from gnnpar.models import build_model  # noqa: E402
from gnnpar.sampling import (BulkSampler, FeatureStore, NeighborSampler,  # noqa: E402
                             SamplerConfig, Topology)
from gnnpar.serial import SerialRuntime  # noqa: E402
from gnnpar.trainer import TrainConfig, make_optimizer, train_step  # noqa: E402

DEFAULT_VENV = os.environ.get("GNNPAR_DGL_VENV", "/tmp/gnnpar-dgl-venv")
SIDE = os.path.join(HERE, "bench_dgl_side.py")


# ---------------------------------------------------------------- gnnpar side (this process)
class GnnparSide:
    def __init__(self, scale, ef, args):
        t0 = time.perf_counter()
        self.graph = load_dataset(f"rmat:scale={scale},ef={ef}")
        self.args, self._rt, self._topo = args, None, None
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


# ---------------------------------------------------------------- DGL side (subprocess)
class DglSide:
    def __init__(self, venv, npz, threads):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="",
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


def print_table(rows, res):
    print("\n| measure | gnnpar | DGL 2.1.0 | ratio |\n|---|---|---|---|")
    for key, label, *_ in rows:
        r = res[key]
        if key.startswith("step"):
            cells = f"{r['gnnpar']:.3f} s | {r['dgl']:.3f} s | {r['ratio']:.2f}× time"
        else:
            cells = f"{r['gnnpar']:.1f} mb/s | {r['dgl']:.1f} mb/s | {r['ratio']:.2f}× throughput"
        print(f"| {label} | {cells} |")


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
    p.add_argument("--measures", default="step,sample,gather", help="of step, sample, gather")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    p.add_argument("--steps", type=int, default=5, help="timed steps per round (median)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per sampling run")
    p.add_argument("--fanouts", type=ints, default=[15, 10, 5], help="input layer first")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--macrobatch", type=int, default=4, help="gnnpar bulk sampler's K")
    p.add_argument("--json", default=None, help="also write the JSON result to PATH")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    args = p.parse_args(argv)
    if args.setup:
        return subprocess.call(["bash", os.path.join(HERE, "bench_dgl.sh"), "--setup",
                                "--venv", args.venv])
    args.measures = set(args.measures.split(","))
    if args.measures - {"step", "sample", "gather"}:
        p.error(f"unknown measures {sorted(args.measures - {'step', 'sample', 'gather'})}")
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
        for r in range(args.rounds):
            for key, label, s, (fn, kw), req in rows:
                print(f"round {r}: {label}: gnnpar {fn}({kw}) then DGL s{s} {json.dumps(req)}")
        return 0
    if not have_venv:
        print(f"no DGL side venv at {args.venv}. Make it (torch 2.2.1 + dgl 2.1.0, a few GB, "
              f"never gnnpar's own venv) with:\n    {how}", file=sys.stderr)
        return 2
    load0 = os.getloadavg()[0]
    print(f"cpus {os.cpu_count()}, load average {load0:.2f}"
          + (" (busy machine: expect noise)" if load0 > 2 else ""), flush=True)
    gp, dg = {}, {}
    with tempfile.TemporaryDirectory(prefix="gnnpar-bench-dgl-") as tmp:
        try:
            for s in scales:
                gp[s] = GnnparSide(s, args.ef, args)
                npz = os.path.join(tmp, f"graph-s{s}.npz")
                gp[s].export(npz)
                dg[s] = DglSide(args.venv, npz, max(args.threads))
                ours, theirs = gp[s].check(8), np.asarray(dg[s](measure="check", rows=8)["rows"])
                err = float(np.abs(ours - theirs).max())
                print(f"scale {s}: {dg[s].hello}; Â·x rows gnnpar vs DGL max |diff| {err:.2e}",
                      flush=True)
                if err > 1e-4:
                    raise SystemExit(f"scale {s}: DGL's GCN normalisation differs from gnnpar's")
            runs = {key: {"gnnpar": [], "dgl": []} for key, *_ in rows}
            for r in range(args.rounds):
                dgl_done = {}
                for key, label, s, (fn, kw), req in rows:
                    out = getattr(gp[s], fn)(**kw)
                    tag = (s, json.dumps(req, sort_keys=True))
                    if tag not in dgl_done:  # one DGL run per request and round
                        dgl_done[tag] = dg[s](**req)
                    runs[key]["gnnpar"].append(out)
                    runs[key]["dgl"].append(dgl_done[tag])
                    v = "step_s" if fn == "step" else "mb_s"
                    print(f"round {r}: {label}: gnnpar {out[v]:.3f}  DGL {dgl_done[tag][v]:.3f} "
                          f"{'s' if fn == 'step' else 'mb/s'}"
                          + ("" if fn == "step" else f"  (edges/mb {out['edges_per_mb']:.0f} vs "
                             f"{dgl_done[tag]['edges_per_mb']:.0f})"), flush=True)
        finally:
            for side in dg.values():
                side.close()
    res = {}
    for key, label, s, (fn, kw), req in rows:
        v = "step_s" if fn == "step" else "mb_s"
        a = statistics.median(o[v] for o in runs[key]["gnnpar"])
        b = statistics.median(o[v] for o in runs[key]["dgl"])
        res[key] = {"label": label, "gnnpar": a, "dgl": b, "ratio": a / b, "unit": v,
                    "rounds": runs[key]}
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
