#!/usr/bin/env python
"""Mini-batch training on one device: end to end against compute only.

    python scripts/bench_minibatch.py --device cuda            # rmat:scale=20,ef=16 (H200 row)
    python scripts/bench_minibatch.py                          # CPU: rmat:scale=14,ef=16
    python scripts/bench_minibatch.py --device cuda --sample-on host --features-on host

Model and batches as issue 11 sets them: 3-layer GraphSAGE, hidden 256, fanouts 15,10,5
(input layer first), batch 1024, Adam. Per round (``--repeats`` rounds, the two
measurements interleaved so machine load hits both):

1. **end to end** — one epoch of the real pipeline (:class:`gnnpar.sampling.MacrobatchService`
   with ``--sample-on``/``--features-on``/``--macrobatch``/``--workers``/``--prefetch``):
   minibatches/s from the moment the sampler workers are started (nothing sampled yet; the
   service object, and on the device its copy of the topology, are built before) to the
   device being idle after the last step, and ``stall_s`` (time the trainer waited for
   input) with its share of the epoch;
2. **compute only** — the same steps on minibatches sampled beforehand and resident on the
   device (the epoch's first ``--resident`` minibatches, cycled to the same step count):
   minibatches/s with nothing to wait for.

Reports the medians, the ratio end-to-end epoch / compute-only epoch (issue 11 asks ≤ 1.3
and ≥ 150 minibatches/s end to end on an H200), one JSON line per measurement (with the
1-minute load average, ``load``) and a table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # run from a checkout without installing

from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.nn.models import build_model  # noqa: E402
from gnnpar.sampling import (EpochPlan, FeatureStore, MacrobatchService,  # noqa: E402
                             SamplerConfig, SamplingStats, ServiceConfig, Topology)
from gnnpar.training.minibatch_loop import DataParallel, train_step  # noqa: E402
from gnnpar.sampling.placement import resolve_placement  # noqa: E402
from gnnpar.training.trainer import TrainConfig, make_optimizer, sync_device  # noqa: E402

GPU_DATASET, CPU_DATASET = "rmat:scale=20,ef=16", "rmat:scale=14,ef=16"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dataset", default=None,
                   help=f"default {GPU_DATASET} on cuda, {CPU_DATASET} on cpu")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--model", default="sage")
    p.add_argument("--sample-on", default="auto", choices=("auto", "host", "device"))
    p.add_argument("--features-on", default="auto", choices=("auto", "host", "device"))
    p.add_argument("--macrobatch", type=int, default=4)
    p.add_argument("--workers", type=int, default=None,
                   help="sampler threads (default: 2 when sampling on the device, else "
                        "min(8, cores - 1))")
    p.add_argument("--prefetch", type=int, default=4, help="macrobatches ready ahead")
    p.add_argument("--resident", type=int, default=32,
                   help="minibatches pre-sampled and kept on the device for compute only")
    p.add_argument("--max-steps", type=int, default=0,
                   help="cut an epoch to this many minibatches (0 = a whole epoch)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the JSON lines to this file")
    return p.parse_args(argv)


class Bench:
    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        spec = args.dataset or (GPU_DATASET if self.device.type == "cuda" else CPU_DATASET)
        t0 = time.perf_counter()
        self.graph = g = load_dataset(spec)
        self.spec = spec
        fanouts = tuple(int(f) for f in args.fanouts.split(","))
        torch.manual_seed(0)
        self.model = build_model(args.model, g.num_features, args.hidden, g.num_classes,
                                 len(fanouts), 0.5).to(self.device)
        self.topo = Topology.from_graph(g, (self.model.norm,))
        self.store = FeatureStore.local(g.x)
        self.placement = resolve_placement(args.sample_on, args.features_on, self.device,
                                           replicated=True, grouped=False,
                                           feature_bytes=self.store.nbytes(),
                                           topo_bytes=self.topo.nbytes())
        if self.placement.features_on == "device" or self.device.type == "cpu":
            self.store.to(self.device)
        seeds = np.flatnonzero(np.asarray(g.train_mask))
        if args.max_steps:
            seeds = seeds[:args.max_steps * args.batch_size]
        self.plan = EpochPlan(seeds, [seeds.shape[0]], 0, args.batch_size, 0)
        self.sampler = SamplerConfig(fanouts, self.model.norm)
        self.labels = torch.as_tensor(np.asarray(g.y, np.int64))
        workers = args.workers or (2 if self.placement.sample_on == "device"
                                   else max(1, min(8, (os.cpu_count() or 2) - 1)))
        self.cfg = ServiceConfig(macrobatch=args.macrobatch, workers=workers,
                                 prefetch=args.prefetch, device=str(self.device),
                                 sampler=self.placement.sample_on)
        self.opt = make_optimizer(self.model, TrainConfig(lr=0.003))
        self.setup_s = time.perf_counter() - t0

    def service(self) -> MacrobatchService:
        return MacrobatchService(self.topo, self.store, self.plan, self.sampler, self.cfg,
                                 self.labels)

    def end_to_end(self, epoch: int) -> dict:
        service = self.service()
        stats = SamplingStats()
        engine = DataParallel()
        self.model.train()
        sync_device(self.device)
        t0 = time.perf_counter()  # before the workers start: filling the pipeline is counted
        service.start(epoch, epoch + 1)
        try:
            for batch in service.epoch(epoch, stats):
                train_step(self.model, self.opt, engine, batch, batch.y.shape[0])
            sync_device(self.device)
        finally:
            service.close()
        s = time.perf_counter() - t0
        return {"what": "end_to_end", "steps": stats.steps, "epoch_s": s,
                "mb_per_s": stats.steps / s, "stall_s": stats.stall_s,
                "stall_share": stats.stall_s / s, "sampler_s": stats.sampler_s,
                "sampled_edges": stats.sampled_edges, "input_nodes": stats.input_nodes}

    def resident(self) -> list:
        """The first ``--resident`` minibatches of an epoch, on the device."""
        service = self.service()
        service.start(10 ** 6, 10 ** 6 + 1)
        out = []
        try:
            for batch in service.epoch(10 ** 6, SamplingStats()):
                out.append(batch)
                if len(out) == self.args.resident:
                    break
        finally:
            service.close()
        sync_device(self.device)
        return out

    def compute_only(self, batches: list, steps: int) -> dict:
        engine = DataParallel()
        self.model.train()
        sync_device(self.device)
        t0 = time.perf_counter()
        for s in range(steps):
            b = batches[s % len(batches)]
            train_step(self.model, self.opt, engine, b, b.y.shape[0])
        sync_device(self.device)
        s = time.perf_counter() - t0
        return {"what": "compute_only", "steps": steps, "epoch_s": s, "mb_per_s": steps / s}


def main(argv=None) -> int:
    args = parse(argv)
    bench = Bench(args)
    pl = bench.placement
    print(f"# {bench.spec} on {bench.device}: sample on {pl.sample_on}, features on "
          f"{pl.features_on}, K={args.macrobatch} workers={bench.cfg.workers} "
          f"prefetch={args.prefetch}; {bench.plan.steps} steps/epoch; setup "
          f"{bench.setup_s:.1f} s", file=sys.stderr)
    for note in pl.notes:
        print(f"# note: {note}", file=sys.stderr)
    bench.end_to_end(0)  # warm-up: allocator, kernels, page cache
    batches = bench.resident()
    bench.compute_only(batches, min(len(batches), 8))
    rows = []
    sink = open(args.json, "w") if args.json else None
    for r in range(args.repeats):
        for rec in (bench.end_to_end(1 + r), bench.compute_only(batches, bench.plan.steps)):
            rec.update(round=r, dataset=bench.spec, device=str(bench.device),
                       sample_on=pl.sample_on, features_on=pl.features_on,
                       load=os.getloadavg()[0])
            rows.append(rec)
            line = json.dumps(rec)
            print(line)
            if sink:
                print(line, file=sink, flush=True)
    e2e = [r for r in rows if r["what"] == "end_to_end"]
    comp = [r for r in rows if r["what"] == "compute_only"]
    med = statistics.median
    e_rate, c_rate = med(r["mb_per_s"] for r in e2e), med(r["mb_per_s"] for r in comp)
    summary = {"what": "summary", "dataset": bench.spec, "device": str(bench.device),
               "sample_on": pl.sample_on, "features_on": pl.features_on,
               "end_to_end_mb_per_s": e_rate, "compute_only_mb_per_s": c_rate,
               "epoch_ratio": c_rate / e_rate,
               "stall_share": med(r["stall_share"] for r in e2e),
               "load": med(r["load"] for r in rows)}
    print(f"\n| measure | value |\n|---|---|\n"
          f"| end to end | {e_rate:.1f} minibatches/s |\n"
          f"| compute only (resident) | {c_rate:.1f} minibatches/s |\n"
          f"| end-to-end epoch / compute-only epoch | {summary['epoch_ratio']:.2f} |\n"
          f"| stall share of the end-to-end epoch | {summary['stall_share']:.1%} |\n"
          f"| load average (1 min, median of rounds) | {summary['load']:.2f} |",
          file=sys.stderr)
    print(json.dumps(summary))
    if sink:
        print(json.dumps(summary), file=sink)
        sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
