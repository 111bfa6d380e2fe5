"""gnnpar-report: a PNG with every panel from a synthetic log (full-batch and mini-batch
fields), and one-line exit-2 errors for unreadable logs."""
import json
import math

import pytest

from gnnpar.cli import report


def synthetic_log(path, epochs=12, world=4, sampling=True, per_rank=False):
    recs = []
    for e in range(epochs):
        rec = {"epoch": e, "loss": 2.0 * math.exp(-e / 5), "train_acc": 0.3 + 0.05 * e,
               "val_acc": 0.25 + 0.04 * e, "test_acc": 0.25 + 0.045 * e, "epoch_s": 0.05 + 0.001 * e,
               "compute_s": 0.02, "comm_s": 0.015, "comm_bytes": 4_000_000 + 1000 * e,
               "comm_bytes_max_rank": 1_300_000, "peak_mem_bytes": 300 * 2**20,
               "algo": "2d", "world_size": world, "grid": [2, 2]}
        if sampling:
            rec.update(sampler_s=0.01, stall_s=0.005 * (e % 3))
        if per_rank:
            rec["comm_bytes_per_rank"] = [1_000_000 + 100_000 * r for r in range(world)]
        recs.append(rec)
    final = {"final": True, "algo": "2d", "world_size": world, "grid": [2, 2], "epochs": epochs,
             "loss": recs[-1]["loss"], "train_acc": 0.85, "val_acc": 0.7, "test_acc": 0.72}
    with open(path, "w") as fh:
        for r in recs[::-1][:3] + recs[:-3][::-1]:  # out of order: the report sorts
            fh.write(json.dumps(r) + "\n")
        fh.write("\n" + json.dumps(final) + "\n")
    return recs


def test_figure_has_every_panel_and_series(tmp_path):
    log = tmp_path / "run.jsonl"
    synthetic_log(log)
    epochs, final = report.read_log(str(log))
    assert [r["epoch"] for r in epochs] == list(range(12)) and final["final"]
    fig = report.build_figure(epochs, final)
    ax_loss, ax_time, ax_bytes, ax_text, ax_acc = fig.axes
    assert fig._suptitle.get_text() == "gnnpar: 2d on 4 ranks, grid 2x2"
    assert [line.get_label() for line in ax_acc.get_lines()] == ["train acc", "val acc",
                                                                 "test acc"]
    loss = ax_loss.get_lines()[0].get_ydata()
    assert loss[0] == pytest.approx(2.0) and loss[-1] == pytest.approx(2.0 * math.exp(-11 / 5))
    stacks = {c.get_label(): [b.get_height() for b in c] for c in ax_time.containers}
    assert list(stacks) == ["compute", "communication", "sampling", "input stall"]
    assert stacks["sampling"] == pytest.approx([10.0] * 12)
    assert stacks["input stall"][:3] == pytest.approx([0.0, 5.0, 10.0])
    tops = [sum(v[i] for v in stacks.values()) for i in range(12)]
    assert tops == pytest.approx([20 + 15 + 10 + 5.0 * (e % 3) for e in range(12)])
    bars = {c.get_label(): [b.get_height() for b in c] for c in ax_bytes.containers}
    assert bars["busiest rank"] == pytest.approx([1.3] * 12)
    assert bars["mean over ranks"][0] == pytest.approx(1.0)
    text = ax_text.texts[0].get_text()
    assert "communication share" in text and "0.8500" in text


def test_per_rank_bytes_and_no_sampling(tmp_path):
    log = tmp_path / "run.jsonl"
    synthetic_log(log, sampling=False, per_rank=True)
    fig = report.build_figure(*report.read_log(str(log)))
    ax_time, ax_bytes = fig.axes[1], fig.axes[2]
    assert [c.get_label() for c in ax_time.containers] == ["compute", "communication"]
    heights = [b.get_height() for b in ax_bytes.containers[0]]
    assert heights == pytest.approx([1.0, 1.1, 1.2, 1.3])


def test_cli_writes_a_nontrivial_png(tmp_path):
    import matplotlib.image as mpimg
    import numpy as np
    log, png = tmp_path / "run.jsonl", tmp_path / "out" / "r.png"
    synthetic_log(log)
    png.parent.mkdir()
    assert report.main([str(log), "-o", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 20_000 < len(data) < 400_000
    img = mpimg.imread(str(png))
    assert img.shape[0] > 500 and img.shape[1] > 800
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50  # drawn, not blank
    assert not (img[..., :3] > 0.99).all()


@pytest.mark.parametrize("content, message", [
    ("", "no epoch records"),
    ('{"epoch": 0, "loss": 1.0}\n{broken\n', ":2: not a JSON object"),
    ('[1, 2]\n', ":1: not a JSON object"),
    ('{"epoch": 0}\n', "without 'loss'"),
    ('{"final": true, "loss": 1.0}\n', "no epoch records"),
])
def test_bad_logs_exit_2_with_one_line(tmp_path, capsys, content, message):
    log = tmp_path / "bad.jsonl"
    log.write_text(content)
    assert report.main([str(log), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("gnnpar-report: error:") and err.count("\n") == 1
    assert not (tmp_path / "x.png").exists()


def test_missing_log_exits_2(tmp_path, capsys):
    assert report.main([str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
