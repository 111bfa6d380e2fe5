"""OGB link-property folders (``ogb:DIR`` with ``split/<name>/*.pt``), read without the ogb
package: both of OGB's split layouts, read as given with held-out edges out of the graph the
messages pass over; the files loaded with ``weights_only=True`` (another pickled object is
refused, not run); bad files and a node run on a link folder exit 2 with one line; a run
through the installed ``gnnpar-train`` on such a folder, serial and on 2 ranks.
"""
import gzip
import json
import os

import numpy as np
import pytest
import torch

from gnnpar.datasets import InputError, load_dataset
from gnnpar.link.split import undirected_edges

from .cli_util import run_installed
from .test_promises_cli import one_line

N = 40


def _gz(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(f"{line}\n" for line in lines))


def _edges(seed=0):
    """A random simple undirected graph on N nodes: (E, 2) pairs u < v, every node on one."""
    rng = np.random.default_rng(seed)
    ring = np.stack([np.arange(N), (np.arange(N) + 1) % N], 1)
    extra = rng.integers(0, N, (160, 2))
    pairs = np.concatenate([ring, extra])
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return np.unique(np.sort(pairs, 1), axis=0)


def write_link_folder(root, layout="edge", as_tensors=False, seed=0, split="time"):
    """An OGB link-property folder as OGB's downloader unpacks one: raw/ holds the training
    edges (as OGB's do) and the features; split/<split>/{train,valid,test}.pt the split in
    ``layout`` ``edge`` (collab: K x 2 pairs, shared negatives) or ``source`` (citation2:
    sources, targets, K x R ranked negatives). Returns (train, valid, test) pairs (K, 2)."""
    pairs = _edges(seed)
    rng = np.random.default_rng(seed + 1)
    order = rng.permutation(pairs.shape[0])
    val, test, train = (pairs[order[:12]], pairs[order[12:24]], pairs[order[24:]])
    x = rng.standard_normal((N, 3)).astype(np.float32)
    _gz(f"{root}/raw/edge.csv.gz", [f"{u},{v}" for u, v in train])
    _gz(f"{root}/raw/node-feat.csv.gz", [",".join(f"{v:.6f}" for v in row) for row in x])
    _gz(f"{root}/raw/num-node-list.csv.gz", [str(N)])
    conv = (lambda a: torch.from_numpy(np.ascontiguousarray(a))) if as_tensors else (lambda a: a)
    folder = f"{root}/split/{split}"
    os.makedirs(folder, exist_ok=True)
    for name, part in (("train", train), ("valid", val), ("test", test)):
        if layout == "edge":
            d = {"edge": conv(part), "year": conv(np.full(len(part), 2020))}
            if name != "train":
                d["edge_neg"] = conv(rng.integers(0, N, (30, 2)))
        else:
            d = {"source_node": conv(part[:, 0]), "target_node": conv(part[:, 1])}
            if name != "train":
                d["target_node_neg"] = conv(rng.integers(0, N, (len(part), 7)))
        torch.save(d, f"{folder}/{name}.pt")
    return train, val, test


def _keys(pairs):
    pairs = np.asarray(pairs)
    return set((np.minimum(pairs[0], pairs[1]) * N + np.maximum(pairs[0], pairs[1])).tolist())


@pytest.mark.parametrize("layout,as_tensors", [("edge", False), ("source", True),
                                               ("source", False)])
def test_link_folder_split_read_as_given(tmp_path, layout, as_tensors):
    from gnnpar.training.shard_source import load_graph
    from gnnpar.cli.spec import RunSpec
    train, val, test = write_link_folder(tmp_path / "ogbl", layout, as_tensors)
    spec = f"ogb:{tmp_path / 'ogbl'}"
    g = load_dataset(spec)
    assert g.meta["task"] == "link" and g.num_classes == 1 and g.num_nodes == N
    loaded = load_graph(RunSpec.of(task="link", dataset=spec, reorder="none"))
    got = loaded.meta["link_split"]
    assert np.array_equal(got.train_pos, train.T) and np.array_equal(got.test_pos, test.T)
    assert np.array_equal(got.val_pos, val.T)
    folder = tmp_path / "ogbl" / "split" / "time"
    if layout == "edge":  # shared negatives as given; ranked ones drawn
        given = torch.load(folder / "valid.pt", weights_only=False)["edge_neg"]
        assert np.array_equal(got.val_neg, np.asarray(given).T)
        assert got.val_neg_dst.shape == (12, 100)
    else:  # ranked negatives as given (citation2's MRR); shared ones drawn
        given = torch.load(folder / "test.pt", weights_only=False)["target_node_neg"]
        assert np.array_equal(got.test_neg_dst, np.asarray(given))
        assert got.test_neg.shape == (2, 12)
    kept = set(undirected_edges(loaded).tolist())
    assert not kept & (_keys(val.T) | _keys(test.T))
    assert kept == _keys(train.T)


def test_link_folder_with_held_out_edges_in_raw_keeps_them_out(tmp_path):
    """A folder whose raw/ edges include the held-out ones: they are removed all the same."""
    from gnnpar.training.shard_source import load_graph
    from gnnpar.cli.spec import RunSpec
    root = tmp_path / "ogbl"
    train, val, test = write_link_folder(root)
    every = np.concatenate([train, val, test])
    _gz(f"{root}/raw/edge.csv.gz", [f"{u},{v}" for u, v in every])
    loaded = load_graph(RunSpec.of(task="link", dataset=f"ogb:{root}", reorder="none"))
    assert set(undirected_edges(loaded).tolist()) == _keys(train.T)


class Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


@pytest.mark.parametrize("damage,says", [
    ("pickle", "not an OGB split file gnnpar can read safely"),
    ("range", "test_pos has vertex id 40, out of range for 40 vertices"),
    ("shape", "edge must be a K x 2 array of vertex pairs"),
    ("keys", "has neither 'edge' nor 'source_node'/'target_node'"),
    ("ranked", "target_node_neg must be K x R with K = 12"),
    ("missing", "has no valid.pt"),
])
def test_bad_link_folder_exits_2_with_one_line(tmp_path, damage, says):
    root = tmp_path / "ogbl"
    train, val, test = write_link_folder(root, "source" if damage == "ranked" else "edge")
    folder = root / "split" / "time"
    if damage == "pickle":
        torch.save({"edge": Evil()}, folder / "test.pt")
    elif damage == "range":
        bad = test.copy()
        bad[0, 1] = N
        torch.save({"edge": bad}, folder / "test.pt")
    elif damage == "shape":
        torch.save({"edge": test.T.copy()}, folder / "test.pt")
    elif damage == "keys":
        torch.save({"pairs": test}, folder / "test.pt")
    elif damage == "ranked":
        torch.save({"source_node": test[:, 0], "target_node": test[:, 1],
                    "target_node_neg": np.zeros((3, 5), np.int64)}, folder / "test.pt")
    else:
        os.remove(folder / "valid.pt")
    res = run_installed("gnnpar-train", "--task", "link", "--dataset", f"ogb:{root}",
                        "--epochs", "1", "--quiet", cwd=tmp_path)
    assert says in one_line(res)
    assert not (tmp_path / "PWNED").exists()


def test_node_run_on_a_link_folder_is_refused(tmp_path):
    root = tmp_path / "ogbl"
    write_link_folder(root)
    res = run_installed("gnnpar-train", "--dataset", f"ogb:{root}", "--epochs", "1", "--quiet",
                        cwd=tmp_path)
    assert "is a link-property dataset" in one_line(res)
    with pytest.raises(InputError, match="has no node-label"):  # a node folder still needs labels
        os.rename(root / "split" / "time" / "train.pt", root / "split" / "time" / "train.csv.gz")
        for part in ("valid", "test"):
            os.rename(root / "split" / "time" / f"{part}.pt",
                      root / "split" / "time" / f"{part}.csv.gz")
        load_dataset(f"ogb:{root}")


@pytest.mark.slow
def test_link_training_on_an_ogb_folder_serial_and_two_ranks(tmp_path):
    """The user guide's OGB link command (docs/guide.md): serial and 2-rank 1d-halo runs of one folder agree
    (dropout 0), and the cache of the folder gives the same run."""
    write_link_folder(tmp_path / "ogbl_collab", "source")
    argv = ["--task", "link", "--dataset", "ogb:ogbl_collab", "--hidden", "8", "--epochs", "3",
            "--dropout", "0", "--quiet"]
    logs = {}
    for name, extra in (("serial", []), ("halo", ["--algo", "1d-halo", "--nprocs", "2"]),
                        ("cached", ["--cache-dir", "cache"])):
        res = run_installed("gnnpar-train", *argv, *extra, "--log-json", f"{name}.jsonl",
                            cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        logs[name] = [json.loads(line) for line in open(tmp_path / f"{name}.jsonl")]
    ref = logs["serial"]
    assert ref[-1]["final"] and 0.0 <= ref[-1]["test_mrr"] <= 1.0
    for name in ("halo", "cached"):
        for a, b in zip(logs[name], ref):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
            assert a["test_mrr"] == pytest.approx(b["test_mrr"], abs=1e-5)


def test_split_file_pickled_by_numpy_1_loads(tmp_path):
    """OGB's files were written under numpy 1.x, whose pickles name
    ``numpy.core.multiarray._reconstruct`` (numpy 2: ``numpy._core``): both names load."""
    import zipfile

    from gnnpar.datasets.ogb_link import load_split_file
    edges = np.array([[0, 1], [2, 3]], np.int64)
    torch.save({"edge": edges}, tmp_path / "new.pt")
    with zipfile.ZipFile(tmp_path / "new.pt") as src, \
            zipfile.ZipFile(tmp_path / "old.pt", "w", zipfile.ZIP_STORED) as dst:
        renamed = 0
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("data.pkl"):
                renamed = data.count(b"numpy._core.multiarray")
                data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            dst.writestr(item, data)
    assert renamed, "the pickle no longer names numpy._core: rewrite this test"
    for name in ("new.pt", "old.pt"):
        assert np.array_equal(load_split_file(str(tmp_path / name))["edge"], edges)
