"""Issue 24: a distributed full-batch run logs every rank's peak memory, its baseline and its
data (shard arrays as loaded, halo rows of one SpMM), and the peak / data ratios; the shard
bytes are those of the arrays :func:`load_shard` gives, computed here independently."""
import json

import numpy as np
import pytest

from gnnpar.training.logged import final_metrics
from gnnpar.training.memory import (array_bytes, gather_ints, halo_row_bytes, local_current_bytes,
                                    local_peak_bytes, merge_rank_peaks, spmm_width)
from gnnpar.partitioners.shards import load_shard

from .cli_util import run_train

WORLD = 2
DATA = "sbm:n=300,blocks=3,p_in=0.05,p_out=0.005,feat=8,seed=1"
HIDDEN, LAYERS, CLASSES, FEAT = 16, 2, 3, 8
LISTS = ("peak_mem_bytes_ranks", "baseline_mem_bytes_ranks", "shard_bytes_ranks",
         "halo_row_bytes_ranks")


def shard_nbytes(shard) -> int:
    """Every array of the shard, named one by one (not through gnnpar.training.memory)."""
    arrays = [shard.global_ids, shard.indptr, shard.indices, shard.raw_weight, shard.orig_edge,
              shard.halo_ids, shard.recv_counts, shard.send_counts, shard.send_local, shard.x,
              shard.y, shard.train_mask, shard.val_mask, shard.test_mask,
              *shard.values.values()]
    return sum(int(np.asarray(a).nbytes) for a in arrays)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rank_memory")
    log, shards = tmp / "log.jsonl", tmp / "shards"
    res = run_train("--dataset", DATA, "--algo", "1d-halo", "--nprocs", str(WORLD),
                    "--partition-dir", str(shards), "--partitioner", "random", "--epochs", "2",
                    "--hidden", str(HIDDEN), "--layers", str(LAYERS), "--quiet",
                    "--log-json", str(log), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    return recs, shards


def test_every_rank_is_logged(run):
    recs, _ = run
    epochs, final = recs[:-1], recs[-1]
    assert final["final"] and len(epochs) == 2
    for rec in recs:
        for key in LISTS:
            assert len(rec[key]) == WORLD and all(isinstance(v, int) and v > 0
                                                  for v in rec[key]), (key, rec[key])
        assert rec["peak_mem_bytes"] == max(rec["peak_mem_bytes_ranks"])
        data = [s + h for s, h in zip(rec["shard_bytes_ranks"], rec["halo_row_bytes_ranks"])]
        peaks, base = rec["peak_mem_bytes_ranks"], rec["baseline_mem_bytes_ranks"]
        assert rec["peak_over_data_max"] == pytest.approx(max(p / d for p, d in zip(peaks, data)))
        assert rec["peak_net_over_data_max"] == pytest.approx(
            max((p - b) / d for p, b, d in zip(peaks, base, data)))
        assert all(p >= b for p, b in zip(peaks, base))  # the peak covers the baseline
    assert final["peak_mem_bytes_ranks"] == [max(col) for col in
                                             zip(*(r["peak_mem_bytes_ranks"] for r in epochs))]


def test_data_bytes_are_the_shards(run):
    recs, shards = run
    width = min(FEAT, HIDDEN)  # the widest SpMM: layer 1 at min(8, 16); layer 2 at 3
    for rank in range(WORLD):
        shard = load_shard(str(shards), rank, world_size=WORLD)
        for rec in recs:
            assert rec["shard_bytes_ranks"][rank] == shard_nbytes(shard)
            assert rec["halo_row_bytes_ranks"][rank] == shard.n_halo * width * 4
        assert array_bytes(shard) == shard_nbytes(shard)


def test_helpers():
    assert spmm_width([100, 16, 16, 3]) == 16 and spmm_width([8, 16, 3]) == 8
    assert halo_row_bytes(10, [8, 16, 3], "bf16") == 10 * 8 * 2
    assert local_peak_bytes() >= local_current_bytes() > 0
    rows = gather_ints([5, 6], 1, 3, lambda t: t)  # one rank's view before the sum
    assert rows == [[0, 0], [5, 6], [0, 0]]
    recs = [{"peak_mem_bytes_ranks": [3, 9], "baseline_mem_bytes_ranks": [1, 1],
             "shard_bytes_ranks": [2, 4], "halo_row_bytes_ranks": [0, 4]},
            {"peak_mem_bytes_ranks": [5, 7], "baseline_mem_bytes_ranks": [1, 1],
             "shard_bytes_ranks": [2, 4], "halo_row_bytes_ranks": [0, 4]}]
    merged = merge_rank_peaks(recs)
    assert merged["peak_mem_bytes_ranks"] == [5, 9]
    assert merged["peak_over_data_max"] == pytest.approx(2.5)
    assert merged["peak_net_over_data_max"] == pytest.approx(2.0)
    # a resumed run's totals carry the lists: the whole run's peaks per rank
    base = {"epoch": 0, "loss": 1.0, "train_acc": 0, "val_acc": 0, "test_acc": 0,
            "epoch_s": 1.0, "comm_bytes": 0, "peak_mem_bytes": 9}
    first = final_metrics([{**base, **recs[0]}])
    total = final_metrics([{**base, **recs[1], "peak_mem_bytes": 7}], first)
    assert total["peak_mem_bytes_ranks"] == [5, 9] and total["peak_mem_bytes"] == 9


def test_minibatch_logs_every_ranks_peak(tmp_path):
    log = tmp_path / "log.jsonl"
    res = run_train("--dataset", DATA, "--mode", "minibatch", "--fanouts", "5,5",
                    "--batch-size", "32", "--nprocs", str(WORLD), "--epochs", "1", "--quiet",
                    "--log-json", str(log), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    for rec in (json.loads(line) for line in log.read_text().splitlines()):
        peaks, base = rec["peak_mem_bytes_ranks"], rec["baseline_mem_bytes_ranks"]
        assert len(peaks) == len(base) == WORLD and min(base) > 0
        assert rec["peak_mem_bytes"] == max(peaks) and all(p >= b for p, b in zip(peaks, base))
        assert "shard_bytes_ranks" not in rec  # no data bytes defined for mini batch
