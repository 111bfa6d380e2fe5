"""The epoch loop every trainer runs: full batch (:func:`gnnpar.training.trainer.fit`), mini batch
(:func:`gnnpar.training.minibatch_loop.fit_minibatch`) and link prediction
(:func:`gnnpar.link.loop.fit_link`).

A trainer supplies what its mode does differently — one epoch's training, the evaluation, and
the record the epoch logs — and :func:`run_epochs` what is the same for all of them: epochs
``start_epoch`` to ``cfg.epochs - 1``; an evaluation after every ``cfg.eval_every``-th epoch
and after the last (between evaluations a record repeats the latest metrics); one record an
epoch, passed to ``on_epoch`` as soon as it is made; and the stop after an epoch whose loss is
NaN or infinite. The loss in a record is the global one (every rank's sum over the global
count), so every rank stops after the same epoch.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, List, Optional

from gnnpar.training.memory import peak_memory_bytes


def evaluation_due(epoch: int, cfg) -> bool:
    """Whether epoch ``epoch`` (0-based) ends with an evaluation: every ``cfg.eval_every``-th
    epoch and the last one."""
    return (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs


def run_epochs(cfg, train: Callable[[int], Any], evaluate: Callable[[], Dict[str, float]],
               record: Callable[[int, Any, Dict[str, float], float], dict],
               metrics: Dict[str, float], start_epoch: int = 0,
               on_epoch: Optional[Callable[[dict], None]] = None) -> List[dict]:
    """The records of epochs ``[start_epoch, cfg.epochs)``, or up to the first whose loss is
    not finite.

    ``train(epoch)`` trains one epoch and returns what ``record`` needs of it;
    ``evaluate()`` returns the metrics (``metrics``: those a record carries before the first
    evaluation); ``record(epoch, trained, metrics, t0)`` returns the epoch's record, with its
    global ``loss``, where ``t0`` is ``time.perf_counter()`` at the epoch's start."""
    history = []
    for epoch in range(start_epoch, cfg.epochs):
        t0 = time.perf_counter()
        trained = train(epoch)
        if evaluation_due(epoch, cfg):
            metrics = evaluate()
        rec = record(epoch, trained, metrics, t0)
        history.append(rec)
        if on_epoch is not None:
            on_epoch(rec)
        if not math.isfinite(rec["loss"]):  # diverged: the loss is global, all ranks stop
            break
    return history


def memory_fields(memory, device, reduce_sum, reduce_max) -> dict:
    """An epoch record's memory fields: every rank's peak and data bytes when ``memory`` (a
    :class:`gnnpar.training.memory.RankMemory`; one small sum over the ranks with ``reduce_sum``),
    else the largest rank's peak on ``device`` (``reduce_max``)."""
    if memory is not None:
        return memory.record(reduce_sum)
    return {"peak_mem_bytes": peak_memory_bytes(device, reduce_max)}
