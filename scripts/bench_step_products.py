#!/usr/bin/env python
"""The dense products one mini-batch GraphSAGE step cannot avoid, timed alone: a floor under
the step on this machine.

    python scripts/bench_step_products.py                 # issue 25's blocks, 1 and 2 threads
    python scripts/bench_step_products.py --threads 2 --rounds 5

A SAGE layer ``out = h_dst W_self + mean(h_src) W_neigh`` on a block of ``d`` destinations and
``s`` sources does, forward, two ``(rows × f_in) @ (f_in × f_out)`` products (``rows`` = ``d``
where the mean is taken first, as when ``f_in <= f_out``; else the neighbour term projects all
``s`` sources first), backward the two weight gradients (the same flop count) and, except on
the input layer, whose features need no gradient, the two input gradients. DGL's
``SAGEConv('mean')`` picks the same order, so both systems do these products; any step,
ours or DGL's, takes at least their time on the same threads. The default blocks are the mean
shapes ``scripts/profile_epoch.py --mode minibatch`` prints for ``rmat:scale=17,ef=16``,
fanouts 15,10,5, batch 1024 (``--layers d,s,f_in,f_out;...`` sets others).

Each product is timed as autograd runs it (``torch.mm`` into a new output, transposed
operands as views), the median of ``--repeats`` after one warm-up. Where a layer's two terms
have the same rows, the joined arrangement (one product on ``[h_dst | mean]``: the same flops
in wider products) is timed too, and the step's figure takes each layer's faster one. Thread
counts alternate within each round; the load average is printed with every round. The last
line is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timev, beside this script
from timev import loadavg  # noqa: E402

DEFAULT_LAYERS = "11857,32903,128,256;2959,11857,256,256;1022,2959,256,16"


def products(d: int, s: int, f_in: int, f_out: int, input_layer: bool, joined: bool):
    """(m, k, n, transpose_a, transpose_b) of each product of one layer's step; with
    ``joined``, the self and neighbour terms as one product on ``[h_dst | mean]`` (possible
    where both have ``d`` rows) instead of two."""
    if joined:
        out = [(d, 2 * f_in, f_out, False, False), (2 * f_in, d, f_out, True, False)]
        return out + ([] if input_layer else [(d, f_out, 2 * f_in, False, True)])
    rows = d if f_in <= f_out else s
    out = [(d, f_in, f_out, False, False), (rows, f_in, f_out, False, False),  # forward
           (f_in, d, f_out, True, False), (f_in, rows, f_out, True, False)]  # weight grads
    if not input_layer:  # input gradients
        out += [(d, f_out, f_in, False, True), (rows, f_out, f_in, False, True)]
    return out


def arrangements(layer, input_layer: bool) -> dict:
    """A layer's products as two products per pass, and joined where the rows allow."""
    out = {"split": products(*layer, input_layer, joined=False)}
    if layer[2] <= layer[3]:  # f_in <= f_out: both terms on the d destination rows
        out["joined"] = products(*layer, input_layer, joined=True)
    return out


def operands(m, k, n, ta, tb, gen):
    a = torch.randn(k, m, generator=gen).t() if ta else torch.randn(m, k, generator=gen)
    b = torch.randn(n, k, generator=gen).t() if tb else torch.randn(k, n, generator=gen)
    return a, b


def time_product(a, b, repeats: int) -> float:
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def flops(prods) -> int:
    return sum(2 * m * k * n for m, k, n, _, _ in prods)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=DEFAULT_LAYERS,
                    help="d,s,f_in,f_out of each block, input layer first, ';' between")
    ap.add_argument("--threads", default="1,2", help="thread counts, alternated each round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    layers = [tuple(int(x) for x in spec.split(",")) for spec in a.layers.split(";")]
    if any(len(layer) != 4 or min(layer) < 1 for layer in layers):
        ap.error("--layers: four positive integers d,s,f_in,f_out per block")
    threads = [int(t) for t in a.threads.split(",")]
    gen = torch.Generator().manual_seed(0)
    plan = [{how: [operands(*p, gen) for p in prods]
             for how, prods in arrangements(layer, i == 0).items()}
            for i, layer in enumerate(layers)]
    split = [products(*layer, i == 0, joined=False) for i, layer in enumerate(layers)]
    gflop = sum(flops(prods) for prods in split) / 1e9
    print(f"{sum(map(len, split))} products, {gflop:.2f} GFLOP a step; torch {torch.__version__}")
    per: dict = {t: [] for t in threads}
    for r in range(a.rounds):
        for t in threads:
            torch.set_num_threads(t)
            times = [{how: 1e3 * sum(time_product(*ops, a.repeats) for ops in prods)
                      for how, prods in ways.items()} for ways in plan]  # ms, per layer
            total = sum(min(layer.values()) for layer in times)
            per[t].append(total)
            print(f"round {r} threads {t}: {total:.1f} ms a step ({gflop / total * 1e3:.0f} "
                  f"GFLOP/s); load {loadavg()}; " + "; ".join(
                      f"layer{i} " + ", ".join(f"{how} {ms:.2f}" for how, ms in layer.items())
                      for i, layer in enumerate(times)), flush=True)
    summary = {str(t): {"median_ms": statistics.median(v), "min_ms": min(v), "rounds_ms": v}
               for t, v in per.items()}
    for t, s in summary.items():
        print(f"threads {t}: median {s['median_ms']:.1f} ms, best {s['min_ms']:.1f} ms a step "
              "(each layer in its faster arrangement)")
    print(json.dumps({"gflop": gflop, "layers": layers, "threads": summary}))


if __name__ == "__main__":
    main()
