"""Dataset layer: generators, readers, cache, spec strings, PyG/DGL interop, bad-input messages."""
import gzip
import json
import os
import sys
import types

import numpy as np
import pytest

from gnnpar.datasets import (DEFAULT_SPEC, InputError, from_dgl, from_pyg, load_cache, load_dataset,
                             parse_spec, read_npz, read_ogb, rmat, save_cache, sbm, to_pyg)


# ---------------------------------------------------------------- helpers
def edge_pairs(g):
    src, dst = g.edges()
    return set(zip(src.tolist(), dst.tolist()))


def assert_clean_csr(g):
    """Strictly increasing columns in every row: sorted, no duplicates."""
    for r in range(g.num_nodes):
        assert np.all(np.diff(g.indices[g.indptr[r]:g.indptr[r + 1]]) > 0)


def npz_arrays(n=6):
    """A directed 6-node graph: a path 0->1->...->5 plus 5->0, two classes."""
    rng = np.random.default_rng(0)
    return dict(edge_index=np.array([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]], np.int64),
                x=rng.standard_normal((n, 3)).astype(np.float32),
                y=np.array([0, 1, 0, 1, 0, 1], np.int64),
                train_mask=np.array([1, 1, 1, 0, 0, 0], bool),
                val_mask=np.array([0, 0, 0, 1, 0, 0], bool),
                test_mask=np.array([0, 0, 0, 0, 1, 1], bool))


def write_npz(path, **change):
    arrays = npz_arrays()
    for k, v in change.items():
        if v is None:
            del arrays[k]
        else:
            arrays[k] = v
    np.savez(path, **arrays)
    return str(path)


def write_gz(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(f"{line}\n" for line in lines))


OGB_X = [[0.5, 1.0], [1.5, -2.0], [0.0, 0.25], [3.0, 1e-3], [-1.0, 2.0]]


def write_ogb(root, split="time", labels=("1", "0", "nan", "2", "1"), edges=("0,1", "1,2", "3,4", "4,0")):
    """A 5-node OGB-style folder; node 2 is unlabelled (NaN) and is listed in train.csv.gz."""
    write_gz(f"{root}/raw/edge.csv.gz", edges)
    write_gz(f"{root}/raw/node-feat.csv.gz", [",".join(map(str, r)) for r in OGB_X])
    write_gz(f"{root}/raw/node-label.csv.gz", labels)
    write_gz(f"{root}/raw/num-node-list.csv.gz", ["5"])
    write_gz(f"{root}/split/{split}/train.csv.gz", ["0", "1", "2"])
    write_gz(f"{root}/split/{split}/valid.csv.gz", ["3"])
    write_gz(f"{root}/split/{split}/test.csv.gz", ["4"])
    return str(root)


# ---------------------------------------------------------------- R-MAT
def test_rmat_shape_and_invariants():
    g = rmat(9, 8, feat=5, classes=4, seed=3)
    assert g.num_nodes == 512 and g.num_features == 5 and g.num_classes == 4
    assert g.x.dtype == np.float32 and g.y.dtype == np.int64
    assert g.is_symmetric()
    src, dst = g.edges()
    assert not np.any(src == dst)
    assert_clean_csr(g)
    assert 0 < g.num_edges <= 2 * 8 * 512
    assert set(np.unique(g.y)) <= set(range(4))
    assert np.all(g.train_mask.astype(int) + g.val_mask + g.test_mask == 1)
    assert abs(g.train_mask.sum() - 0.6 * 512) <= 1
    g.validate()


def test_rmat_is_skewed():
    deg = rmat(12, 8, feat=1).degrees()
    assert deg.max() > 15 * deg.mean()  # power law: hubs far above the mean
    assert np.median(deg) < deg.mean()


def test_rmat_deterministic_per_seed():
    a, b, c = rmat(8, 4, seed=5), rmat(8, 4, seed=5), rmat(8, 4, seed=6)
    assert a.fingerprint() == b.fingerprint()
    assert c.fingerprint() != a.fingerprint()
    # streams are independent: feature width does not move the edges or labels
    d = rmat(8, 4, seed=5, feat=7)
    assert np.array_equal(d.indices, a.indices) and np.array_equal(d.y, a.y)


def test_rmat_directed_symmetrizes_to_undirected():
    d, u = rmat(8, 4, seed=1, directed=True), rmat(8, 4, seed=1)
    assert not d.is_symmetric()
    assert_clean_csr(d)
    assert d.symmetrize().fingerprint() == u.fingerprint()


def test_rmat_unpermuted_concentrates_degree_at_low_ids():
    g = rmat(10, 8, feat=1, permute=False)
    assert int(np.argmax(g.degrees())) == 0  # a > b, c > d: vertex 0 is the hub


# ---------------------------------------------------------------- SBM
def test_sbm_planted_blocks_and_edge_counts():
    n, blocks, p_in, p_out = 1200, 4, 0.05, 0.004
    g = sbm(n, blocks, p_in, p_out, feat=6, seed=2)
    assert g.is_symmetric() and g.num_classes == blocks
    assert_clean_csr(g)
    assert np.bincount(g.y).tolist() == [300] * 4
    assert not np.array_equal(g.y, np.sort(g.y))  # membership is shuffled
    src, dst = g.edges()
    assert not np.any(src == dst)
    same = g.y[src] == g.y[dst]
    within, across = same.sum() // 2, (~same).sum() // 2
    exp_in, exp_out = 4 * 300 * 299 / 2 * p_in, 6 * 300 * 300 * p_out
    assert abs(within - exp_in) < 5 * np.sqrt(exp_in)
    assert abs(across - exp_out) < 5 * np.sqrt(exp_out)


def test_sbm_directed_and_determinism():
    a, b = sbm(300, 3, 0.1, 0.01, seed=4), sbm(300, 3, 0.1, 0.01, seed=4)
    assert a.fingerprint() == b.fingerprint()
    assert sbm(300, 3, 0.1, 0.01, seed=5).fingerprint() != a.fingerprint()
    d = sbm(300, 3, 0.1, 0.01, seed=4, directed=True)
    assert not d.is_symmetric()
    assert_clean_csr(d)
    src, dst = d.edges()
    assert not np.any(src == dst)
    assert 0.6 * a.num_edges < d.num_edges < 1.4 * a.num_edges  # each ordered pair drawn once


def _centroid_accuracy(feats, g):
    means = np.stack([feats[g.train_mask & (g.y == k)].mean(0) for k in range(g.num_classes)])
    pred = np.argmin(((feats[g.test_mask, None, :] - means[None]) ** 2).sum(-1), axis=1)
    return float(np.mean(pred == g.y[g.test_mask]))


def test_default_spec_features_weak_graph_strong():
    """A nearest-centroid classifier on raw features is weak; on neighbour-averaged ones it is good.

    That gap is what a GCN exploits (a 2-layer GCN reaches ~97% on this graph)."""
    g = load_dataset(DEFAULT_SPEC)
    A = g.add_self_loops().to_scipy()
    avg = A @ (A @ g.x / A.sum(1).A) / A.sum(1).A
    raw_acc, graph_acc = _centroid_accuracy(g.x, g), _centroid_accuracy(np.asarray(avg), g)
    assert raw_acc < 0.5 and graph_acc > 0.9


# ---------------------------------------------------------------- npz
def test_npz_round_trip_undirected_and_directed(tmp_path):
    path = write_npz(tmp_path / "g.npz")
    g = read_npz(path)
    ring = {(i, (i + 1) % 6) for i in range(6)}
    assert edge_pairs(g) == ring | {(d, s) for s, d in ring}
    assert g.num_classes == 2 and g.name == "g" and g.meta["directed"] is False
    np.testing.assert_array_equal(g.x, npz_arrays()["x"])
    d = read_npz(path, directed=True)
    assert edge_pairs(d) == ring and not d.is_symmetric()
    assert load_dataset(f"npz:{path}", directed=True).fingerprint() == d.fingerprint()


def test_npz_optional_weight_num_classes_and_01_masks(tmp_path):
    path = write_npz(tmp_path / "w.npz", edge_weight=np.arange(1, 7, dtype=np.float32),
                     num_classes=np.array(5), train_mask=np.array([1, 1, 1, 0, 0, 0], np.uint8))
    g = read_npz(path, directed=True)
    assert g.num_classes == 5 and g.train_mask.dtype == bool
    src, dst = g.edges()
    weights = {(int(s), int(t)): float(w) for s, t, w in zip(src, dst, g.edge_weight)}
    assert weights[(0, 1)] == 1.0 and weights[(5, 0)] == 6.0
    u = read_npz(path)
    assert u.is_symmetric() and u.num_edges == 12


def test_npz_from_pyg_convention_ogb_like_labels(tmp_path):
    path = write_npz(tmp_path / "y2.npz", y=np.array([[0], [1], [0], [1], [0], [1]]))
    assert read_npz(path).y.tolist() == [0, 1, 0, 1, 0, 1]


BAD_NPZ = [
    ("missing_key", dict(x=None), "missing key 'x'"),
    ("edge_shape", dict(edge_index=np.zeros((3, 4), np.int64)), r"edge_index must have shape \(2, E\)"),
    ("edge_dtype", dict(edge_index=np.zeros((2, 4), np.float32)), "edge_index must be an integer array"),
    ("id_too_big", dict(edge_index=np.array([[0, 6], [1, 1]])), r"endpoint 6 is out of range \[0, 6\)"),
    ("id_negative", dict(edge_index=np.array([[0, -2], [1, 1]])), "endpoint -2 is out of range"),
    ("x_dtype", dict(x=np.zeros((6, 3), np.int32)), "x must be a float array"),
    ("x_shape", dict(x=np.zeros(6, np.float32)), r"x must have shape \(N, F\)"),
    ("x_nan", dict(x=np.where(np.eye(6, 3) > 0, np.nan, 0).astype(np.float32)), "x contains NaN or inf"),
    ("x_inf", dict(x=np.full((6, 3), np.inf, np.float32)), "x contains NaN or inf in 6 row"),
    ("y_shape", dict(y=np.zeros(5, np.int64)), r"y must have shape \(N=6,\)"),
    ("y_dtype", dict(y=np.zeros(6, np.float32)), "y must be an integer array"),
    ("y_negative", dict(y=np.array([0, 1, -1, 1, 0, 1])), r"label -1 is outside \[0, num_classes=2\)"),
    ("y_too_big", dict(num_classes=np.array(2), y=np.array([0, 1, 3, 1, 0, 1])), "label 3 is outside"),
    ("num_classes", dict(num_classes=np.array([2, 3])), "num_classes must be a scalar integer"),
    ("empty_mask", dict(val_mask=np.zeros(6, bool)), "val_mask selects no node"),
    ("mask_values", dict(test_mask=np.array([0, 2, 0, 0, 1, 1])), "test_mask must be boolean"),
    ("mask_shape", dict(train_mask=np.ones(4, bool)), r"train_mask must have shape \(6,\)"),
    ("weight_shape", dict(edge_weight=np.ones(2, np.float32)), r"edge_weight must be a float array of shape \(6,\)"),
]


@pytest.mark.parametrize("case,change,msg", BAD_NPZ, ids=[c[0] for c in BAD_NPZ])
def test_npz_bad_input(tmp_path, case, change, msg):
    path = write_npz(tmp_path / f"{case}.npz", **change)
    with pytest.raises(InputError, match=msg) as err:
        read_npz(path)
    assert path in str(err.value) and "\n" not in str(err.value)


def test_npz_missing_and_corrupt_file(tmp_path):
    with pytest.raises(InputError, match="npz file not found"):
        read_npz(str(tmp_path / "nope.npz"))
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"this is not a zip file")
    with pytest.raises(InputError, match="cannot read .*bad.npz as .npz"):
        read_npz(str(bad))


def test_npz_object_arrays_are_refused(tmp_path):
    path = write_npz(tmp_path / "obj.npz", y=np.array([0, 1, 0, 1, 0, "a"], dtype=object))
    with pytest.raises(InputError, match="cannot read .*obj.npz"):
        read_npz(path)


# ---------------------------------------------------------------- OGB
def test_ogb_folder(tmp_path):
    root = write_ogb(tmp_path / "ogbn_fake")
    g = read_ogb(root)
    np.testing.assert_array_equal(g.x, np.array(OGB_X, np.float32))
    assert g.y.tolist() == [1, 0, 0, 2, 1] and g.num_classes == 3
    assert g.train_mask.tolist() == [True, True, False, False, False]  # node 2 unlabelled: dropped
    assert g.val_mask.tolist() == [False, False, False, True, False]
    assert g.test_mask.tolist() == [False, False, False, False, True]
    assert g.meta["unlabelled"] == 1 and g.meta["split"] == "time" and g.name == "ogbn_fake"
    directed = {(0, 1), (1, 2), (3, 4), (4, 0)}
    assert edge_pairs(g) == directed | {(d, s) for s, d in directed}
    d = read_ogb(root, directed=True)
    assert edge_pairs(d) == directed
    assert load_dataset(f"ogb:{root}").fingerprint() == g.fingerprint()


def test_ogb_binary_layout(tmp_path):
    root = write_ogb(tmp_path / "papers")
    for f in ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz", "num-node-list.csv.gz"):
        os.remove(f"{root}/raw/{f}")
    np.savez(f"{root}/raw/data.npz", edge_index=np.array([[0, 1, 3, 4], [1, 2, 4, 0]]),
             node_feat=np.array(OGB_X, np.float32), num_nodes_list=np.array([5]))
    np.savez(f"{root}/raw/node-label.npz", node_label=np.array([[1], [0], [np.nan], [2], [1]], np.float32))
    g = read_ogb(root, directed=True)
    assert edge_pairs(g) == {(0, 1), (1, 2), (3, 4), (4, 0)}
    assert g.y.tolist() == [1, 0, 0, 2, 1] and g.meta["unlabelled"] == 1
    assert g.train_mask.tolist() == [True, True, False, False, False]


def test_ogb_several_splits_need_a_choice(tmp_path):
    root = write_ogb(tmp_path / "multi", split="time")
    write_ogb(tmp_path / "multi", split="random")
    with pytest.raises(InputError, match=r"several splits .*\(random, time\): choose one with split=NAME"):
        read_ogb(root)
    assert load_dataset(f"ogb:{root},split=random").meta["split"] == "random"
    with pytest.raises(InputError, match="split 'nope' not found .*found: random, time"):
        read_ogb(root, split="nope")


def _break(root, what):
    if what == "no_dir":
        return str(root) + "_missing"
    if what == "no_split":
        import shutil
        shutil.rmtree(f"{root}/split")
    elif what == "no_labels":
        os.remove(f"{root}/raw/node-label.csv.gz")
    elif what == "no_valid":
        os.remove(f"{root}/split/time/valid.csv.gz")
    elif what == "bad_number":
        write_gz(f"{root}/raw/node-feat.csv.gz", ["1,2", "3,4", "5,x", "7,8", "9,0"])
    elif what == "ragged":
        write_gz(f"{root}/raw/edge.csv.gz", ["0,1", "1,2,3", "3,4"])
    elif what == "edge_out_of_range":
        write_gz(f"{root}/raw/edge.csv.gz", ["0,1", "1,9"])
    elif what == "split_out_of_range":
        write_gz(f"{root}/split/time/test.csv.gz", ["4", "5"])
    elif what == "count_mismatch":
        write_gz(f"{root}/raw/num-node-list.csv.gz", ["7"])
    elif what == "label_rows":
        write_gz(f"{root}/raw/node-label.csv.gz", ["1", "0", "2"])
    elif what == "multilabel":
        write_gz(f"{root}/raw/node-label.csv.gz", ["1,0"] * 5)
    elif what == "fractional_label":
        write_gz(f"{root}/raw/node-label.csv.gz", ["1", "0.5", "1", "0", "1"])
    elif what == "nan_feature":
        write_gz(f"{root}/raw/node-feat.csv.gz", ["1,2", "3,nan", "5,6", "7,8", "9,0"])
    elif what == "empty_valid":
        write_gz(f"{root}/split/time/valid.csv.gz", ["2"])  # only the unlabelled node
    elif what == "not_gzip":
        with open(f"{root}/raw/edge.csv.gz", "wb") as f:
            f.write(b"0,1\n")
    return str(root)


BAD_OGB = [
    ("no_dir", "OGB dataset folder not found"),
    ("no_split", "no split folder under"),
    ("no_labels", "has no node-label.csv.gz"),
    ("no_valid", "has no valid.csv.gz"),
    ("bad_number", "node-feat.csv.gz line 3: expected 2 comma-separated float32 value\\(s\\), got '5,x'"),
    ("ragged", "edge.csv.gz line 2: expected 2 comma-separated int64 value\\(s\\), got '1,2,3'"),
    ("edge_out_of_range", r"edge endpoint 9 is out of range \[0, 5\)"),
    ("split_out_of_range", r"test.csv.gz: node id 5 is out of range \[0, 5\)"),
    ("count_mismatch", "says 7 nodes but the features have 5 rows"),
    ("label_rows", "has 3 labels but the features have 5 rows"),
    ("multilabel", "2 columns: multi-label tasks are not supported"),
    ("fractional_label", "holds a label that is neither an integer nor NaN"),
    ("nan_feature", "x contains NaN or inf in 1 row\\(s\\), first at node 1"),
    ("empty_valid", "val_mask selects no node"),
    ("not_gzip", "cannot decompress .*edge.csv.gz"),
]


@pytest.mark.parametrize("what,msg", BAD_OGB, ids=[c[0] for c in BAD_OGB])
def test_ogb_bad_input(tmp_path, what, msg):
    root = _break(write_ogb(tmp_path / "ogb"), what)
    with pytest.raises(InputError, match=msg) as err:
        read_ogb(root)
    assert "\n" not in str(err.value)


def test_read_csv_gz_spans_blocks(tmp_path):
    from gnnpar.datasets.readers import read_csv_gz
    rows = np.arange(3000).reshape(1000, 3)
    write_gz(str(tmp_path / "t.csv.gz"), [",".join(map(str, r)) for r in rows])
    # a 64-byte block cuts lines mid-way: the carried tail must be stitched back
    np.testing.assert_array_equal(read_csv_gz(str(tmp_path / "t.csv.gz"), np.int64, block=64), rows)
    with gzip.open(tmp_path / "crlf.csv.gz", "wb") as f:
        f.write(b"1.5,2\r\n3,-4e-1")  # Windows line ends, no final newline
    np.testing.assert_array_equal(read_csv_gz(str(tmp_path / "crlf.csv.gz"), np.float64), [[1.5, 2], [3, -0.4]])
    with gzip.open(tmp_path / "empty.csv.gz", "wb"):
        pass
    assert read_csv_gz(str(tmp_path / "empty.csv.gz"), np.int64).size == 0


# ---------------------------------------------------------------- cache
def test_cache_round_trip_is_memory_mapped(tmp_path):
    g = sbm(200, 4, 0.1, 0.01, feat=3, seed=1)
    folder = save_cache(g, str(tmp_path / "c"))
    assert sorted(os.listdir(tmp_path)) == ["c"]  # the temporary folder is gone
    h = load_cache(folder)
    for name in ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask"):
        arr = getattr(h, name)
        assert isinstance(arr, np.memmap) and not arr.flags.writeable
        np.testing.assert_array_equal(arr, getattr(g, name))
    assert h.edge_weight is None and h.num_classes == g.num_classes and h.name == g.name
    assert h.fingerprint() == g.fingerprint()
    assert load_cache(folder, verify=True).fingerprint() == g.fingerprint()
    mem = load_cache(folder, mmap=False)
    assert not isinstance(mem.x, np.memmap) and mem.fingerprint() == g.fingerprint()
    assert load_dataset(f"cache:{folder}").fingerprint() == g.fingerprint()


def test_cache_keeps_edge_weight_and_replaces_old_cache(tmp_path):
    g = read_npz(write_npz(tmp_path / "w.npz", edge_weight=np.arange(1, 7, dtype=np.float32)))
    folder = str(tmp_path / "c")
    save_cache(sbm(50, 2, 0.2, 0.05, seed=0), folder)
    save_cache(g, folder)
    h = load_cache(folder)
    np.testing.assert_array_equal(h.edge_weight, g.edge_weight)
    assert h.fingerprint() == g.fingerprint()
    assert sorted(os.listdir(tmp_path)) == ["c", "w.npz"]


def _corrupt(folder, how):
    meta_path = os.path.join(folder, "meta.json")
    if how == "missing":
        return folder + "_nope"
    if how == "no_meta":
        os.remove(meta_path)
    elif how == "bad_json":
        with open(meta_path, "w") as f:
            f.write("{not json")
    elif how == "wrong_format":
        with open(meta_path, "w") as f:
            json.dump({"format": "something-else", "version": 1}, f)
    elif how in ("wrong_version", "missing_array_entry"):
        with open(meta_path) as f:
            meta = json.load(f)
        if how == "wrong_version":
            meta["version"] = 999
        else:
            del meta["arrays"]["y"]
        with open(meta_path, "w") as f:
            json.dump(meta, f)
    elif how == "no_npy":
        os.remove(os.path.join(folder, "x.npy"))
    elif how == "truncated":
        path = os.path.join(folder, "indices.npy")
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size - 40)
    elif how == "wrong_shape":
        np.save(os.path.join(folder, "y.npy"), np.zeros(7, np.int64))
    return folder


BAD_CACHE = [
    ("missing", "cache folder not found"),
    ("no_meta", "is not a gnnpar cache \\(no meta.json\\)"),
    ("bad_json", "corrupt cache .*meta.json unreadable"),
    ("wrong_format", "is not a gnnpar cache \\(meta.json has no format"),
    ("wrong_version", "format version 999; this gnnpar reads version 1"),
    ("missing_array_entry", "meta.json lists no array 'y'"),
    ("no_npy", "x.npy is missing"),
    ("truncated", "corrupt cache .*indices.npy"),
    ("wrong_shape", r"y.npy is <i8 \[7\], meta.json says <i8 \[50\]"),
]


@pytest.mark.parametrize("how,msg", BAD_CACHE, ids=[c[0] for c in BAD_CACHE])
def test_cache_refuses_bad_folders(tmp_path, how, msg):
    folder = _corrupt(save_cache(sbm(50, 2, 0.2, 0.05, seed=0), str(tmp_path / "c")), how)
    with pytest.raises(InputError, match=msg):
        load_cache(folder)


def test_cache_verify_detects_changed_content(tmp_path):
    folder = save_cache(sbm(50, 2, 0.2, 0.05, seed=0), str(tmp_path / "c"))
    y = np.load(os.path.join(folder, "y.npy"))
    np.save(os.path.join(folder, "y.npy"), 1 - y)
    load_cache(folder)  # shapes and dtypes still agree
    with pytest.raises(InputError, match="fingerprint differs"):
        load_cache(folder, verify=True)


def test_save_cache_refuses_foreign_folder(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="refusing to overwrite"):
        save_cache(sbm(50, 2, 0.2, 0.05), str(tmp_path / "home"))
    assert (tmp_path / "home" / "notes.txt").read_text() == "keep me"


def test_load_dataset_uses_cache_dir(tmp_path):
    spec = "rmat:scale=7,ef=4,feat=3"
    first = load_dataset(spec, cache_dir=str(tmp_path))
    assert first.meta["from_cache"] is False and len(os.listdir(tmp_path)) == 1
    second = load_dataset("rmat:ef=4,feat=3,scale=7", cache_dir=str(tmp_path))  # same params, other order
    assert second.meta["from_cache"] is True and isinstance(second.x, np.memmap)
    assert second.fingerprint() == first.fingerprint()
    directed = load_dataset(spec, directed=True, cache_dir=str(tmp_path))
    assert directed.meta["from_cache"] is False and not directed.is_symmetric()
    assert len(os.listdir(tmp_path)) == 2


def test_load_dataset_cache_follows_file_changes(tmp_path):
    path = write_npz(tmp_path / "g.npz")
    cache = str(tmp_path / "cache")
    a = load_dataset(f"npz:{path}", cache_dir=cache)
    assert load_dataset(f"npz:{path}", cache_dir=cache).meta["from_cache"] is True
    write_npz(tmp_path / "g.npz", y=np.array([1, 1, 0, 0, 1, 1]))
    os.utime(path, ns=(1, 1))  # make sure the stamp moves even on coarse clocks
    b = load_dataset(f"npz:{path}", cache_dir=cache)
    assert b.meta["from_cache"] is False and b.y.tolist() == [1, 1, 0, 0, 1, 1]
    assert a.fingerprint() != b.fingerprint()


def test_load_dataset_rebuilds_corrupt_cache_entry(tmp_path):
    spec = "sbm:n=60,blocks=3,p_in=0.3,p_out=0.02"
    g = load_dataset(spec, cache_dir=str(tmp_path))
    (entry,) = os.listdir(tmp_path)
    os.remove(tmp_path / entry / "x.npy")
    with pytest.warns(RuntimeWarning, match="rebuilding dataset cache: .*x.npy is missing"):
        h = load_dataset(spec, cache_dir=str(tmp_path))
    assert h.fingerprint() == g.fingerprint() and h.meta["from_cache"] is False
    assert load_dataset(spec, cache_dir=str(tmp_path)).meta["from_cache"] is True


# ---------------------------------------------------------------- spec strings
def test_parse_spec_types_and_defaults():
    kind, p = parse_spec("rmat:scale=10,ef=8,a=0.5,permute=false")
    assert kind == "rmat"
    assert p == dict(scale=10, ef=8, feat=128, classes=16, seed=0, a=0.5, b=0.19, c=0.19, permute=False)
    kind, p = parse_spec(DEFAULT_SPEC)
    assert kind == "sbm" and isinstance(p["n"], int) and isinstance(p["p_in"], float)
    assert parse_spec("npz:/data/a,b=c.npz") == ("npz", {"path": "/data/a,b=c.npz"})
    assert parse_spec("ogb:/d/ogbn_arxiv") == ("ogb", {"dir": "/d/ogbn_arxiv", "split": None})
    assert parse_spec("ogb:/d/x,split=time") == ("ogb", {"dir": "/d/x", "split": "time"})
    assert parse_spec("cache:/c") == ("cache", {"dir": "/c"})


BAD_SPECS = [
    ("rmat:scale=10,ef=8,bogus=1",
     "unknown key 'bogus' in rmat spec \\(allowed: scale, ef, feat, classes, seed, a, b, c, permute\\)"),
    ("sbm:n=100,blocks=4,p_in=0.1,p_out=0.01,depth=2", "unknown key 'depth' in sbm spec \\(allowed: n, blocks, p_in"),
    ("rmat:scale=ten,ef=8", "rmat key 'scale' must be an integer in \\[2, 31\\], got 'ten'"),
    ("rmat:scale=10,ef=-4", "rmat key 'ef' must be an integer >= 1, got '-4'"),
    ("sbm:n=-5,blocks=2,p_in=0.1,p_out=0.1", "sbm key 'n' must be an integer >= 3, got '-5'"),
    ("sbm:n=100,blocks=4,p_in=1.5,p_out=0.01", "sbm key 'p_in' must be a number in \\[0, 1\\], got '1.5'"),
    ("sbm:n=100,blocks=4,p_in=nan,p_out=0.01", "sbm key 'p_in' must be a number in"),
    ("sbm:n=100,blocks=4,p_in=0.1,p_out=0.01,noise=-1", "sbm key 'noise' must be a number >= 0"),
    ("rmat:scale=10,ef=8,permute=maybe", "rmat key 'permute' must be true or false"),
    ("rmat:ef=8", "rmat spec needs key 'scale' \\(required: scale, ef; allowed:"),
    ("rmat:scale=10,ef=8,ef=9", "rmat key 'ef' is given twice"),
    ("rmat:scale=10,ef", "rmat key 'ef' needs a value"),
    ("graphml:foo", "unknown dataset kind 'graphml' \\(allowed: rmat, sbm, npz, ogb, cache\\)"),
    ("rmat", "dataset spec must look like KIND:ARGS"),
    ("npz:", "npz spec needs a path"),
    ("ogb:/d,split=", "ogb key 'split' must name one folder"),
]


@pytest.mark.parametrize("spec,msg", BAD_SPECS, ids=[s for s, _ in BAD_SPECS])
def test_parse_spec_errors(spec, msg):
    with pytest.raises(InputError, match=msg):
        parse_spec(spec)


@pytest.mark.parametrize("spec,msg", [
    ("sbm:n=10,blocks=20,p_in=0.1,p_out=0.1", "sbm blocks must be an integer in \\[1, n=10\\]"),
    ("rmat:scale=5,ef=2,a=0.6,b=0.3,c=0.3", "rmat needs a \\+ b \\+ c <= 1"),
])
def test_generator_cross_key_errors(spec, msg):
    with pytest.raises(InputError, match=msg):
        load_dataset(spec)


def test_every_kind_loads_validated(tmp_path):
    g = load_dataset("rmat:scale=6,ef=4,feat=2,classes=3")
    assert g.num_nodes == 64 and g.meta["spec"] == "rmat:scale=6,ef=4,feat=2,classes=3"
    s = load_dataset("sbm:n=90,blocks=3,p_in=0.2,p_out=0.01,feat=4,noise=0.5,seed=3")
    assert s.num_nodes == 90 and s.num_features == 4 and s.num_classes == 3
    assert load_dataset(f"npz:{write_npz(tmp_path / 'g.npz')}").num_nodes == 6
    assert load_dataset(f"ogb:{write_ogb(tmp_path / 'o')}").num_nodes == 5
    assert load_dataset(f"cache:{save_cache(s, str(tmp_path / 'c'))}").fingerprint() == s.fingerprint()


def test_load_dataset_missing_paths():
    with pytest.raises(InputError, match="npz file not found: /no/such.npz"):
        load_dataset("npz:/no/such.npz")
    with pytest.raises(InputError, match="OGB dataset folder not found: /no/such"):
        load_dataset("ogb:/no/such")


# ---------------------------------------------------------------- interop
def test_pyg_round_trip_exact():
    g = sbm(120, 3, 0.2, 0.02, feat=4, seed=0)
    d = to_pyg(g)
    assert tuple(d.edge_index.shape) == (2, g.num_edges) and d.num_nodes == 120
    back = from_pyg(d)
    assert back.fingerprint() == g.fingerprint()
    assert back.num_classes == g.num_classes and back.name == g.name
    for name in ("indptr", "indices", "x", "y", "train_mask"):
        a, b = getattr(back, name), getattr(g, name)
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_pyg_round_trip_weighted_directed_and_memmapped(tmp_path):
    g = read_npz(write_npz(tmp_path / "w.npz", edge_weight=np.arange(1, 7, dtype=np.float32)), directed=True)
    back = from_pyg(to_pyg(load_cache(save_cache(g, str(tmp_path / "c")))))
    assert back.fingerprint() == g.fingerprint() and not back.is_symmetric()


def test_from_pyg_plain_data_and_symmetrize():
    import torch
    from torch_geometric.data import Data
    d = Data(edge_index=torch.tensor([[0, 1], [1, 2]]), x=torch.zeros(3, 2), y=torch.tensor([[0], [1], [2]]),
             train_mask=torch.tensor([True, False, False]), val_mask=torch.tensor([False, True, False]),
             test_mask=torch.tensor([False, False, True]))
    g = from_pyg(d)
    assert g.num_classes == 3 and edge_pairs(g) == {(0, 1), (1, 2)}
    assert from_pyg(d, num_classes=5, directed=False).num_classes == 5
    assert edge_pairs(from_pyg(d, directed=False)) == {(0, 1), (1, 0), (1, 2), (2, 1)}
    del d.val_mask
    with pytest.raises(InputError, match="PyG data has no 'val_mask'"):
        from_pyg(d)


class _FakeDGLGraph:
    """The slice of DGLGraph's API that from_dgl reads (no DGL wheel fits our torch)."""

    is_homogeneous = True

    def __init__(self, src, dst, n, ndata, edata=None):
        self._src, self._dst, self._n = src, dst, n
        self.ndata, self.edata = ndata, edata or {}

    def edges(self):
        return self._src, self._dst

    def num_nodes(self):
        return self._n


def test_from_dgl_conversion_logic(monkeypatch):
    import torch
    monkeypatch.setitem(sys.modules, "dgl", types.ModuleType("dgl"))
    ndata = {"feat": torch.ones(3, 2), "label": torch.tensor([0, 1, 1]),
             "train_mask": torch.tensor([1, 0, 0]).bool(), "val_mask": torch.tensor([0, 1, 0]).bool(),
             "test_mask": torch.tensor([0, 0, 1]).bool()}
    g = from_dgl(_FakeDGLGraph(torch.tensor([0, 2]), torch.tensor([1, 1]), 3, ndata,
                               {"w": torch.tensor([0.5, 2.0])}))
    assert edge_pairs(g) == {(0, 1), (2, 1)} and g.num_classes == 2
    assert g.edge_weight.tolist() == [0.5, 2.0]
    del ndata["label"]
    with pytest.raises(InputError, match="DGL graph has no ndata\\['label'\\]"):
        from_dgl(_FakeDGLGraph(torch.tensor([0]), torch.tensor([1]), 3, ndata))


def test_from_dgl_without_dgl_gives_install_advice(monkeypatch):
    monkeypatch.setitem(sys.modules, "dgl", None)  # makes `import dgl` raise ImportError
    with pytest.raises(InputError, match="from_dgl needs DGL: pip install dgl"):
        from_dgl(object())


def test_from_dgl_real():
    dgl = pytest.importorskip("dgl")
    import torch
    g = dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])), num_nodes=3)
    g.ndata["feat"] = torch.randn(3, 4)
    g.ndata["label"] = torch.tensor([0, 1, 0])
    for i, k in enumerate(("train_mask", "val_mask", "test_mask")):
        g.ndata[k] = torch.arange(3) == i
    h = from_dgl(g)
    assert edge_pairs(h) == {(0, 1), (1, 2), (2, 0)}
    np.testing.assert_array_equal(h.x, g.ndata["feat"].numpy())
