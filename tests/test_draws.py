"""The device sampler's counter-based draws (:mod:`gnnpar.sampling.draws`): SplitMix64 to the
bit, 53 random bits per uniform, unrelated streams for keys that differ in one bit."""
import numpy as np
import pytest
import torch

from gnnpar.sampling import draws
from gnnpar.sampling.draws import HashDraws, mix64, uniforms

_M64 = 2 ** 64 - 1
_GAMMA = 0x9E3779B97F4A7C15


def splitmix64(seed: int, n: int):
    """SplitMix64 (Steele, Lea, Flood 2014) on Python ints: the reference."""
    out = []
    for _ in range(n):
        seed = (seed + _GAMMA) & _M64
        z = seed
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        out.append(z ^ (z >> 31))
    return out


def as_ints(u: torch.Tensor) -> np.ndarray:
    """The 53-bit integers a tensor of uniforms was made of."""
    return (u.double() * 2 ** 53).to(torch.int64).numpy().ravel()


def test_reference_is_splitmix64():
    # the published first outputs of SplitMix64 seeded with 1234567
    assert splitmix64(1234567, 3) == [6457827717110365317, 3203168211198807973,
                                      9817491932198370423]
    assert mix64(1234567 + _GAMMA) == 6457827717110365317


@pytest.mark.parametrize("key", [0, 1, 2 ** 32 - 1, 2 ** 63 + 12345, _M64])
def test_torch_ops_compute_splitmix64_to_the_bit(key):
    """The int64 tensor maths (the only implementation, on every device) gives the reference
    integers: for counters from 0 and for counters past 2³² and near 2⁶³."""
    n = 600
    want = [v >> 11 for v in splitmix64(mix64(key), n)]
    assert as_ints(uniforms(key, n)).tolist() == want
    counters = torch.tensor([2 ** 32 - 1, 2 ** 32, 2 ** 32 + 7, 2 ** 40 + 3, 2 ** 63 - 1])
    got = draws._bits53(mix64(key), counters).tolist()
    assert got == [mix64(mix64(key) + (int(c) + 1) * _GAMMA) >> 11 for c in counters]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_draws_equal_cpu_draws():
    for key in (3, 2 ** 40 + 1):
        assert torch.equal(uniforms(key, 100_000, "cuda").cpu(), uniforms(key, 100_000))


def test_uniforms_carry_53_random_bits():
    """Birthday counts of 2²⁰ draws from four unrelated keys match a source of 53 random
    bits: about 128 pairs share their top 32 bits (fewer means the top bits are not
    random: a bijection of a 32-bit counter gives none), and almost none of those pairs
    also share the other 21 bits (a uniform that is a function of 32 bits repeats whenever
    its top 32 bits do). Every one of the 53 bits is set half the time."""
    keys = (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89)
    ints = np.concatenate([as_ints(uniforms(key, 2 ** 18)) for key in keys])
    top = ints >> 21
    _, top_counts = np.unique(top, return_counts=True)
    _, full_counts = np.unique(ints, return_counts=True)
    top_pairs = int((top_counts * (top_counts - 1) // 2).sum())
    full_pairs = int((full_counts * (full_counts - 1) // 2).sum())
    assert 60 <= top_pairs <= 240, top_pairs  # Poisson, mean 128
    assert full_pairs <= 2, (full_pairs, top_pairs)
    bits = (ints[:, None] >> np.arange(53)) & 1
    assert np.abs(bits.mean(axis=0) - 0.5).max() < 0.005
    assert int(ints.max()) < 2 ** 53


@pytest.mark.parametrize("delta", [1, 2, 3, 4, 8, 16, 255, 1 << 20, 1 << 40])
def test_keys_differing_in_low_bits_give_unrelated_streams(delta):
    """Keys k and k ^ delta (and k + delta): no value in common, no correlation at the same
    counter or the next, and a joint histogram of same-counter pairs that fits
    independence (χ² over 16 × 16 cells)."""
    n = 1 << 14  # a power of two: XOR-ing the key into the counter would only permute it
    key = 0x5DEECE66D
    a = uniforms(key, n)
    for other in (key ^ delta, key + delta):
        b = uniforms(other, n)
        assert not np.intersect1d(as_ints(a), as_ints(b)).size
        assert not torch.equal(torch.sort(a).values, torch.sort(b).values)
        for x, y in ((a, b), (a[:-1], b[1:]), (a[1:], b[:-1])):
            assert abs(float(torch.corrcoef(torch.stack([x, y]))[0, 1])) < 5 / n ** 0.5
        cells = (a * 16).long() * 16 + (b * 16).long()
        counts = torch.bincount(cells, minlength=256).double()
        chi2 = float(((counts - n / 256) ** 2 / (n / 256)).sum())
        assert chi2 < 255 + 6 * (2 * 255) ** 0.5, chi2  # mean 255, sd ~22.6


def test_hash_draws_are_the_layer_keys_streams():
    """HashDraws: layer l of a minibatch is the stream of that layer's 64-bit key, laid out
    row-major; a function of (seed, epoch, stream, step) alone."""
    d = HashDraws(1, 2, 3, 4)
    first, second = d.next(7, 5), d.next(3, 2)
    key = draws._key64(1, 2, 3, 4)
    assert torch.equal(first, uniforms(draws._key64(key, 0), 35).reshape(7, 5))
    assert torch.equal(second, uniforms(draws._key64(key, 1), 6).reshape(3, 2))
    assert d.next(4, -1) is None
    again = HashDraws(1, 2, 3, 4)
    assert torch.equal(again.next(7, 5), first)
    assert again.next(0, 3).shape == (0, 3)
    for other in (HashDraws(1, 2, 3, 5), HashDraws(2, 2, 3, 4)):
        assert not torch.equal(other.next(7, 5), first)
