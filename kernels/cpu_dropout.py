"""Dropout (and ReLU before it) in one pass over the tensor, compiled by numba for CPUs.

A training step applies ReLU then dropout to every hidden activation. Done by torch ops that is
five passes over an (n, f) tensor and a stored mask (clamp, draw, compare, scale, multiply; the
backward two more); here the forward is one pass and the backward one pass, and no mask is
stored: element i is kept when a 16-bit lane of a hash of (seed, i // 4) is at least the drop
threshold, so the backward recomputes the same decision from the seed.

The hash is splitmix64's finaliser of ``seed + (i // 4)·φ`` (φ = 2⁶⁴/golden ratio), whose
four 16-bit lanes decide four consecutive elements: a function of the seed and the element's
position only, so the mask does not depend on the thread count. The drop probability is
rounded to a multiple of 1/65536 (0.5 is exact) and the kept elements are scaled by the
inverse of the rounded keep probability, so the expectation is exactly preserved (as in
:mod:`gnnpar.nn.dropout`'s torch path).

Keeping and ReLU are selects, not products with a 0/1 factor (inf·0 and NaN·0 are NaN): an
element is ``src·scale`` where kept and (with ReLU) ``cond`` is not ≤ 0, else exactly 0. So
NaN passes ReLU and propagates where kept, −inf becomes 0, and a gradient where ReLU was off
or the element dropped is 0 even when it is ±inf or NaN — the rule :mod:`gnnpar.nn.dropout`
states, which the GPU pass follows too.

Shapes: tensors of one shape (bf16/fp16 through a float32 copy, returned in their dtype).
"""
from __future__ import annotations

import functools
from typing import Optional

import numpy as np
import torch

from gnnpar.partitioners.random_part import splitmix64

from .cpu_spmm import available, pool_threads, run_parallel, written
from .jit import compile_module

#: elements per parallel chunk (a multiple of 4: one hash serves four elements)
CHUNK = 1 << 14
prange = range  # numba.prange once the pass is compiled (gnnpar.kernels.jit)
# the compiled functions, set by _compiled()
splitmix = masked_scale_pass = None
PHI = np.uint64(0x9E3779B97F4A7C15)


def _splitmix(seed, g):  # pragma: no cover - compiled
    z = seed + np.uint64(g) * PHI
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _masked_scale_pass(src, cond, out, seed, drop_units, scale, relu):  # pragma: no cover
    # Per chunk: the hashes into a buffer of 16-bit lanes (a uint64 written over four lanes:
    # lane k of the hash is element 4g + k on little-endian machines, which every numba
    # target is), then the selects into a second buffer, then a copy to out. The selects'
    # loop has no hash in it and writes where it does not read (out may be src itself), so
    # it vectorises; one loop doing it all runs scalar, with a branch per element that a
    # random mask mispredicts half the time. Selects, not products with a 0/1 factor: inf·0
    # and NaN·0 would be NaN.
    n = src.shape[0]
    du = np.uint16(drop_units)
    zero = np.float32(0.0)
    for c in prange((n + CHUNK - 1) // CHUNK):
        lo = c * CHUNK
        hi = min(n, lo + CHUNK)
        lanes = np.empty(CHUNK, np.uint16)
        words = lanes.view(np.uint64)
        for g in range((hi - lo + 3) // 4):
            words[g] = splitmix(seed, lo // 4 + g)
        s, cc = src[lo:hi], cond[lo:hi]
        vals = np.empty(hi - lo, np.float32)
        if relu:  # kept where the lane passes and cond is not <= 0 (positive or NaN)
            for k in range(hi - lo):
                keep = lanes[k] >= du
                vals[k] = s[k] * scale if keep & (cc[k] > zero) else (
                    s[k] * scale if keep & (cc[k] != cc[k]) else zero)
        else:
            for k in range(hi - lo):
                vals[k] = s[k] * scale if lanes[k] >= du else zero
        out[lo:hi] = vals


@functools.lru_cache(maxsize=None)
def _compiled():
    """``(numba, kernel)``, made on first use (see :mod:`kernels.cpu_spmm`): the pass and
    the hash it inlines are module-level (:func:`gnnpar.kernels.jit.compile_module`),
    so numba's disk cache finds the pass again."""
    import numba
    compile_hash()
    kernels = compile_module(__name__, ("masked_scale_pass",), parallel=True, cache=True,
                             nogil=True)
    return numba, kernels.masked_scale_pass


def compile_hash() -> None:
    """Set ``splitmix``, the mask's hash, compiled to be inlined: by this module's pass and
    by other modules' kernels that drop with the same mask (the sampler's feature copy,
    :mod:`gnnpar.sampling.row_gather`), which call it as ``cpu_dropout.splitmix``."""
    compile_module(__name__, ("splitmix",), inline="always")


#: dtypes the pass serves; bf16/fp16 (``--precision bf16``) go through a float32 copy, so a
#: run draws the same masks in either precision
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def keep_mask(numel: int, seed: int, drop_units: int) -> np.ndarray:
    """The kernel's keep decisions as a bool array, computed with numpy (the path without
    numba draws the same masks from the same seed)."""
    g = np.arange((numel + 3) // 4, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = splitmix64(np.uint64(seed) + g * PHI)
    lanes = np.stack([(z >> np.uint64(16 * k)) & np.uint64(0xFFFF) for k in range(4)], axis=1)
    return lanes.reshape(-1)[:numel] >= np.uint64(drop_units)


def usable(x: torch.Tensor) -> bool:
    """Whether the compiled pass serves ``x`` (a CPU tensor of :data:`DTYPES`, numba
    available)."""
    return x.device.type == "cpu" and x.dtype in DTYPES and available()


def masked_scale(src: torch.Tensor, cond: torch.Tensor, seed: int, drop_units: int,
                 scale: float, relu: bool, out: Optional[torch.Tensor] = None
                 ) -> torch.Tensor:
    """``src·scale`` where the element is kept (and, with ``relu``, ``cond`` is not ≤ 0:
    positive or NaN), else 0, by a select.

    Forward: ``src = cond = x``. Backward: ``src`` = the gradient, ``cond`` = the forward's
    output (not ≤ 0 exactly where ReLU passed and dropout kept).

    ``out``: a contiguous float32 tensor shaped like ``src`` to write into and return (its
    version bumped); it may be ``src`` and ``cond`` themselves (one element's result depends
    on that element alone, read before it is written), so ``masked_scale(z, z, …, out=z)``
    is the pass in place, with the same mask as a fresh output."""
    if not 0 <= drop_units < 65536:
        raise ValueError(f"drop_units must be in [0, 65536), got {drop_units}")
    dtype = src.dtype
    src = src.detach().float().contiguous()
    cond = cond.detach().float().contiguous()
    given = out is not None
    if given:
        if (out.dtype != torch.float32 or out.shape != src.shape or not out.is_contiguous()
                or out.device.type != "cpu"):
            raise ValueError("out must be a contiguous float32 CPU tensor shaped like src")
    else:
        out = torch.empty_like(src)
    if src.numel() == 0:
        return out if given else out.to(dtype)
    numba, kernel = _compiled()
    run_parallel(numba, pool_threads(numba), kernel, src.view(-1).numpy(),
                 cond.view(-1).numpy(), out.detach().view(-1).numpy(), np.uint64(seed),
                 np.uint64(drop_units), np.float32(scale), bool(relu))
    return written(out) if given else out.to(dtype)
