"""Where a sampler's uniforms come from: one source per minibatch, two kinds.

A sampler asks its source for ``(rows, fanout)`` uniforms in [0, 1) once per layer (seeds'
layer first), for the rows of that layer that draw (see :mod:`.choose`). Either kind is a
function of (seed, epoch, stream, step) only, never of the worker, the device or what else is
sampled in the same macrobatch:

- :class:`PcgDraws` — numpy's PCG64 of :func:`~gnnpar.sampling.neighbor.batch_rng`, the
  draws of the host samplers (:mod:`.neighbor`, :mod:`.bulk`). Made on the host; a device
  sampler given these draws produces the host samplers' blocks exactly (tested).
- :class:`HashDraws` — counter-based: uniform j of drawn row i of layer l is a hash of
  (key, l, i, j), computed by integer torch ops on whatever device the sampler runs on.
  Nothing is made on the host or copied, and CPU and CUDA give the same numbers (the
  integer maths is exact on both), so a GPU run samples the blocks a CPU run of the device
  sampler samples. This is the device sampler's default.

Shapes: ``next(rows, fanout)`` → (rows, fanout) float64 on ``device``.
"""
from __future__ import annotations

import numpy as np
import torch

from .neighbor import batch_rng

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x · c mod 2³²`` for x, c < 2³², every partial product below 2⁴⁸ (no int64 overflow,
    whose wrap-around no device promises)."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche (murmur3's finaliser) on int64 tensors holding values < 2³²."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _key32(*parts: int) -> int:
    """One 32-bit key of a tuple of non-negative ints (host side, once per minibatch)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


class HashDraws:
    """Counter-based uniforms of one minibatch (module docstring)."""

    def __init__(self, seed: int, epoch: int, stream: int, step: int, device="cpu"):
        self.key = _key32(seed, epoch, stream, step)
        self.device = torch.device(device)
        self.layer = 0

    def next(self, rows: int, fanout: int):
        if fanout < 0:
            return None
        layer_key = _key32(self.key, self.layer)
        self.layer += 1
        n = rows * fanout
        counter = torch.arange(n, dtype=torch.int64, device=self.device)
        lo, hi = counter & _MASK32, counter >> 32
        h1 = _mix32(_mix32(lo ^ layer_key) ^ hi)
        h2 = _mix32(h1 ^ 0x9E3779B9)
        # 53 random bits: 32 from h1, 21 from h2
        u = (h1 * 2 ** 21 + (h2 >> 11)).to(torch.float64) * (1.0 / 2 ** 53)
        return u.reshape(rows, fanout)


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


DRAWS = {"hash": HashDraws, "pcg": PcgDraws}
