"""Training negatives: uniform destinations as a pure function of a counter.

Negative ``j`` of training positive ``i`` (its global index in the split's ``train_pos``) in
epoch ``e`` is (u_i, d) with d = h(seed, e, i · ratio + j) mod n, h a SplitMix64-style mix of
64-bit words. No generator state is carried: any rank, step or partition of the positives
draws the same negatives for the same positive, which is what makes a distributed run's
loss equal the serial one's, and a resumed run's equal an unbroken one's. The modulo's bias
is below n / 2⁶⁴.
"""
from __future__ import annotations

import numpy as np

from gnnpar.datasets import InputError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
MAX_RATIO = 1024


def mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 words (wrapping arithmetic), elementwise."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def check_ratio(ratio: int) -> int:
    """``--neg-ratio`` in 1..:data:`MAX_RATIO`, or an InputError."""
    if not 1 <= int(ratio) <= MAX_RATIO:
        raise InputError(f"--neg-ratio must be in 1..{MAX_RATIO}, got {ratio}")
    return int(ratio)


def negatives(pos: np.ndarray, index: np.ndarray, n: int, ratio: int, seed: int,
              epoch: int) -> np.ndarray:
    """(2, K·ratio) negatives of the positives ``pos`` (2, K) whose global indices are
    ``index`` (K,): column i·ratio + j is (pos[0, i], destination j of positive index[i])."""
    check_ratio(ratio)
    index = np.asarray(index, np.int64)
    key = mix(mix(np.array([seed], np.uint64)) ^ np.array([epoch], np.uint64))
    counter = (index[:, None] * ratio + np.arange(ratio, dtype=np.int64)).reshape(-1)
    dst = (mix(counter.astype(np.uint64) ^ key) % np.uint64(n)).astype(np.int64)
    return np.stack([np.repeat(np.asarray(pos[0], np.int64), ratio), dst])
