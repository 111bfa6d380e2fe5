"""Bounded-memory ingestion: generators and readers streamed into the binary cache.

The graphs must be bit for bit those of the in-memory code they replace: the fingerprints
below were recorded with the whole-graph generators (scipy COO/CSR, one ``standard_normal``
call for all features) before the streamed ones replaced them, and the readers are checked
against :func:`graph_from_arrays`, the in-memory builder. Block sizes are shrunk in one
test so that every streamed phase runs over many blocks. A failed ingestion leaves nothing
in the cache folder that looks like a cache.
"""
import gzip
import hashlib
import io
import json
import os

import numpy as np
import pytest

from gnnpar.datasets import (Graph, InputError, graph_from_arrays, load_cache, load_dataset,
                             read_npz, read_ogb, save_cache)
from gnnpar.datasets import cache as cache_mod
from gnnpar.datasets import csr_stream, file_stream, graph as graph_mod, ingest
from gnnpar.datasets.cache import CacheWriter
from gnnpar.datasets.csr_stream import EdgeSpill, build_csr

# (spec, directed, fingerprint, stored edges), recorded with the whole-graph generators.
# The last rmat and sbm rows draw more than one chunk (_CHUNK = 2**22) of edge samples.
RECORDED = [
    ("rmat:scale=4,ef=1,feat=1,classes=2", False, "21b9626662de11bc", 22),
    ("rmat:scale=4,ef=3,feat=2,classes=3,permute=false", True, "e3ad52d89e09c718", 33),
    ("rmat:scale=6,ef=4,feat=3,seed=5", False, "537bf989eba2d2ed", 308),
    ("rmat:scale=7,ef=8,feat=16,seed=1,permute=false", False, "be2ae05527385848", 1136),
    ("rmat:scale=8,ef=2,feat=5,seed=2", True, "9766858235cd85e7", 448),
    ("rmat:scale=9,ef=16,feat=7,classes=5,a=0.45,b=0.15,c=0.15", False, "8c8123d6cb267865", 13734),
    ("rmat:scale=10,ef=5,feat=8,seed=3,permute=false", True, "06b0c603de967e4d", 4435),
    ("rmat:scale=12,ef=16,feat=16,seed=4", False, "88144e702a734836", 96740),
    ("rmat:scale=12,ef=3,feat=1,seed=7,a=0.25,b=0.25,c=0.25", True, "59b2dc9ddabcfbab", 12283),
    ("sbm:n=50,blocks=3,p_in=0.3,p_out=0.05,feat=4", False, "50e25f82701d6d63", 274),
    ("sbm:n=300,blocks=5,p_in=0.1,p_out=0.01,feat=9,noise=0.5,seed=3", True, "9c1faec6dd41a0f1", 2420),
    ("sbm:n=2000,blocks=8,p_in=0.035,p_out=0.0025,feat=32,noise=1.0,seed=0", False, "1b4071bd3ce29225", 25906),
    ("sbm:n=1001,blocks=1000,p_in=0.5,p_out=0.002,feat=3,noise=0,seed=9", False, "7568d759f4545a0c", 2012),
    ("sbm:n=7,blocks=7,p_in=0,p_out=0,feat=2,seed=1", True, "dd3e7db0e0f7dc1e", 0),
]
MULTI_CHUNK = [
    ("rmat:scale=16,ef=80,feat=2", False, "1f79d5d9eac9f91a", 7540540),
    ("rmat:scale=16,ef=70,feat=1,permute=false", True, "34cf30c568c9a718", 3684810),
    ("sbm:n=6000,blocks=2,p_in=0.5,p_out=0.01,feat=2,seed=2", False, "2ced4a283228b3d0", 7259692),
    ("sbm:n=4000,blocks=3,p_in=0.4,p_out=0.1,feat=1,seed=4", True, "ff8eecc3f0fe06d4", 2773172),
]
SMALL = RECORDED[:3] + RECORDED[9:11]


def ids(rows):
    return [f"{spec}{'-directed' if d else ''}" for spec, d, *_ in rows]


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Every streamed phase in many blocks: CSR batches, feature rows, file reads, hashing."""
    monkeypatch.setattr(csr_stream, "BATCH", 7)
    monkeypatch.setattr(ingest, "ROW_BLOCK_BYTES", 40)
    monkeypatch.setattr(cache_mod, "_BLOCK_BYTES", 56)
    monkeypatch.setattr(graph_mod, "BLOCK_BYTES", 48)
    monkeypatch.setattr(file_stream, "BLOCK_BYTES", 24)


def cache_folders(root):
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


# ---------------------------------------------------------------- generators
@pytest.mark.parametrize("spec,directed,fp,m", RECORDED + MULTI_CHUNK, ids=ids(RECORDED + MULTI_CHUNK))
def test_generators_give_the_recorded_graphs(spec, directed, fp, m):
    g = load_dataset(spec, directed=directed)
    assert (g.fingerprint(), g.num_edges) == (fp, m)


@pytest.mark.parametrize("spec,directed,fp,m", RECORDED + MULTI_CHUNK[1:2], ids=ids(RECORDED + MULTI_CHUNK[1:2]))
def test_generated_into_the_cache_the_same_graph(tmp_path, spec, directed, fp, m):
    g = load_dataset(spec, directed=directed, cache_dir=str(tmp_path))
    assert (g.fingerprint(), g.num_edges) == (fp, m)
    assert isinstance(g.x, np.memmap) and isinstance(g.indices, np.memmap)  # mapped, not held
    assert g.meta["from_cache"] is False and g.meta["spec"] == spec
    (folder,) = cache_folders(tmp_path)
    with open(tmp_path / folder / "meta.json") as f:
        assert json.load(f)["fingerprint"] == fp
    assert load_cache(str(tmp_path / folder), verify=True).fingerprint() == fp
    again = load_dataset(spec, directed=directed, cache_dir=str(tmp_path))
    assert again.meta["from_cache"] is True and again.fingerprint() == fp
    memory = load_dataset(spec, directed=directed)
    assert {k: v for k, v in g.meta.items() if k != "cache_key"} == {**memory.meta, "from_cache": False}


@pytest.mark.parametrize("spec,directed,fp,m", SMALL, ids=ids(SMALL))
def test_block_sizes_do_not_change_the_graph(tmp_path, tiny_blocks, spec, directed, fp, m):
    assert load_dataset(spec, directed=directed).fingerprint() == fp
    assert load_dataset(spec, directed=directed, cache_dir=str(tmp_path)).fingerprint() == fp


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normal_draws_in_row_blocks_equal_one_draw(dtype):
    whole = np.random.default_rng(3).standard_normal((1001, 7), dtype=dtype)
    rng = np.random.default_rng(3)
    parts = [rng.standard_normal((k, 7), dtype=dtype) for k in (1, 2, 500, 3, 495)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_progress_lines_come_from_the_long_phases(tmp_path):
    lines = []
    load_dataset("rmat:scale=8,ef=4,feat=4", cache_dir=str(tmp_path), progress=lines.append)
    text = "\n".join(lines)
    assert "rmat scale=8" in text and "csr: sorting" in text and "features" in text


# ---------------------------------------------------------------- CSR builder
@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("drop_loops", [False, True])
@pytest.mark.parametrize("spill_to_file", [False, True])
def test_build_csr_equals_the_sorted_build(tmp_path, monkeypatch, directed, drop_loops, spill_to_file):
    monkeypatch.setattr(csr_stream, "BATCH", 13)
    rng = np.random.default_rng(1)
    n = 40
    src, dst = rng.integers(0, n, 600), rng.integers(0, n, 600)
    src[:30] = dst[:30]  # self loops
    src[30:60], dst[30:60] = src[60:90], dst[60:90]  # repeats
    chunks = [(src[i:i + 77].astype(np.uint32), dst[i:i + 77]) for i in range(0, 600, 77)]
    spill = EdgeSpill(str(tmp_path / "spill") if spill_to_file else None)
    indptr, cols = build_csr(iter(chunks), n, directed, spill, drop_loops)
    s, d = (src[src != dst], dst[src != dst]) if drop_loops else (src, dst)
    if not directed:
        s, d = np.concatenate([s, d]), np.concatenate([d, s])
    want_ptr, want_cols, _ = Graph.csr_from_edges(s, d, n)
    np.testing.assert_array_equal(indptr, want_ptr)
    np.testing.assert_array_equal(cols, want_cols)
    assert not os.path.exists(tmp_path / "spill")  # the scratch file is gone


# ---------------------------------------------------------------- cache writer
def _graph(weighted):
    g = graph_from_arrays(np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]]),
                          np.arange(15, dtype=np.float32).reshape(5, 3), np.array([0, 1, 0, 1, 2]),
                          [np.array([1, 1, 0, 0, 0]), np.array([0, 0, 1, 0, 0]), np.array([0, 0, 0, 1, 1])],
                          edge_weight=np.arange(1, 6, dtype=np.float32) if weighted else None)
    g.meta["note"] = "kept"
    return g


@pytest.mark.parametrize("weighted", [False, True])
def test_cache_files_are_what_np_save_writes(tmp_path, weighted):
    g = _graph(weighted)
    folder = save_cache(g, str(tmp_path / "c"))
    for name in cache_mod.ARRAYS:
        arr = getattr(g, name)
        path = os.path.join(folder, f"{name}.npy")
        if arr is None:
            assert not os.path.exists(path)
            continue
        buf = io.BytesIO()
        np.save(buf, arr)
        with open(path, "rb") as f:
            assert f.read() == buf.getvalue(), name
    meta = json.load(open(os.path.join(folder, "meta.json")))
    assert meta["fingerprint"] == g.fingerprint() and meta["meta"]["note"] == "kept"
    assert list(meta["arrays"]) == [k for k in cache_mod.ARRAYS if getattr(g, k) is not None]


def test_arrays_out_of_order_or_of_unknown_length_are_hashed_from_the_files(tmp_path):
    g = _graph(False)
    with CacheWriter(str(tmp_path / "c")) as out:
        x = out.open("x", np.float32, (None, 3))  # rows counted as they come: header rewritten
        for row in np.asarray(g.x):
            x.append(row[None])
        x.close()
        for name in ("y", "train_mask", "val_mask", "test_mask", "indices", "indptr"):
            out.write(name, getattr(g, name))
        out.name, out.num_classes = g.name, g.num_classes
        folder = out.finish()
    assert json.load(open(os.path.join(folder, "meta.json")))["fingerprint"] == g.fingerprint()
    buf = io.BytesIO()
    np.save(buf, g.x)
    assert open(os.path.join(folder, "x.npy"), "rb").read() == buf.getvalue()
    assert load_cache(folder, verify=True).fingerprint() == g.fingerprint()


def test_a_failure_midway_leaves_no_cache(tmp_path):
    with pytest.raises(RuntimeError, match="midway"):
        with CacheWriter(str(tmp_path / "c")) as out:
            out.write("indptr", np.zeros(3, np.int64))
            s = out.open("indices", np.int64, (10,))
            s.append(np.zeros(4, np.int64))
            raise RuntimeError("midway")
    assert cache_folders(tmp_path) == []
    g = _graph(False)
    g.val_mask[:] = False
    with pytest.raises(InputError, match="^where: val_mask selects no node"):
        with CacheWriter(str(tmp_path / "c")) as out:  # validated before it is swapped in
            for name in cache_mod.ARRAYS:
                if getattr(g, name) is not None:
                    out.write(name, getattr(g, name))
            out.num_classes = g.num_classes
            out.finish(where="where")
    assert cache_folders(tmp_path) == []


def test_keep_existing_keeps_a_cache_another_process_wrote(tmp_path):
    first = _graph(False)
    save_cache(first, str(tmp_path / "c"))
    other = _graph(True)
    with CacheWriter(str(tmp_path / "c"), keep_existing=True) as out:
        for name in cache_mod.ARRAYS:
            out.write(name, getattr(other, name))
        out.num_classes = other.num_classes
        out.finish()
    assert load_cache(str(tmp_path / "c")).fingerprint() == first.fingerprint()
    assert cache_folders(tmp_path) == ["c"]


def test_validate_reads_a_mapped_x_in_blocks(tmp_path, monkeypatch):
    g = _graph(False)
    x = np.array(g.x)
    x[1, 2] = np.nan
    x[3, 0] = np.inf
    g.x = x
    folder = save_cache(g, str(tmp_path / "c"))  # save_cache does not validate
    monkeypatch.setattr(graph_mod, "BLOCK_BYTES", 12)  # one row a block
    mapped = load_cache(folder)
    with pytest.raises(InputError, match=r"x contains NaN or inf in 2 row\(s\), first at node 1"):
        mapped.validate()
    blocks = list(graph_mod.row_blocks(mapped.x, 24))
    assert [b.shape for _, b in blocks] == [(2, 3), (2, 3), (1, 3)]
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), x)


def test_fingerprint_in_blocks_equals_the_whole_array_hash(monkeypatch):
    g = _graph(True)
    g.x = np.asfortranarray(np.array(g.x))  # hashed as its C-order bytes
    h = hashlib.sha256()
    for arr in (g.indptr, g.indices, g.edge_weight, g.x, g.y, g.train_mask, g.val_mask, g.test_mask):
        a = np.ascontiguousarray(arr)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(memoryview(a).cast("B"))
    h.update(str(g.num_classes).encode())
    monkeypatch.setattr(graph_mod, "BLOCK_BYTES", 13)
    assert g.fingerprint() == h.hexdigest()[:16]


def test_an_unwritable_cache_folder_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(RuntimeWarning, match="could not write dataset cache"):
        g = load_dataset(RECORDED[0][0], cache_dir=str(blocker / "cache"))
    assert g.fingerprint() == RECORDED[0][2] and g.meta["from_cache"] is False


# ---------------------------------------------------------------- npz and OGB
def write_gz(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(f"{line}\n" for line in lines))


N = 30


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    edges = rng.integers(0, N, (2, 200))
    edges[1, :10] = edges[0, :10]  # self loops: kept by the readers
    y = rng.integers(0, 4, N)
    parts = np.arange(N) % 3
    return edges, rng.standard_normal((N, 5)).astype(np.float32), y, [parts == 0, parts == 1, parts == 2]


def write_ogb_csv(root, edges, x, y, masks, count=True):
    raw = os.path.join(root, "raw")
    write_gz(f"{raw}/edge.csv.gz", [f"{s},{d}" for s, d in edges.T])
    write_gz(f"{raw}/node-feat.csv.gz", [",".join(repr(float(v)) for v in row) for row in x])
    write_gz(f"{raw}/node-label.csv.gz", [str(v) for v in y])
    if count:
        write_gz(f"{raw}/num-node-list.csv.gz", [str(len(y))])
    for part, mask in zip(("train", "valid", "test"), masks):
        write_gz(f"{root}/split/s/{part}.csv.gz", [str(i) for i in np.flatnonzero(mask)])
    return str(root)


def write_ogb_binary(root, edges, x, y, masks, compressed=False, fortran=False):
    raw = os.path.join(root, "raw")
    os.makedirs(raw, exist_ok=True)
    save = np.savez_compressed if compressed else np.savez
    save(f"{raw}/data.npz", edge_index=np.asfortranarray(edges) if fortran else edges, node_feat=x,
         num_nodes_list=np.array([len(y)]))
    np.savez(f"{raw}/node-label.npz", node_label=y.astype(np.float32)[:, None])
    for part, mask in zip(("train", "valid", "test"), masks):
        write_gz(f"{root}/split/s/{part}.csv.gz", [str(i) for i in np.flatnonzero(mask)])
    return str(root)


@pytest.mark.parametrize("layout", ["csv", "npz", "npz-compressed", "npz-fortran"])
@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("small", [False, True], ids=["default-blocks", "tiny-blocks"])
def test_ogb_streamed_equals_the_in_memory_build(tmp_path, request, layout, directed, small):
    if small:
        request.getfixturevalue("tiny_blocks")
    edges, x, y, masks = arrays()
    if layout == "csv":
        root = write_ogb_csv(tmp_path / "d", edges, x, y, masks)
    else:
        root = write_ogb_binary(tmp_path / "d", edges, x, y, masks, compressed="compressed" in layout,
                                fortran="fortran" in layout)
    want = graph_from_arrays(edges, x, y, masks, int(y.max()) + 1, directed=directed)
    assert read_ogb(root, directed=directed).fingerprint() == want.fingerprint()
    g = load_dataset(f"ogb:{root}", directed=directed, cache_dir=str(tmp_path / "cache"))
    assert g.fingerprint() == want.fingerprint() and isinstance(g.x, np.memmap)
    assert g.meta["split"] == "s" and g.meta["directed"] is directed


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("fortran", [False, True])
def test_npz_streamed_equals_the_in_memory_build(tmp_path, tiny_blocks, compressed, fortran):
    edges, x, y, masks = arrays(1)
    path = str(tmp_path / "g.npz")
    (np.savez_compressed if compressed else np.savez)(
        path, edge_index=np.asfortranarray(edges) if fortran else edges,
        x=np.asfortranarray(x.astype(np.float64)) if fortran else x.astype(np.float64), y=y,
        train_mask=masks[0], val_mask=masks[1], test_mask=masks[2].astype(np.uint8))
    for directed in (False, True):
        want = graph_from_arrays(edges, x.astype(np.float64), y, masks, directed=directed)
        assert read_npz(path, directed=directed).fingerprint() == want.fingerprint()
        g = load_dataset(f"npz:{path}", directed=directed, cache_dir=str(tmp_path / "cache"))
        assert g.fingerprint() == want.fingerprint()


def _truncate(path):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])


def _bad_edges(root, what):
    edge_file = f"{root}/raw/edge.csv.gz"
    lines = [f"{s},{d}" for s, d in np.random.default_rng(5).integers(0, N, (2000, 2))]  # compresses little
    if what == "truncated":
        write_gz(edge_file, lines)
        _truncate(edge_file)
    elif what == "short_line":
        write_gz(edge_file, lines[:1499] + ["17"] + lines[1500:])
    elif what == "out_of_range":
        write_gz(edge_file, lines[:1699] + [f"3,{N}"] + lines[1700:])
    return edge_file


@pytest.mark.parametrize("what,msg", [
    ("truncated", r"cannot decompress {f} \(after line [1-9][0-9,]*\)"),
    ("short_line", r"{f} line 1500: expected 2 comma-separated int64 value\(s\), got '17'"),
    ("out_of_range", r"{f} line 1700: edge endpoint 30 is out of range \[0, 30\)"),
])
def test_bad_ogb_edges_name_the_line_and_leave_no_cache(tmp_path, monkeypatch, what, msg):
    monkeypatch.setattr(file_stream, "BLOCK_BYTES", 4096)  # the bad part lies blocks into the file
    root = write_ogb_csv(tmp_path / "d", *arrays())
    edge_file = _bad_edges(root, what)
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match=msg.format(f=edge_file)):
        load_dataset(f"ogb:{root}", cache_dir=str(cache))
    assert cache_folders(cache) == []  # no folder, not even the temporary one
    with pytest.raises(InputError, match=msg.format(f=edge_file)):
        read_ogb(root)


def test_bad_npz_and_features_leave_no_cache(tmp_path):
    edges, x, y, masks = arrays()
    edges[0, 123] = -4
    path = str(tmp_path / "g.npz")
    np.savez(path, edge_index=edges, x=x, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match=rf"{path}: edge_index column 123: edge endpoint -4 is out of range"):
        load_dataset(f"npz:{path}", cache_dir=str(cache))
    assert cache_folders(cache) == []
    edges, x, y, masks = arrays()
    x[7, 1] = np.nan
    root = write_ogb_csv(tmp_path / "d", edges, x, y, masks)
    with pytest.raises(InputError, match=r"node-feat.csv.gz: x contains NaN or inf in 1 row\(s\), first at node 7"):
        load_dataset(f"ogb:{root}", cache_dir=str(cache))
    assert cache_folders(cache) == []
    masks[1][:] = False
    root = write_ogb_csv(tmp_path / "e", edges, np.nan_to_num(x), y, masks)
    with pytest.raises(InputError, match=r"OGB folder .*: val_mask selects no node"):
        load_dataset(f"ogb:{root}", cache_dir=str(cache))
    assert cache_folders(cache) == []


def test_cache_content_hash_matches_a_reread(tmp_path):
    """The fingerprint computed while streaming equals one computed from the files."""
    g = load_dataset("rmat:scale=7,ef=4,feat=3", cache_dir=str(tmp_path))
    (folder,) = cache_folders(tmp_path)
    h = hashlib.sha256()
    for name in cache_mod.ARRAYS:
        path = tmp_path / folder / f"{name}.npy"
        if path.exists():
            cache_mod._hash_file(h, str(path))
        else:
            h.update(b"none")
    h.update(str(g.num_classes).encode())
    assert h.hexdigest()[:16] == g.fingerprint()
