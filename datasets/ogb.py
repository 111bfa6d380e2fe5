"""OGB node-property (and link-property) dataset folders, read without the ogb package, in
bounded memory.

:func:`write_ogb` streams a folder into an output (:mod:`.ingest`): features a block of rows
at a time, edges through :func:`.csr_stream.build_csr` (spilled to a scratch file next to a
cache), so a cache of a folder larger than memory can be built; labels and split lists (one
value a node) are read whole. :func:`read_ogb` runs the same code into memory.

OGB's edge files are directed (e.g. arxiv: "src cites dst"); the default stores both
directions. Self loops in the file are kept and repeated edges merged. Every problem is an
:class:`InputError` naming the file (and the line, for a text file). A link-property folder's
``raw/`` is read the same way, without labels; its edge split by :mod:`.ogb_link`.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import numpy as np

from .csr_stream import csr_bytes
from .errors import InputError
from .file_stream import (BLOCK_BYTES, iter_csv_gz, iter_npz_edges, iter_npz_rows, load_npz_arrays,
                          npz_headers, read_csv_gz)
from .graph import Graph
from .ingest import MemoryWriter, checked_edges, feature_block_bytes, write_edges, write_features
from .limits import check_memory
from .ogb_link import is_link_split
from .progress import throttled


def pick_split(root: str, split: Optional[str]) -> str:
    """``root/split/<split>``, or the one split folder there when ``split`` is None."""
    base = os.path.join(root, "split")
    found = (sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
             if os.path.isdir(base) else [])
    if split is not None:
        if split not in found:
            raise InputError(f"split '{split}' not found under {base} "
                             f"(found: {', '.join(found) or 'none'})")
        return os.path.join(base, split)
    if not found:
        raise InputError(f"no split folder under {base} (expected split/<name>/train.csv.gz, ...)")
    if len(found) > 1:
        raise InputError(f"several splits under {base} ({', '.join(found)}): "
                         "choose one with split=NAME")
    return os.path.join(base, found[0])


def _check_node_count(counts: np.ndarray, where: str, n: int) -> None:
    counts = np.asarray(counts).ravel()
    if counts.size != 1:
        raise InputError(f"{where} must hold one node count (a single graph), "
                         f"got {counts.size} values")
    if int(counts[0]) != n:
        raise InputError(f"{where} says {int(counts[0])} nodes but the features have {n} rows")


def _csv_layout(out, raw: str, directed: bool, say, labelled: bool = True):
    """Features, edges (into ``out``) and labels (float64, NaN = unlabelled; None for a
    link-property folder, ``labelled`` False) from the CSV layout. Each file is parsed
    within the memory limit, counting what is already held and
    what each row will need: in memory the features and the edges' CSR, for a cache only
    the CSR's 4 bytes an entry (:func:`.csr_stream.csr_bytes`)."""
    needed = ("edge.csv.gz", "node-feat.csv.gz") + (("node-label.csv.gz",) if labelled else ())
    for fname in needed:
        if not os.path.isfile(os.path.join(raw, fname)):
            raise InputError(f"{raw} has no {fname} (nor data.npz)")
    feat = os.path.join(raw, "node-feat.csv.gz")
    say(f"ogb: features from {feat}", force=True)
    kept = 2 if out.holds_arrays else 0  # in memory: the blocks and their concatenation
    n, f = write_features(out, iter_csv_gz(feat, np.float32, kept=kept), None, feat)
    held = 4 * n * f if out.holds_arrays else 0
    count_file = os.path.join(raw, "num-node-list.csv.gz")
    if os.path.isfile(count_file):
        _check_node_count(read_csv_gz(count_file, np.int64, held=held), count_file, n)
    edge_file = os.path.join(raw, "edge.csv.gz")
    dirs = 1 if directed else 2

    def blocks():
        # a row: its CSR entries (4 bytes each), in memory also the spill and int64 result
        for first, rows in iter_csv_gz(edge_file, np.int64, held=held + csr_bytes(0, n, False),
                                       row_bytes=(20 if out.holds_arrays else 4) * dirs):
            if rows.size and rows.shape[1] != 2:
                raise InputError(f"{edge_file} must have 2 columns (src,dst), got {rows.shape[1]}")
            if rows.size:
                say(f"ogb: edges read to line {first + rows.shape[0] - 1:,}")
                yield first, rows[:, 0], rows[:, 1]

    say(f"ogb: edges from {edge_file}", force=True)
    write_edges(out, checked_edges(blocks(), n, lambda first, i: f"{edge_file} line {first + i}"),
                n, directed, say)
    if not labelled:
        return n, None, None
    labels = read_csv_gz(os.path.join(raw, "node-label.csv.gz"), np.float64,
                         held=held + csr_bytes(0, n, False), row_bytes=8 + 3)
    return n, labels, "node-label.csv.gz"


def _binary_layout(out, raw: str, directed: bool, say, labelled: bool = True):
    """The same from the binary layout of the largest sets (``data.npz`` + ``node-label.npz``):
    edges and features read from the zip members a block at a time."""
    data = os.path.join(raw, "data.npz")
    label_file = os.path.join(raw, "node-label.npz")
    if labelled and not os.path.isfile(label_file):
        raise InputError(f"{raw} has data.npz but no node-label.npz")
    heads = npz_headers(data)
    keys = ("edge_index", "node_feat", "num_nodes_list")
    missing = [k for k in keys if k not in heads]
    if missing:
        raise InputError(f"{data} is missing key '{missing[0]}' (it needs {', '.join(keys)})")
    x_shape, x_dtype, _ = heads["node_feat"]
    if len(x_shape) != 2 or not np.issubdtype(x_dtype, np.floating):
        raise InputError(f"{data}: node_feat must be a 2-D float array, got {x_dtype} {x_shape}")
    e_shape, e_dtype, _ = heads["edge_index"]
    if len(e_shape) != 2 or e_shape[0] != 2 or not np.issubdtype(e_dtype, np.integer):
        raise InputError(f"{data}: edge_index must be a (2, E) integer array, "
                         f"got {e_dtype} {e_shape}")
    n, f, edges = x_shape[0], x_shape[1], e_shape[1]
    dirs = 1 if directed else 2
    check_memory(csr_bytes(dirs * edges, n, out.holds_arrays)
                 + (4 * n * f if out.holds_arrays else 0)
                 + feature_block_bytes(heads["node_feat"][2], x_dtype.itemsize, BLOCK_BYTES)
                 + 8 * n * 3, f"{data} ({n:,} nodes, {edges:,} edges, {f:,} features)")
    _check_node_count(load_npz_arrays(data, ("num_nodes_list",), heads=heads)["num_nodes_list"],
                      f"{raw}/data.npz num_nodes_list", n)
    say(f"ogb: {edges:,} edges from {data}", force=True)
    write_edges(out, checked_edges(iter_npz_edges(data, "edge_index"), n,
                                   lambda first, i: f"{data}: edge_index column {first + i}"),
                n, directed, say)
    say(f"ogb: features from {data}", force=True)
    write_features(out, iter_npz_rows(data, "node_feat", scratch=out.scratch("node-feat")), n, data)
    if not labelled:
        return n, None, None
    labels = load_npz_arrays(label_file, ("node_label",))["node_label"]
    if not np.issubdtype(labels.dtype, np.number):
        raise InputError(f"{raw}/node-label.npz: node_label must be numeric, got {labels.dtype}")
    return n, labels.astype(np.float64), "node-label.npz"


def write_ogb(out, root: str, directed: bool = False, split: Optional[str] = None,
              progress: Optional[Callable[[str], None]] = None) -> None:
    """An OGB folder written into ``out`` (:mod:`.ingest`); see :func:`read_ogb` for the layout.
    The caller finishes ``out`` (validating it)."""
    if not os.path.isdir(root):
        raise InputError(f"OGB dataset folder not found: {root}")
    raw = os.path.join(root, "raw")
    if not os.path.isdir(raw):
        raise InputError(f"OGB folder {root} has no raw/ subfolder")
    split_dir = pick_split(root, split)
    link = is_link_split(split_dir)
    for part in ("train", "valid", "test"):
        name = f"{part}.pt" if link else f"{part}.csv.gz"
        if not os.path.isfile(os.path.join(split_dir, name)):
            raise InputError(f"OGB split folder {split_dir} has no {name}")
    say = throttled(progress)
    layout = _binary_layout if os.path.isfile(os.path.join(raw, "data.npz")) else _csv_layout
    n, labels, label_file = layout(out, raw, directed, say, labelled=not link)
    if link:
        _no_node_task(out, root, split_dir, n, directed)
        return
    if labels.ndim == 2 and labels.shape[1] != 1:
        raise InputError(f"{raw}/{label_file} has {labels.shape[1]} columns: "
                         "multi-label tasks are not supported")
    labels = labels.reshape(-1)
    if labels.shape[0] != n:
        raise InputError(f"{raw}/{label_file} has {labels.shape[0]} labels "
                         f"but the features have {n} rows")
    unlabelled = np.isnan(labels)
    known = labels[~unlabelled]
    if not np.all(np.isfinite(known)) or np.any(known != np.round(known)):
        raise InputError(f"{raw}/{label_file} holds a label that is neither an integer nor NaN")
    out.write("y", np.where(unlabelled, 0, labels).astype(np.int64))
    for part, name in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
        fname = os.path.join(split_dir, f"{part}.csv.gz")
        ids = read_csv_gz(fname, np.int64).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise InputError(f"{fname}: node id {bad} is out of range [0, {n})")
        mask = np.zeros(n, dtype=bool)
        mask[ids] = True
        out.write(name, mask & ~unlabelled)
    out.name = os.path.basename(os.path.normpath(root))
    out.num_classes = int(known.max()) + 1 if known.size else 1
    out.meta = {"source": os.path.abspath(root), "split": os.path.basename(split_dir),
                "unlabelled": int(unlabelled.sum()), "directed": bool(directed)}


def _no_node_task(out, root: str, split_dir: str, n: int, directed: bool) -> None:
    """A link-property folder's node arrays: it has no labels, so every node is class 0 and
    in every mask (a graph needs them; a node-classification run on it is refused by
    ``meta["task"]``); its edge split is read by :func:`gnnpar.link.split.given_arrays`."""
    out.write("y", np.zeros(n, np.int64))
    for name in ("train_mask", "val_mask", "test_mask"):
        out.write(name, np.ones(n, bool))
    out.name = os.path.basename(os.path.normpath(root))
    out.num_classes = 1
    out.meta = {"source": os.path.abspath(root), "split": os.path.basename(split_dir),
                "task": "link", "directed": bool(directed)}


def read_ogb(root: str, directed: bool = False, split: Optional[str] = None,
             progress: Optional[Callable[[str], None]] = None) -> Graph:
    """Read an OGB node-property dataset folder as OGB's downloader unpacks it (no ogb package).

    CSV layout: ``raw/edge.csv.gz`` ("src,dst" per line), ``raw/node-feat.csv.gz`` (N rows of F
    floats), ``raw/node-label.csv.gz`` (one label per line) and, optionally,
    ``raw/num-node-list.csv.gz`` (the node count, checked against the feature rows). Binary
    layout (ogbn-papers100M): ``raw/data.npz`` (``edge_index`` (2, E), ``node_feat`` (N, F),
    ``num_nodes_list``) and ``raw/node-label.npz`` (``node_label`` (N, 1)); used when
    ``raw/data.npz`` exists. Splits: ``split/<name>/{train,valid,test}.csv.gz`` (node ids, one
    per line); ``split`` names the subfolder and may be omitted when there is exactly one.

    A link-property folder (``split/<name>/train.pt``, :mod:`.ogb_link`) has the same ``raw/``
    without labels: its graph gets ``meta["task"] = "link"``, every node class 0 and in every
    mask, and its edge split is read apart (:func:`gnnpar.link.split.given_arrays`).

    Unlabelled nodes (label NaN, as in ogbn-papers100M) get label 0 and are left out of all
    three masks, even if a split file lists them; ``meta['unlabelled']`` counts them.
    OGB's edge files are directed (e.g. arxiv: "src cites dst"); the default symmetrises.
    """
    with MemoryWriter() as out:
        write_ogb(out, root, directed, split, progress)
        return out.finish(validate=True, where=f"OGB folder {root}")
