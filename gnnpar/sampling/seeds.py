"""Which seeds each rank trains on at each step: the same number of steps on every rank.

Rank r owns ``n_r`` training seeds (its shard's train mask). Every rank runs

    S = ceil(max_r n_r / batch_size)

steps per epoch and splits its own shuffled seeds into S nearly equal minibatches
(``np.array_split``), so a rank with fewer seeds takes smaller minibatches instead of running
out (one rank with 3× the seeds of another takes batches 3× larger; a rank without seeds
takes empty ones). No rank ever waits for a step another rank does not take, and every rank
knows every step's *global* seed count without communication, so a step's loss is the mean
over all ranks' seeds of that step and the summed gradients equal the serial ones.

Shuffles and minibatch generators depend only on (seed, epoch, stream, step), where
``stream`` is the data-parallel rank (see :func:`~gnnpar.sampling.neighbor.batch_rng`).
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from gnnpar.datasets import InputError

#: ``step`` tag of the per-epoch shuffle generator (minibatch generators use 0 … S−1).
SHUFFLE_TAG = 2 ** 32 - 1


class EpochPlan:
    """Seeds of every step of every epoch for data-parallel rank ``stream``.

    ``seeds``: this rank's training seeds (global ids); ``counts``: every rank's seed count
    (len = data-parallel size); ``steps`` = ceil(max(counts) / batch_size) (at least 1).
    """

    def __init__(self, seeds: np.ndarray, counts: Sequence[int], stream: int, batch_size: int,
                 seed: int = 0):
        if batch_size < 1:
            raise InputError(f"--batch-size must be >= 1, got {batch_size}")
        self.seeds = np.sort(np.asarray(seeds, np.int64))
        self.counts = np.asarray(counts, np.int64)
        if self.counts[stream] != self.seeds.shape[0]:
            raise ValueError(f"rank {stream} has {self.seeds.shape[0]} seeds but counts say "
                             f"{self.counts[stream]}")
        self.stream, self.batch_size, self.seed = int(stream), int(batch_size), int(seed)
        self.steps = max(1, -(-int(self.counts.max(initial=0)) // self.batch_size))
        # array_split gives the first (count % S) minibatches one seed more
        base, extra = np.divmod(self.counts, self.steps)
        step_ids = np.arange(self.steps)
        self._global = (base.sum() + (step_ids[:, None] < extra[None, :]).sum(axis=1)
                        ).astype(np.int64)

    @property
    def total(self) -> int:
        """Training seeds over all ranks (one epoch visits each once)."""
        return int(self.counts.sum())

    def global_count(self, step: int) -> int:
        """Seeds of step ``step`` over all ranks."""
        return int(self._global[step])

    def minibatches(self, epoch: int) -> List[np.ndarray]:
        """This rank's S seed arrays of ``epoch`` (shuffled, then sorted inside a minibatch
        so a minibatch's output rows come in id order)."""
        rng = np.random.default_rng([self.seed, int(epoch), self.stream, SHUFFLE_TAG])
        order = rng.permutation(self.seeds)
        return [np.sort(part) for part in np.array_split(order, self.steps)]
