"""Communication time as :class:`gnnpar.kernels.comm.Comm` counts it and the log reports it.

- a collective's time runs to its completion, not to its issue: a peer that joins late makes
  the other rank's total time at least that late, and its exposed time the part of it the
  rank spent waiting rather than computing;
- the epoch record says what was measured (``comm_timing``: ``host`` on CPU tensors, ``none``
  where nothing travelled).

The same bodies run on CUDA tensors in ``tests/test_cuda.py``, where the CUDA event timer
measures them.
"""
import time

import torch

from gnnpar.training.distributed import DistRuntime
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.algorithms import make_grid
from gnnpar.kernels.comm import Comm, control_all_reduce
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.nn.models import GNN
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn
from gnnpar.training.trainer import TrainConfig, fit

from .graphs import random_graph

LATE_S = 1.0   # how late rank 1 joins each collective
WORK_S = 0.3   # what rank 0 computes between issuing its collective and waiting for it
# bounds: measured at the enqueue, the times would be about 0; the margins allow a busy
# machine's scheduling delays


def slow_peer_body(rank, world, device="cpu"):
    """Rank 1 joins each collective ``LATE_S`` late; rank 0 issues an all-to-all, works for
    ``WORK_S`` (a sleep), then waits; then a blocking all-reduce the same way."""
    comm = Comm(ProcessGrid.create({"row": world}))
    x = torch.ones(2 * world, 3, device=device)
    out = {}
    with comm.in_phase("forward"):
        control_all_reduce(torch.zeros(1))  # leave together
        if rank == 1:
            time.sleep(LATE_S)
        pending = comm.start_all_to_all(x, [2] * world, [2] * world, "row")
        if rank == 0:
            time.sleep(WORK_S)
        pending.wait()
        out["async"] = (comm.seconds, comm.total_seconds, comm.timing)
        comm.reset()
        control_all_reduce(torch.zeros(1))
        if rank == 1:
            time.sleep(LATE_S)
        comm.all_reduce(x, "row")
        out["blocking"] = (comm.seconds, comm.total_seconds, comm.timing)
        comm.reset()
        out["after_reset"] = (comm.seconds, comm.total_seconds, comm.timing)
    return out


def check_slow_peer(out, timing):
    exposed, total, what = out["async"]
    assert what == timing
    assert total >= 0.8 * LATE_S, out  # to completion: the late peer's arrival
    assert exposed >= 0.5 * (LATE_S - WORK_S), out  # waited for the rest of it
    assert exposed <= total - 0.5 * WORK_S, out  # the work done meanwhile is not exposed
    exposed, total, what = out["blocking"]
    assert what == timing
    assert exposed >= 0.8 * LATE_S and abs(total - exposed) < 1e-6, out
    assert out["after_reset"] == (0.0, 0.0, "none")


def test_host_timer_counts_a_late_peer_to_completion():
    check_slow_peer(spawn(slow_peer_body, 2, timeout_s=120)[0], "host")


def fit_body(rank, world, device="cpu"):
    g = random_graph(n=60, f=6, classes=3, seed=4)
    shard = build_shard(g, partition_graph(g, world, "random", seed=1), rank, norms=("gcn",))
    torch.manual_seed(0)
    model = GNN("gcn", 6, 8, 3, layers=2, dropout=0.0).to(device)
    rt = DistRuntime(make_grid("1d-halo", world), shard, algorithm("1d-halo"), model.norm, device)
    return fit(model, rt, TrainConfig(epochs=2))


def check_records(records, timing):
    for rec in records:
        assert rec["comm_timing"] == timing, rec
        assert rec["comm_s"] > 0 and rec["comm_total_s"] > 0, rec


def test_the_epoch_record_says_what_was_measured():
    for records in spawn(fit_body, 2, timeout_s=120):
        check_records(records, "host")
    g = random_graph(n=30, f=6, classes=3, seed=4)
    serial = fit(GNN("gcn", 6, 8, 3, layers=2), SerialRuntime(g, "gcn"), TrainConfig(epochs=1))
    assert serial[0]["comm_timing"] == "none" and serial[0]["comm_s"] == 0.0
