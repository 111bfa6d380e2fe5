"""Burst sampling (``ServiceConfig.burst`` in gnnpar/sampling/service.py; the one-process
CPU default of gnnpar/training/minibatch_setup.py): the inline reference's minibatches; no worker
starts a group's task before the trainer has taken every earlier minibatch and asked for the
group; the workers keep the trainer's priority; the settings it refuses; the rule that picks
it."""
import os
import sys
import threading
import time

import numpy as np
import pytest
import torch

from gnnpar.datasets import InputError
from gnnpar.nn.models import GNN
from gnnpar.training import minibatch_setup as setup
from gnnpar.sampling.placement import resolve_placement
from gnnpar.sampling.service import SamplingStats, ServiceConfig
from gnnpar.cli.spec import RunSpec

from .graphs import random_graph
from .test_minibatch import cli_args
from .test_minibatch_speed_parts import _service

GRAPH = random_graph(150, 6, f=5, seed=1)
MODEL = GNN("sage", 5, 8, GRAPH.num_classes, 2, 0.0)


def _run(cfg, epochs=2, on_batch=None, on_produce=None):
    """Every minibatch of ``epochs`` epochs as (epoch, step, seeds, x, each block's CSR)."""
    service = _service(GRAPH, MODEL, cfg, batch=12)
    if on_produce is not None:
        real = service.produce

        def produce(epoch, m, *a, **k):
            on_produce(service, epoch, m)
            return real(epoch, m, *a, **k)
        service.produce = produce
    service.start(0, epochs)
    out = []
    try:
        for e in range(epochs):
            for b in service.epoch(e, SamplingStats()):
                if on_batch is not None:
                    on_batch(service, b)
                out.append((b.epoch, b.step, b.seeds.copy(), b.x.clone(),
                            [(blk.src_ids.copy(), blk.indptr.copy(), blk.indices.copy())
                             for blk in b.blocks]))
    finally:
        service.close()
    return out


def _same(a, b):
    assert len(a) == len(b)
    for (e1, s1, seeds1, x1, blocks1), (e2, s2, seeds2, x2, blocks2) in zip(a, b):
        assert (e1, s1) == (e2, s2)
        np.testing.assert_array_equal(seeds1, seeds2)
        assert torch.equal(x1, x2)
        for p, q in zip(blocks1, blocks2):
            for u, v in zip(p, q):
                np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("workers,macrobatch", [(2, 1), (2, 3), (3, 2)])
def test_bursts_give_the_inline_minibatches(workers, macrobatch):
    """Groups of W macrobatches cross the epoch's end (8 minibatches an epoch, the last
    short), and the minibatches are the inline reference's, bit for bit."""
    ref = _run(ServiceConfig(macrobatch=macrobatch, inline=True))
    got = _run(ServiceConfig(macrobatch=macrobatch, workers=workers, prefetch=workers,
                             burst=True))
    _same(got, ref)


@pytest.mark.parametrize("burst", [True, False])
def test_no_worker_starts_a_group_before_the_trainer_asks(burst):
    """A worker's task u of group g = u // W starts only after the trainer has taken every
    minibatch of the tasks before g·W. Without bursts (the control) the workers run ahead
    of a trainer that takes 20 ms a step, so the check fails there: it can fail."""
    workers, k = 2, 2
    lock, taken, early = threading.Lock(), [], []

    def on_produce(service, epoch, m):
        u = epoch * service.per_epoch + m
        with lock:
            if len(taken) < (u // workers) * workers * k and u >= workers:
                early.append(u)

    def on_batch(service, b):
        time.sleep(0.02)
        with lock:
            taken.append((b.epoch, b.step))

    # within one epoch every task but the last holds k minibatches, so the minibatches
    # before task g·W number g·W·k
    _run(ServiceConfig(macrobatch=k, workers=workers, prefetch=workers, burst=burst),
         epochs=1, on_batch=on_batch, on_produce=on_produce)
    assert (early == []) == burst, early


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread niceness: Linux")
def test_burst_workers_keep_the_trainer_priority():
    """They run only while the trainer waits, so they take its priority, not ``nice``."""
    main_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = set()

    def on_produce(service, epoch, m):
        seen.add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    _run(ServiceConfig(macrobatch=2, workers=2, prefetch=2, nice=19, burst=True), epochs=1,
         on_produce=on_produce)
    assert seen == {main_nice}


def test_bursts_refuse_a_prefetch_below_their_width():
    with pytest.raises(InputError, match="prefetch must be >= 3"):
        ServiceConfig(workers=3, prefetch=2, burst=True)


@pytest.mark.parametrize("flags, cores, expect", [
    ((), 2, (True, 2, 2)),                              # trainer threads cover the cores
    ((), 4, (False, 1, 1)),                             # a core left for a background worker
    (("--no-sample-in-bursts",), 2, (False, 1, 1)),
    (("--sample-in-bursts", "--sampler-workers", "3"), 4, (True, 3, 3)),
    (("--sampler-workers", "2", "--prefetch", "1"), 2, (True, 2, 2)),  # a group at once
])
def test_the_rule_that_picks_bursts(monkeypatch, flags, cores, expect):
    """One process on the CPU with 2 trainer threads: (burst, workers, prefetch)."""
    monkeypatch.setattr(setup, "usable_cores", lambda: cores)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        spec = RunSpec.from_args(cli_args("--fanouts", "5,5", "--batch-size", "8",
                                          "--device", "cpu", *flags))
        placement = resolve_placement("auto", "auto", torch.device("cpu"), replicated=True,
                                      grouped=False, feature_bytes=1, topo_bytes=1)
        cfg = setup._serial_cfg(spec, "cpu", placement)
    finally:
        torch.set_num_threads(threads)
    assert (cfg.burst, cfg.workers, cfg.prefetch) == expect
