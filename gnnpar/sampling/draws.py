"""Where a sampler's uniforms come from: one source per minibatch, two kinds.

A sampler asks its source for ``(rows, fanout)`` uniforms in [0, 1) once per layer (seeds'
layer first), for the rows of that layer that draw (see :mod:`.choose`). Either kind is a
function of (seed, epoch, stream, step) only, never of the worker, the device or what else is
sampled in the same macrobatch:

- :class:`PcgDraws` — numpy's PCG64 of :func:`~gnnpar.sampling.neighbor.batch_rng`, the
  draws of the host samplers (:mod:`.neighbor`, :mod:`.bulk`). Made on the host; a device
  sampler given these draws produces the host samplers' blocks exactly (tested).
- :class:`HashDraws` — counter-based: uniform j of drawn row i of layer l is output
  ``i·fanout + j`` of SplitMix64 (:func:`uniforms`) seeded by the layer's 64-bit key, computed
  by integer torch ops on whatever device the sampler runs on. Nothing is made on the host or
  copied, and CPU and CUDA give the same numbers (the integer maths is exact on both), so a
  GPU run samples the blocks a CPU run of the device sampler samples. This is the device
  sampler's default.

Shapes: ``next(rows, fanout)`` → (rows, fanout) float64 on ``device``.
"""
from __future__ import annotations

import numpy as np
import torch

from gnnpar.sampling.neighbor import batch_rng

_MASK16, _MASK32, _MASK64 = 0xFFFF, 0xFFFFFFFF, 2 ** 64 - 1
#: SplitMix64's increment (2⁶⁴/φ, odd) and its finaliser's multipliers (Stafford's mix13)
_GAMMA, _MUL1, _MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def mix64(z: int) -> int:
    """SplitMix64's finaliser on a Python int: a bijection of 64-bit words in which every
    input bit flips about half the output bits."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _MUL1) & _MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & _MASK64
    return z ^ (z >> 31)


def uniforms(key: int, n: int, device="cpu") -> torch.Tensor:
    """The first ``n`` outputs of SplitMix64 seeded with ``mix64(key)``, as float64 uniforms
    in [0, 1) with 53 random bits each (the output's top 53 bits).

    Output c is ``mix64(s + (c + 1)·γ)`` with ``s = mix64(key)``: every bit of the key and of
    the counter goes through the whole 64-bit mixer, so keys that differ in any bit (low
    ones included) seed unrelated points of the Weyl sequence ``s + c·γ``. Two streams of n
    outputs share a value only if one seed is fewer than n steps of γ from the other, a
    chance of about n/2⁶³ for two keys.
    """
    counter = torch.arange(int(n), dtype=torch.int64, device=torch.device(device))
    return _bits53(mix64(key), counter).to(torch.float64) * (1.0 / 2 ** 53)


def _bits53(seed: int, counter: torch.Tensor) -> torch.Tensor:
    """Top 53 bits of SplitMix64 output ``counter`` (int64 tensor ≥ 0) for ``seed``, as int64.

    A 64-bit word is held as two int64 tensors of 32-bit halves, and every product is cut
    into 16-bit pieces so that every intermediate stays below 2⁶³: int64 never wraps, whose
    wrap-around no device promises, so every device computes the same integers.
    """
    hi, lo = _mul64(counter >> 32, counter & _MASK32, _GAMMA)
    hi, lo = _add64(hi, lo, (seed + _GAMMA) & _MASK64)
    hi, lo = _xorshift64(hi, lo, 30)
    hi, lo = _mul64(hi, lo, _MUL1)
    hi, lo = _xorshift64(hi, lo, 27)
    hi, lo = _mul64(hi, lo, _MUL2)
    hi, lo = _xorshift64(hi, lo, 31)
    return hi * 2 ** 21 + (lo >> 11)


def _mul64(hi: torch.Tensor, lo: torch.Tensor, c: int):
    """``(hi·2³² + lo) · c mod 2⁶⁴`` as (hi, lo) halves, for halves < 2³² and c < 2⁶⁴."""
    c0, c1 = c & _MASK32, c >> 32
    b0, b1 = c0 & _MASK16, c0 >> 16
    l0, l1 = lo & _MASK16, lo >> 16
    mid = l1 * b0 + l0 * b1                                   # < 2³³
    low = l0 * b0 + ((mid & _MASK16) << 16)                   # low 32 bits: lo·c0 mod 2³²
    carry = l1 * b1 + (mid >> 16) + (low >> 32)               # lo·c0 div 2³²
    lo_c1 = l0 * c1 + (((l1 * c1) & _MASK16) << 16)           # ≡ lo·c1 (mod 2³²), < 2⁴⁹
    hi_c0 = (hi & _MASK16) * c0 + ((((hi >> 16) * c0) & _MASK16) << 16)  # ≡ hi·c0, < 2⁴⁹
    return (carry + lo_c1 + hi_c0) & _MASK32, low & _MASK32


def _add64(hi: torch.Tensor, lo: torch.Tensor, c: int):
    """``(hi·2³² + lo) + c mod 2⁶⁴`` as (hi, lo) halves."""
    lo = lo + (c & _MASK32)
    return (hi + (c >> 32) + (lo >> 32)) & _MASK32, lo & _MASK32


def _xorshift64(hi: torch.Tensor, lo: torch.Tensor, s: int):
    """``z ^ (z >> s)`` of the 64-bit word z = (hi, lo), for 0 < s < 32."""
    return hi ^ (hi >> s), lo ^ ((lo >> s) | ((hi << (32 - s)) & _MASK32))


def _key64(*parts: int) -> int:
    """One 64-bit key of a tuple of non-negative ints (host side, once per minibatch)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)[0])


class HashDraws:
    """Counter-based uniforms of one minibatch (module docstring): layer l's are
    :func:`uniforms` of the key of (seed, epoch, stream, step, l)."""

    def __init__(self, seed: int, epoch: int, stream: int, step: int, device="cpu"):
        self.key = _key64(seed, epoch, stream, step)
        self.device = torch.device(device)
        self.layer = 0

    def next(self, rows: int, fanout: int):
        if fanout < 0:
            return None
        layer_key = _key64(self.key, self.layer)
        self.layer += 1
        return uniforms(layer_key, rows * fanout, self.device).reshape(rows, fanout)


class PcgDraws:
    """The host samplers' draws (:func:`~gnnpar.sampling.neighbor.batch_rng`), moved to
    ``device``."""

    def __init__(self, seed: int, epoch: int, stream: int, step: int, device="cpu"):
        self.rng = batch_rng(seed, epoch, stream, step)
        self.device = torch.device(device)

    @classmethod
    def from_rng(cls, rng: np.random.Generator, device="cpu") -> "PcgDraws":
        self = cls.__new__(cls)
        self.rng, self.device = rng, torch.device(device)
        return self

    def next(self, rows: int, fanout: int):
        if fanout < 0:
            return None
        u = self.rng.random((rows, fanout)) if rows else np.zeros((0, fanout))
        return torch.from_numpy(u).to(self.device)


#: the counter-based generator :class:`HashDraws` uses, recorded in the identity of a
#: run that samples with it (a checkpoint of other draws would not replay the same blocks)
HASH_GENERATOR = "splitmix64"

DRAWS = {"hash": HashDraws, "pcg": PcgDraws}
