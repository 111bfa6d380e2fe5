"""scripts/planetoid_npz.py on a small graph written in the Planetoid files' layout (Python
pickles of scipy matrices and a dict of neighbour lists), with a gap in the test ids as
Citeseer has: the test rows land at the ids test.index names, the gap gets zero features,
the split and the row normalisation are the papers', and gnnpar-train reads the npz."""
import os
import pickle
import sys

import numpy as np
import scipy.sparse as sp

from .cli_util import run_train

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import planetoid_npz  # noqa: E402


def write_planetoid(folder, name="toy"):
    rng = np.random.default_rng(0)
    allx = rng.random((5, 4)).astype(np.float32)
    tx = rng.random((3, 4)).astype(np.float32)
    eye = np.eye(3, dtype=np.float32)
    ally, ty = eye[[0, 1, 2, 0, 1]], eye[[2, 0, 1]]
    graph = {i: [(i + 1) % 9, (i + 3) % 9] for i in range(9)}
    parts = {"x": sp.csr_matrix(allx[:3]), "y": ally[:3], "allx": sp.csr_matrix(allx),
             "ally": ally, "tx": sp.csr_matrix(tx), "ty": ty, "graph": graph}
    for part, value in parts.items():
        with open(os.path.join(folder, f"ind.{name}.{part}"), "wb") as f:
            pickle.dump(value, f)
    with open(os.path.join(folder, f"ind.{name}.test.index"), "w") as f:
        f.write("7\n5\n8\n")  # file order; id 6 has no node in tx (a gap)
    return allx, tx, ally, ty


def test_conversion_places_the_test_rows_and_the_split(tmp_path):
    allx, tx, ally, ty = write_planetoid(str(tmp_path))
    raw = planetoid_npz.planetoid_arrays(str(tmp_path), "toy", normalize=False, val=2)
    assert raw["x"].shape == (9, 4) and raw["num_classes"] == 3
    np.testing.assert_array_equal(raw["x"][:5], allx)
    np.testing.assert_array_equal(raw["x"][[7, 5, 8]], tx)     # row i of tx is id test[i]
    assert not raw["x"][6].any()
    np.testing.assert_array_equal(raw["y"][[7, 5, 8]], ty.argmax(1))
    np.testing.assert_array_equal(raw["y"][:5], ally.argmax(1))
    assert np.flatnonzero(raw["train_mask"]).tolist() == [0, 1, 2]
    assert np.flatnonzero(raw["val_mask"]).tolist() == [3, 4]
    assert np.flatnonzero(raw["test_mask"]).tolist() == [5, 7, 8]
    assert raw["edge_index"].shape == (2, 18)
    norm = planetoid_npz.planetoid_arrays(str(tmp_path), "toy", val=2)
    np.testing.assert_allclose(norm["x"][[0, 7]].sum(1), 1.0, rtol=1e-6)
    assert not norm["x"][6].any()


def test_npz_trains_and_a_missing_file_is_named(tmp_path):
    write_planetoid(str(tmp_path))
    out = tmp_path / "toy.npz"
    np.savez(out, **planetoid_npz.planetoid_arrays(str(tmp_path), "toy", val=2))
    res = run_train("--dataset", f"npz:{out}", "--model", "gat", "--hidden", "8", "--heads", "2",
                    "--epochs", "2", "--quiet")
    assert res.returncode == 0, res.stderr[-2000:]
    os.remove(tmp_path / "ind.toy.ty")
    try:
        planetoid_npz.main([str(tmp_path), "toy", str(out)])
    except SystemExit as exc:
        assert "ind.toy.ty is missing" in str(exc)
    else:
        raise AssertionError("a missing file was not refused")
