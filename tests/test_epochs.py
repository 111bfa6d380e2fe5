"""The epoch loop every trainer shares (gnnpar/training/epochs.py): which epochs evaluate, what a
record carries between evaluations, the stop after a non-finite loss, a resumed range."""
import math

from gnnpar.training.epochs import evaluation_due, run_epochs
from gnnpar.training.trainer import TrainConfig


def _run(cfg, losses, start_epoch=0):
    """run_epochs with a train that returns ``losses[epoch]`` and an evaluation that counts
    its calls; the records and the epochs seen by on_epoch."""
    evaluated, seen = [], []

    def evaluate():
        evaluated.append(len(evaluated))
        return {"metric": float(len(evaluated))}

    def record(epoch, loss, metrics, t0):
        assert isinstance(t0, float)
        return {"epoch": epoch, "loss": loss, **metrics}

    hist = run_epochs(cfg, lambda epoch: losses[epoch], evaluate, record,
                      {"metric": math.nan}, start_epoch, lambda rec: seen.append(rec["epoch"]))
    return hist, seen


def test_evaluation_every_k_epochs_and_after_the_last():
    cfg = TrainConfig(epochs=7, eval_every=3)
    assert [e for e in range(7) if evaluation_due(e, cfg)] == [2, 5, 6]
    hist, seen = _run(cfg, [1.0] * 7)
    assert seen == list(range(7))
    # before the first evaluation the given metrics; then the latest evaluation's, repeated
    assert math.isnan(hist[0]["metric"]) and math.isnan(hist[1]["metric"])
    assert [r["metric"] for r in hist[2:]] == [1.0, 1.0, 1.0, 2.0, 3.0]


def test_stops_after_the_first_non_finite_loss_with_its_record():
    for bad in (math.nan, math.inf, -math.inf):
        hist, seen = _run(TrainConfig(epochs=6), [1.0, 0.5, bad, 0.1, 0.1, 0.1])
        assert seen == [0, 1, 2] and [r["epoch"] for r in hist] == [0, 1, 2]
        assert not math.isfinite(hist[-1]["loss"])


def test_a_resumed_range_runs_the_remaining_epochs_only():
    hist, seen = _run(TrainConfig(epochs=5, eval_every=2), [1.0] * 5, start_epoch=3)
    assert seen == [3, 4]
    # epoch 3 (the 4th) is due by the cadence, epoch 4 as the last
    assert [r["metric"] for r in hist] == [1.0, 2.0]
    assert run_epochs(TrainConfig(epochs=2), None, None, None, {}, start_epoch=2) == []
