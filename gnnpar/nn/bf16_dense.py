"""The dense products of a ``--precision bf16`` run on the CPU: torch's bf16 GEMM, or the same
products as float32 GEMMs of the bf16 operands where those are faster on this machine.

Under bf16 autocast a layer's ``x·Wᵀ + b`` rounds x, W and b to bf16, multiplies, sums in
float32 and rounds the result to bf16. On CPUs without a fast bf16 path torch's bf16 GEMM is
several times slower than its float32 one (``docs/performance.md``, "bf16 dense products"),
while a float32 GEMM of the same bf16 values computes the same thing: a product of two bf16
numbers is exact in float32, the sums are float32 in both, and the result is rounded to bf16
the same way. Only the order of the float32 sums can differ, so the two choices differ in a
result's last bf16 bit at most where a sum lands near a rounding boundary.

:func:`linear` is that product as the built-in layers compute it (:mod:`gnnpar.nn.models`,
:mod:`gnnpar.nn.attention`, :mod:`gnnpar.link.decoders`; their linear maps are :class:`Linear`
modules, ``nn.Linear`` with this product): ``F.linear`` outside a CPU bf16
autocast region, and inside one either ``F.linear`` under autocast (torch's bf16 GEMM) or
:class:`_Bf16Linear`, which keeps bf16 copies of x and W for the backward — the memory
autocast keeps — and runs every product of the forward and backward as a float32 GEMM of
bf16 values with a bf16 result, as autocast's backward rounds its gradients. A user's own
``nn.Linear`` stays under autocast.

**Which one** (:func:`upcasts`) is measured once per machine, key and thread count, and kept
in the per-machine cache beside the SpMM size rules (:mod:`gnnpar.kernels.machine_rules`): the
first bf16 process times both on :data:`PROBE_SHAPES` (best of :data:`PROBE_ROUNDS`
interleaved rounds after a warm-up) and takes the float32 GEMMs where they take under
:data:`MARGIN` × the bf16 GEMM's time at every shape; every later process, every rank of a
run and its ``--resume`` read that entry, so they compute alike. Where the cache cannot be
used torch's bf16 GEMM serves (the fixed choice). ``GNNPAR_BF16_DENSE`` (``bf16`` or
``fp32``) pins the choice without probing.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from gnnpar.kernels import machine_rules
from gnnpar.kernels.local import autocast_dtype

ENV = "GNNPAR_BF16_DENSE"
CHOICES = ("auto", "bf16", "fp32")
#: the cache entry's name beside the SpMM rules' dtype names
NAME = "dense_bf16"
#: (rows, f_in, f_out) of the probe's products: a hidden layer's and an output layer's shape
PROBE_SHAPES = ((1 << 15, 128, 64), (1 << 15, 64, 16))
PROBE_ROUNDS = 3
#: the float32 GEMMs are taken where they take under this fraction of the bf16 GEMM's time
MARGIN = 0.9


def choice() -> str:
    """``GNNPAR_BF16_DENSE`` (default ``auto``); ValueError for another value."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}, got {value!r}")
    return value


def upcasts() -> bool:
    """Whether a CPU bf16 dense product runs as float32 GEMMs of bf16 values here (module
    docstring), at the current torch thread count."""
    pinned = choice()
    if pinned != "auto":
        return pinned == "fp32"
    return _measured(torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _measured(threads: int) -> bool:
    return machine_rules.decided(NAME, threads, measure, decide, entry_rule, False)


def measure(rounds: int = PROBE_ROUNDS) -> Dict[str, Tuple[float, float]]:
    """``{"rows x f_in x f_out": (bf16 GEMM's best seconds, float32 GEMMs' best seconds)}``
    of a forward product at each of :data:`PROBE_SHAPES`, both sides back to back in
    alternating order."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for rows, f_in, f_out in PROBE_SHAPES:
        x = torch.randn(rows, f_in, generator=gen).to(torch.bfloat16)
        w = torch.randn(f_out, f_in, generator=gen)
        sides = (lambda: F.linear(x, w.to(torch.bfloat16)),
                 lambda: _forward(x, w.to(torch.bfloat16), None))
        best = [float("inf"), float("inf")]
        for r in range(rounds + 1):  # round 0 warms up
            for side in ((0, 1) if r % 2 else (1, 0)):
                t = time.perf_counter()
                sides[side]()
                t = time.perf_counter() - t
                if r:
                    best[side] = min(best[side], t)
        out[f"{rows}x{f_in}x{f_out}"] = (best[0], best[1])
    return out


def decide(times: Dict[str, Tuple[float, float]]) -> str:
    """``"fp32"`` where the float32 GEMMs win by :data:`MARGIN` at every probed shape, else
    ``"bf16"``."""
    wins = all(up < MARGIN * native for native, up in times.values())
    return "fp32" if times and wins else "bf16"


def entry_rule(entry) -> Tuple[bool, Optional[bool]]:
    """``(valid, upcasts)`` of a cached entry."""
    if isinstance(entry, dict) and entry.get("rule") in ("bf16", "fp32"):
        return True, entry["rule"] == "fp32"
    return False, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None
           ) -> torch.Tensor:
    """``x·weightᵀ + bias`` as the layers compute it (module docstring)."""
    if (x.device.type == "cpu" and x.dim() == 2 and x.is_floating_point()
            and autocast_dtype("cpu") == torch.bfloat16 and upcasts()):
        return _Bf16Linear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose product is :func:`linear`'s: the same parameters, state-dict
    keys and hooks, so a layer's module calls (and the forward hooks inference puts on its
    linear maps, :mod:`gnnpar.infer.inference`) stay as they are."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def _forward(xb: torch.Tensor, wb: torch.Tensor, bb: Optional[torch.Tensor]) -> torch.Tensor:
    """bf16 ``xb·wbᵀ + bb`` as a float32 GEMM, rounded to bf16."""
    return F.linear(xb.float(), wb.float(), None if bb is None else bb.float()).to(
        torch.bfloat16)


class _Bf16Linear(torch.autograd.Function):
    """Autocast's bf16 linear (operands rounded to bf16, float32 sums, bf16 results and input
    gradients; the parameters' gradients in their own dtype) computed with float32 GEMMs."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        with torch.autocast("cpu", enabled=False):
            xb, wb = x.to(torch.bfloat16), weight.to(torch.bfloat16)
            bb = None if bias is None else bias.to(torch.bfloat16)
            ctx.save_for_backward(xb, wb)
            ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
            return _forward(xb, wb, bb)

    @staticmethod
    def backward(ctx, grad):
        xb, wb = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        gx = gw = gb = None
        with torch.autocast("cpu", enabled=False):
            g = grad.float()
            if ctx.needs_input_grad[0]:
                gx = (g @ wb.float()).to(torch.bfloat16).to(x_dtype)
            if ctx.needs_input_grad[1]:
                gw = (g.t() @ xb.float()).to(torch.bfloat16).to(w_dtype)
            if b_dtype is not None and ctx.needs_input_grad[2]:
                gb = grad.sum(0, dtype=torch.float32).to(torch.bfloat16).to(b_dtype)
        return gx, gw, gb
