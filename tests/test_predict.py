"""Inference with trained weights (issue 41): every algorithm's predictions and embeddings
equal the serial ``model(x)`` in the dataset's order; layer-wise inference equals the full
forward pass; the files are written whole or not at all.

Spawning dominates, so each world size is spawned once and writes every (algorithm, model)
(:func:`tests.predict_cases.predict_all`); the CLI tests (``test_predict_cli.py``) run the
installed ``gnnpar-predict``.
"""
import json
import os

import numpy as np
import pytest
import torch

import gnnpar
from gnnpar.infer import predict_files
from gnnpar.link import scoring
from gnnpar.link.decoders import DotDecoder
from gnnpar.datasets import InputError
from gnnpar.infer.inference import embeddings_layer, forward_rows, layerwise
from gnnpar.training.serial import SerialRuntime
from gnnpar.launcher.spawn import spawn

from .predict_cases import (KINDS, LAYERWISE_KINDS, cases, graph, max_error, model, predict_all,
                            reference)

TOL = 1e-5
_DONE = {}


def written(world, tmp_path_factory):
    """The output root of ``world`` ranks' predictions (spawned once per world size)."""
    if world not in _DONE:
        root = str(tmp_path_factory.mktemp(f"predict-p{world}"))
        labels = spawn(predict_all, world, args=(root,), timeout_s=400)[0]
        _DONE[world] = (root, labels)
    return _DONE[world]


PAIRS = [(w, c[0], k) for w in (2, 3, 4) for c in cases(w) for k in KINDS] + \
        [(w, "layerwise", k) for w in (2, 3, 4) for k in LAYERWISE_KINDS]


@pytest.mark.slow
@pytest.mark.parametrize("world,label,kind", PAIRS,
                         ids=[f"p{w}-{lab}-{k}" for w, lab, k in PAIRS])
def test_distributed_predictions_equal_serial(world, label, kind, tmp_path_factory):
    root, labels = written(world, tmp_path_factory)
    name = f"{label}-{kind}"
    assert name in labels
    out = os.path.join(root, name)
    meta = json.load(open(os.path.join(out, "predict.json")))
    assert meta["world_size"] == world and meta["order"] == "dataset"
    ref, emb = reference(kind)
    pred = np.load(os.path.join(out, "predictions.npy"))
    assert pred.dtype == np.float32 and pred.shape == ref.shape
    assert max_error(pred, ref) <= TOL
    got = np.load(os.path.join(out, "embeddings.npy"))
    assert got.shape == emb.shape and max_error(got, emb) <= TOL
    # the accuracy it reports is that of the serial logits
    g, _ = graph()
    right = ref.argmax(1) == g.y
    for split in ("train", "val", "test"):
        mask = getattr(g, f"{split}_mask")
        assert meta["accuracy"][split] == pytest.approx(right[mask].mean(), abs=1e-12)


@pytest.mark.parametrize("kind", LAYERWISE_KINDS)
@pytest.mark.parametrize("batch", [1, 5, 1000])
def test_layerwise_equals_forward(kind, batch):
    """Serial layer-wise inference (any chunk size) equals the model's forward pass."""
    g, _ = graph()
    m = model(kind)
    rt = SerialRuntime(g, m.norm)
    full, emb_full = forward_rows(m, rt, layer=1)
    from gnnpar.datasets.normalize import propagation_matrix
    lw, emb_lw = layerwise(m, propagation_matrix(g, m.norm), rt.x, batch, layer=1)
    assert max_error(lw.numpy(), full.numpy().astype(np.float64)) <= TOL
    assert max_error(emb_lw.numpy(), emb_full.numpy().astype(np.float64)) <= TOL


def test_library_predict_in_dataset_order(tmp_path):
    """``gnnpar.predict`` on a reordered graph gives rows in the dataset's order, the same
    as on the graph in its own order; ``gnnpar.load_model`` reads what --save-model wrote."""
    from gnnpar.infer.saved_model import model_payload, write_model_file
    from gnnpar.cli.spec import RunSpec
    g, g_reordered = graph()
    m = model("sage")
    path = str(tmp_path / "m.pt")
    write_model_file(path, model_payload(m, RunSpec.of(model="sage", hidden=8, layers=3),
                                         {"f_in": g.num_features, "f_out": g.num_classes}))
    loaded = gnnpar.load_model(path)
    ref, emb = reference("sage")
    logits, e = gnnpar.predict(loaded, g_reordered, embeddings=True)
    assert max_error(logits.numpy(), ref) <= TOL and max_error(e.numpy(), emb) <= TOL
    chunked = gnnpar.predict(loaded, g, batch_size=4)
    assert max_error(chunked.numpy(), ref) <= TOL
    import gnnpar.predict as module  # the submodule is the same callable
    assert max_error(module(loaded, g).numpy(), ref) <= TOL


def test_embeddings_layer_range():
    m = model("gcn")
    assert embeddings_layer(m, None) == 2
    assert embeddings_layer(m, 1) == 1
    for bad in (0, 3, -1):
        with pytest.raises(InputError, match="out of range.*1..2"):
            embeddings_layer(m, bad)
    with pytest.raises(InputError, match="one layer"):
        embeddings_layer(gnnpar.nn.models.GNN("gcn", 3, 4, 2, layers=1), None)
    with pytest.raises(InputError, match="no `layers`"):
        embeddings_layer(torch.nn.Linear(3, 2), None)


@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_rows_written_block_by_block_land_in_their_rows(tmp_path, monkeypatch, dtype):
    """A rank's rows, scattered over the file, written in blocks of a few file rows (the
    last block partial, some blocks holding none of the rank's rows), each row where its id
    says; rows of other ranks untouched."""
    monkeypatch.setattr(predict_files, "BLOCK_BYTES", 3 * 5 * np.dtype(dtype).itemsize)
    path = str(tmp_path / "rows.npy.partial")
    predict_files._create(path, (23, 5), dtype)
    rng = np.random.default_rng(0)
    ids = np.sort(rng.choice(23, 11, replace=False))
    order = rng.permutation(11)
    rows = np.empty((11, 5), dtype)
    rows[order] = (np.arange(55).reshape(11, 5) + 1).astype(dtype)  # row order[k] is ids[k]
    predict_files._scatter(path, ids, rows, order)
    got = np.load(path)
    want = np.zeros((23, 5), dtype)
    want[ids] = rows[order]
    assert np.array_equal(got, want)


def test_a_column_written_in_blocks_has_every_row(tmp_path, monkeypatch):
    """``write_column`` asks ``fill`` for blocks of ``BLOCK_BYTES`` (the last one partial)
    and renames the file once written."""
    monkeypatch.setattr(predict_files, "BLOCK_BYTES", 3 * 4)
    asked = []

    def fill(a, b):
        asked.append((a, b))
        return np.arange(a, b, dtype=np.float32) * 2

    entry = predict_files.write_column(str(tmp_path), "scores", 10, 0, 1, fill, lambda f: f)
    assert entry == {"scores": {"file": "scores.npy", "shape": [10], "dtype": "float32"}}
    assert asked == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert np.array_equal(np.load(tmp_path / "scores.npy"), np.arange(10) * 2.0)
    assert not (tmp_path / "scores.npy.partial").exists()


def test_pairs_scored_in_blocks_as_at_once(tmp_path, monkeypatch):
    """``score_rows`` in blocks of one and of three pairs gives the decoder's logits of all
    the pairs at once, with a bf16 embeddings file widened as float32 would be."""
    dot = DotDecoder()
    rng = np.random.default_rng(1)
    z = rng.standard_normal((9, 4)).astype(np.float32)
    pairs = rng.integers(0, 9, (2, 7))
    want = (z[pairs[0]] * z[pairs[1]]).sum(axis=1)
    np.save(tmp_path / "e.npy", z)
    bf = torch.from_numpy(z).bfloat16()
    np.save(tmp_path / "b.npy", bf.view(torch.int16).numpy().view(np.uint16))
    want_bf = (bf.float()[pairs[0]] * bf.float()[pairs[1]]).sum(1).numpy()
    for rows in (16, 48, 1 << 20):  # bytes: one pair's row, three, all
        monkeypatch.setattr(scoring, "ROWS_BYTES", rows)
        got = scoring.score_rows(dot, str(tmp_path / "e.npy"), pairs, 2, 7)
        assert np.allclose(got, want[2:7], rtol=1e-6, atol=1e-6)
        got = scoring.score_rows(dot, str(tmp_path / "b.npy"), pairs, 0, 7)
        assert np.allclose(got, want_bf, rtol=1e-6, atol=1e-6)
