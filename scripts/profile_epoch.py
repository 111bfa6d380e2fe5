#!/usr/bin/env python
"""Where a single-process training epoch spends its time, kernel by kernel.

    python scripts/profile_epoch.py --dataset rmat:scale=20,ef=16 --device cuda
    python scripts/profile_epoch.py --dataset rmat:scale=16,ef=16 --precision bf16 --threads 2
    GNNPAR_EPILOGUE_GPU=torch python scripts/profile_epoch.py --device cuda   # unfused epilogue
    python scripts/profile_epoch.py --mode minibatch --dataset rmat:scale=17,ef=16 --model sage \
        --layers 3 --hidden 256 --fanouts 15,10,5 --batch-size 1024 --threads 2

Full batch (default): the step is ``scripts/bench_single.py``'s ``gnnpar`` variant (3-layer
GCN, hidden 256, Adam, in the vertex order ``gnnpar-train`` uses: degree order unless
``--reorder``). After ``--warmup`` epochs, ``--epochs`` epochs run under
:mod:`torch.profiler`; printed are the median epoch time of a separate timed run, the
``--top`` kernels (CUDA) or ops (CPU) by their own time per epoch, and that time summed by
kind: sparse products, dense products (GEMMs), the bias/ReLU/dropout epilogue, reductions,
and the rest. One JSON line at the end.

``--mode minibatch``: the mini-batch trainer's step (:func:`gnnpar.training.minibatch_loop.train_step`)
on ``--batches`` ready minibatches pre-sampled by the macrobatch service run inline (the
serial setup ``gnnpar-train --mode minibatch`` builds, :func:`gnnpar.training.minibatch_setup.
serial_parts`), so sampling is out of the trainer's figures; the sampler's own cost per
minibatch is printed apart (sampling + feature gather + assembly, and within assembly the
operators: the blocks' CSR tensors and transposes). Printed: the block shapes (per layer,
mean over the batches: destinations, sources, non-zeros), the wall time per step split by
phase (forward, loss, backward, gradient sync, optimiser step; perf_counter around each,
no profiler), then one profiled pass of all the batches with each op's own CPU time summed by
kind — ``sparse`` (the blocks' SpMM, forward and backward), ``dense`` (GEMMs), ``epilogue``
(bias, ReLU, dropout; a fused SAGE layer's own time outside its ops: its compiled ReLU +
dropout), ``loss``, ``optimizer`` (everything under the optimiser's step and
zero_grad), ``autograd`` (the rest: the engine, gradient accumulation, copies, views). An
op under the optimiser's ranges is ``optimizer``, then one under a sparse product's is
``sparse`` (torch's CSR product runs an ``addmm`` inside), else it counts for the first kind
that matches it or one of its enclosing ranges, inward out. One JSON line at the end.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # run from a checkout without installing

import gnnpar  # noqa: E402,F401  (first: its thread settings precede torch's import)
import torch  # noqa: E402

from gnnpar.datasets import load_dataset  # noqa: E402
from gnnpar.datasets.reorder import ORDERS, reorder  # noqa: E402
from gnnpar.nn.models import GNN  # noqa: E402
from gnnpar.nn.precision import PRECISIONS  # noqa: E402
from gnnpar.training.serial import SerialRuntime  # noqa: E402
from gnnpar.training.trainer import train_step  # noqa: E402
from gnnpar.kernels.cpu_spmm import size_pool  # noqa: E402

#: kind of a kernel or op, by the first pattern its name matches
KINDS = (("spmm", r"csrmm|cusparse|_row_split|LocalSpMM|addmm_out_sparse|sparse"),
         ("gemm", r"gemm|sgemm|xmma|cutlass|^aten::mm$|^aten::addmm$|matmul"),
         ("epilogue", r"_masked_scale|dropout|Dropout|threshold|relu|masked_scale"),
         ("reduce", r"reduce_kernel|^aten::sum$"))


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="fullbatch", choices=("fullbatch", "minibatch"))
    p.add_argument("--dataset", default="rmat:scale=16,ef=16")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.add_argument("--reorder", default=None, choices=ORDERS,
                   help="vertex order (default: degree in full batch, none in mini batch, "
                        "as gnnpar-train)")
    p.add_argument("--model", default=None, choices=("gcn", "sage"),
                   help="default: gcn in full batch, sage in mini batch")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3,
                   help="profiled epochs (mini batch: passes over the --batches)")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--fanouts", default="15,10,5", help="mini batch: input layer first")
    p.add_argument("--batch-size", type=int, default=1024, help="mini batch: seeds per step")
    p.add_argument("--batches", type=int, default=16,
                   help="mini batch: ready minibatches pre-sampled and stepped through")
    p.add_argument("--cache-dir", default=None, help="dataset cache folder (gnnpar-train's)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    size_pool(a.threads)
    if a.mode == "minibatch":
        return minibatch(a)
    a.reorder = a.reorder or "degree"
    a.model = a.model or "gcn"
    device = torch.device(a.device)
    g = reorder(load_dataset(a.dataset, cache_dir=a.cache_dir), a.reorder)
    torch.manual_seed(0)
    model = GNN(a.model, g.num_features, a.hidden, g.num_classes, a.layers, 0.5).to(device)
    rt = SerialRuntime(g, model.norm, device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    count = float(rt.masks["train"].sum())

    def step():
        train_step(model, opt, rt, count, a.precision)

    for _ in range(a.warmup):
        step()
    sync(device)
    times = []
    for _ in range(max(a.epochs, 3)):
        t = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t)
    epoch_ms = statistics.median(times) * 1e3

    from torch.profiler import ProfilerActivity, profile
    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(a.epochs):
            step()
        sync(device)
    rows = []
    for e in prof.key_averages():
        own = (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
               if cuda else e.self_cpu_time_total)
        # on CUDA only kernels: a range (an autograd Function, the optimiser step) shows its
        # kernels' time too, under a name that also has host time
        if own > 0 and (not cuda or e.self_cpu_time_total == 0):
            rows.append((own / a.epochs / 1e3, e.count // a.epochs, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"{g.summary()}  {a.device} {a.precision}  epoch {epoch_ms:.2f} ms (median of "
          f"{len(times)}); profiled {'GPU' if cuda else 'CPU'} time {total:.2f} ms/epoch")
    print(f"{'ms/epoch':>9} {'calls':>6} {'kind':<9} name")
    for ms, calls, name in rows[:a.top]:
        print(f"{ms:9.3f} {calls:6d} {kind_of(name):<9} {name[:90]}")
    kinds = {}
    for ms, _, name in rows:
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + ms
    print("by kind: " + ", ".join(f"{k} {v:.2f} ms" for k, v in
                                  sorted(kinds.items(), key=lambda kv: -kv[1])))
    print(json.dumps({"dataset": a.dataset, "device": a.device, "precision": a.precision,
                      "reorder": a.reorder, "epoch_ms": epoch_ms, "profiled_ms": total,
                      "by_kind_ms": kinds}))
    return 0


# ---------------------------------------------------------------- mini batch
#: kinds of an op of the mini-batch step that win wherever they match in its chain of
#: enclosing ranges (torch's CSR product runs an ``addmm`` inside ``_sparse_mm``)
MB_ENCLOSING = (("optimizer", r"^Optimizer\."),
                ("sparse", r"LocalSpMM|csrmm|csr_mm|_row_split|sparse"))
#: then the first of these that matches the op or, failing that, its ranges inward out
MB_KINDS = (("dense", r"^aten::(mm|addmm_?|bmm|matmul|linear)$|gemm|MmBackward|AddmmBackward"),
            ("epilogue", r"dropout|Dropout|_CPUPass|relu|Relu|threshold|masked_scale"
                         r"|^aten::add$|AddBackward|SAGEBlock"),
            ("loss", r"cross_entropy|log_softmax|nll_loss|LogSoftmax|NllLoss"))


def mb_kind(event) -> str:
    """The kind of a profiler event (a :class:`torch.autograd.profiler.FunctionEvent`):
    :data:`MB_ENCLOSING`, then :data:`MB_KINDS`, else ``autograd``."""
    chain, e = [], event
    while e is not None:
        chain.append(e.name)
        e = e.cpu_parent
    for kind, pattern in MB_ENCLOSING:
        if any(re.search(pattern, n) for n in chain):
            return kind
    for name in chain:
        for kind, pattern in MB_KINDS:
            if re.search(pattern, name):
                return kind
    return "autograd"


def step_phases(model, opt, engine, batch, global_count, precision, clock):
    """:func:`gnnpar.training.minibatch_loop.train_step`, phase by phase: adds each phase's seconds to
    ``clock`` (the same calls in the same order)."""
    from gnnpar.interfaces import LayerOps
    from gnnpar.nn.loss import summed_cross_entropy
    from gnnpar.nn.precision import autocast, matmuls
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with matmuls(precision):
        t1 = time.perf_counter()
        with autocast(precision, batch.x.device):
            out = model(LayerOps(engine.operators(batch), batch.x_dropout), batch.x)
        t2 = time.perf_counter()
        loss = summed_cross_entropy(out, batch.y)
        scaled = loss / max(global_count, 1)
        t3 = time.perf_counter()
        scaled.backward()
    t4 = time.perf_counter()
    engine.sync_grads(model.parameters())
    t5 = time.perf_counter()
    opt.step()
    t6 = time.perf_counter()
    for k, v in (("zero_grad", t1 - t0), ("forward", t2 - t1), ("loss", t3 - t2),
                 ("backward", t4 - t3), ("grad_sync", t5 - t4), ("optimizer", t6 - t5)):
        clock[k] = clock.get(k, 0.0) + v
    return loss.detach().to(torch.float64)


def minibatch(a) -> int:
    """``--mode minibatch`` (module docstring)."""
    import dataclasses

    from gnnpar.nn.models import build_model, sampler_input_dropout
    from gnnpar.cli.options import build_parser
    try:
        from gnnpar.sampling.blocks import block_operators
    except ImportError:  # a tree before deferred transposes: every block's operator, eager
        def block_operators(blocks):
            return [b.operator() for b in blocks]
    from gnnpar.training.minibatch_loop import train_step as mb_train_step
    from gnnpar.sampling.service import SamplingStats
    from gnnpar.training.minibatch_setup import serial_parts
    from gnnpar.training.shard_source import load_graph
    from gnnpar.cli.spec import RunSpec
    from gnnpar.training.trainer import TrainConfig, make_optimizer

    flags = ["--mode", "minibatch", "--dataset", a.dataset, "--model", a.model or "sage",
             "--layers", str(a.layers), "--hidden", str(a.hidden), "--fanouts", a.fanouts,
             "--batch-size", str(a.batch_size), "--device", a.device, "--precision",
             a.precision, "--threads", str(a.threads), "--reorder", a.reorder or "none"]
    if a.cache_dir:
        flags += ["--cache-dir", a.cache_dir]
    spec = RunSpec.from_args(build_parser().parse_args(flags))
    device = torch.device(spec.train.device)
    t0 = time.perf_counter()
    g = load_graph(spec)
    torch.manual_seed(spec.train.seed)
    m = spec.model
    model = build_model(m.model, g.num_features, m.hidden, g.num_classes, m.layers,
                        m.dropout).to(device)
    parts = serial_parts(spec, g, model.norm, device, sampler_input_dropout(model, device))
    service, engine = parts.service, parts.engine
    service.cfg = dataclasses.replace(service.cfg, inline=True)  # sampled by this thread
    opt = make_optimizer(model, TrainConfig(precision=spec.train.precision))
    print(f"{g.summary()}  {a.device} {a.precision}  set up in {time.perf_counter() - t0:.1f} s",
          flush=True)

    # the sampler: pre-sample --batches ready minibatches; the first macrobatch (it compiles
    # or loads the kernels) is not timed
    service.start(0, 1)
    stats, batches, first = SamplingStats(), [], None
    for batch in service.epoch(0, stats):
        batches.append(batch)
        if first is None:
            first = (stats.sampler_s, stats.steps)
        if len(batches) >= a.batches:
            break
    n = len(batches)
    # the operators alone, again, as assembly builds them
    t = time.perf_counter()
    for b in batches:
        block_operators(b.blocks)
    ops_ms = (time.perf_counter() - t) / n * 1e3
    timed = stats.steps - first[1]
    sampler_ms = ((stats.sampler_s - first[0]) / timed if timed else stats.sampler_s / max(
        stats.steps, 1)) * 1e3
    count = max(b.seeds.shape[0] for b in batches)

    print(f"{n} minibatches, {len(batches[0].blocks)} blocks each (layer: mean dst x src, "
          f"nnz):")
    shapes = []
    for i in range(len(batches[0].blocks)):
        dst = statistics.mean(b.blocks[i].num_dst for b in batches)
        src = statistics.mean(b.blocks[i].num_src for b in batches)
        nnz = statistics.mean(b.blocks[i].nnz for b in batches)
        f_in, f_out = model.layers[i].lin_neigh.weight.shape[::-1] if hasattr(
            model.layers[i], "lin_neigh") else model.layers[i].lin.weight.shape[::-1]
        shapes.append({"layer": i, "dst": dst, "src": src, "nnz": nnz, "f_in": int(f_in),
                       "f_out": int(f_out)})
        print(f"  layer {i}: {dst:9.0f} x {src:9.0f}, nnz {nnz:10.0f}, {f_in} -> {f_out}")
    print(f"sampler (inline, one thread of control): {sampler_ms:.2f} ms per minibatch "
          f"(sampling, gather, assembly; the first macrobatch untimed), of which the blocks' "
          f"operators {ops_ms:.2f} ms")

    def run_all(clock=None):
        loss = 0.0
        for b in batches:
            if clock is None:
                loss += float(mb_train_step(model, opt, engine, b, count, spec.train.precision))
            else:
                loss += float(step_phases(model, opt, engine, b, count, spec.train.precision, clock))
        sync(device)
        return loss

    for _ in range(a.warmup):
        run_all()
    times = []
    for _ in range(max(a.epochs, 3)):
        t = time.perf_counter()
        run_all()
        times.append(time.perf_counter() - t)
    step_ms = statistics.median(times) / n * 1e3
    clock = {}
    reps = max(a.epochs, 3)
    for _ in range(reps):
        run_all(clock)
    phases = {k: v / (reps * n) * 1e3 for k, v in clock.items()}
    print(f"step {step_ms:.2f} ms (median of {len(times)} passes over the {n} minibatches); "
          f"by phase (ms/step): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(a.epochs):
            for b in batches:
                mb_train_step(model, opt, engine, b, count, spec.train.precision)
    per = a.epochs * n
    kinds, own = {}, {}
    for e in prof.events():
        us = e.self_cpu_time_total
        if us <= 0:
            continue
        k = mb_kind(e)
        kinds[k] = kinds.get(k, 0.0) + us / per / 1e3
        key = (k, e.name)
        own[key] = own.get(key, 0.0) + us / per / 1e3
    total = sum(kinds.values())
    print(f"profiled CPU time {total:.2f} ms/step (the profiler adds its own); by kind: "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
    print(f"{'ms/step':>9} {'kind':<9} name")
    for (k, name), ms in sorted(own.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"{ms:9.3f} {k:<9} {name[:90]}")
    service.close()
    print(json.dumps({"mode": "minibatch", "dataset": a.dataset, "device": a.device,
                      "precision": a.precision, "threads": a.threads, "model": spec.model.model,
                      "fanouts": list(spec.batch.fanouts), "batch_size": spec.batch.batch_size,
                      "batches": n, "blocks": shapes, "sampler_ms": sampler_ms,
                      "operators_ms": ops_ms, "step_ms": step_ms, "phases_ms": phases,
                      "profiled_ms": total, "by_kind_ms": kinds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
