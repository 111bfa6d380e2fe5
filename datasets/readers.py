"""On-disk readers: a plain ``.npz`` file and an OGB node-property folder (without the ogb package).

Edge lists are read as (source, target) pairs; in the CSR the target's row holds the source
(the target aggregates from the source, PyG's ``source_to_target`` flow). Undirected reading
(the default) adds the reverse of every edge; ``directed=True`` keeps the edges as given.
Duplicate edges are merged; self loops present in the file are kept (nothing is added or
removed behind the user's back). Every reader returns a validated :class:`Graph` or raises
:class:`InputError` with one line naming the file and what is wrong.
"""
from __future__ import annotations

import gzip
import math
import os
import zipfile
import zlib
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from .errors import InputError
from .graph import Graph
from .limits import check_memory, check_num_classes, format_bytes

NPZ_KEYS = ("edge_index", "x", "y", "train_mask", "val_mask", "test_mask")
_MASKS = ("train_mask", "val_mask", "test_mask")


# ---------------------------------------------------------------- assembling a graph
def _as_mask(arr, name: str, n: int) -> np.ndarray:
    a = np.asarray(arr)
    if a.shape != (n,):
        raise InputError(f"{name} must have shape ({n},), got {a.shape}")
    if a.dtype == np.bool_:
        return a
    if np.issubdtype(a.dtype, np.integer) and np.all((a == 0) | (a == 1)):
        return a.astype(bool)
    raise InputError(f"{name} must be boolean (or 0/1 integers), got {a.dtype}")


def graph_from_arrays(edge_index, x, y, masks, num_classes: Optional[int] = None, *,
                      directed: bool = False, edge_weight=None, name: str = "graph",
                      meta: Optional[dict] = None) -> Graph:
    """Check user arrays and build a validated :class:`Graph`.

    Shapes: ``edge_index`` (2, E) integers (row 0 source, row 1 target), ``x`` (N, F) float
    (stored as float32), ``y`` (N,) or (N, 1) integers, ``masks`` three (N,) bool or 0/1 arrays
    (train, val, test), ``edge_weight`` (E,) float or None. ``num_classes`` defaults to
    ``y.max() + 1``. Undirected (default): every edge is also stored reversed; a pair given
    both ways with different weights keeps the larger weight in both directions.
    """
    ei = np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise InputError(f"edge_index must have shape (2, E), got {ei.shape}")
    if not np.issubdtype(ei.dtype, np.integer):
        raise InputError(f"edge_index must be an integer array, got {ei.dtype}")
    x = np.asarray(x)
    if x.ndim != 2:
        raise InputError(f"x must have shape (N, F), got {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise InputError(f"x must be a float array, got {x.dtype}")
    n = x.shape[0]
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.shape != (n,):
        raise InputError(f"y must have shape (N={n},) like x's rows, got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"y must be an integer array, got {y.dtype}")
    if len(masks) != 3:
        raise InputError(f"need 3 masks (train, val, test), got {len(masks)}")
    train, val, test = (_as_mask(m, k, n) for m, k in zip(masks, _MASKS))
    if n and np.issubdtype(y.dtype, np.unsignedinteger) and int(y.max()) > np.iinfo(np.int64).max:
        raise InputError(f"y holds label {int(y.max())} ({y.dtype}), which is no class id: labels "
                         "must be 0..C-1 (a -1 stored as unsigned?)")
    if num_classes is None:
        num_classes = int(y.max()) + 1 if n else 0
        check_num_classes(num_classes, n, "num_classes (largest label + 1)")
    w = None
    if edge_weight is not None:
        w = np.asarray(edge_weight)
        if w.shape != (ei.shape[1],) or not np.issubdtype(w.dtype, np.floating):
            raise InputError(f"edge_weight must be a float array of shape ({ei.shape[1]},), got {w.dtype} {w.shape}")
    src, dst = ei[0].astype(np.int64), ei[1].astype(np.int64)
    if not directed and w is None:  # one sort instead of build-then-symmetrize's two
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    indptr, indices, w = Graph.csr_from_edges(src, dst, n, w)
    g = Graph(indptr, indices, x.astype(np.float32, copy=False), y.astype(np.int64, copy=False),
              train, val, test, int(num_classes), edge_weight=w, name=name, meta=dict(meta or {}))
    if not directed and w is not None:
        g = g.symmetrize()
    g.meta["directed"] = bool(directed)
    return g.validate()


# ---------------------------------------------------------------- npz
_NPZ_ERRORS = (ValueError, OSError, zlib.error, EOFError, zipfile.BadZipFile, KeyError,
               NotImplementedError, RuntimeError)


def npz_headers(path: str) -> Dict[str, Tuple[tuple, np.dtype, int]]:
    """``key -> (shape, dtype, nbytes)`` of every array in an ``.npz``, read from the ``.npy``
    headers alone (nothing is loaded). Raises :class:`InputError` when the file is no zip of
    ``.npy`` arrays, holds pickled objects, or a header claims more data than its member holds
    (a damaged file: loading it would allocate what the header claims)."""
    def bad(why: str) -> InputError:
        return InputError(f"cannot read {path} as .npz: {why}")
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as exc:
        raise bad(str(exc)) from None
    if magic.startswith(b"\x93NUMPY"):
        raise bad("it is a single .npy array (np.save); an npz graph is np.savez's zip of arrays")
    if not magic.startswith(b"PK"):
        raise bad("it is not a zip archive (an npz graph is np.savez's zip of .npy arrays)")
    out = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                key = info.filename[:-len(".npy")]
                with zf.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                    else:  # a newer format: np.load judges it
                        continue
                    header = member.tell()
                if dtype.hasobject:
                    raise bad(f"'{key}' holds Python objects (pickled data); only numeric arrays "
                              "are read")
                nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
                held = max(info.file_size - header, 0)
                if nbytes > held:
                    raise bad(f"the header of '{key}' claims shape {tuple(shape)} {dtype} "
                              f"({format_bytes(nbytes)}) but the file holds {format_bytes(held)} "
                              "of it: the file is damaged")
                out[key] = (tuple(int(d) for d in shape), dtype, nbytes)
    except InputError:
        raise
    except _NPZ_ERRORS as exc:
        raise bad(f"the zip archive is damaged or truncated ({exc})"
                  if isinstance(exc, (zipfile.BadZipFile, EOFError, zlib.error)) else str(exc)) from None
    return out


def load_npz_arrays(path: str, keys: Sequence[str], optional: Sequence[str] = (),
                    extra_bytes=None, what: Optional[str] = None,
                    heads=None) -> Dict[str, np.ndarray]:
    """Load ``keys`` (all required) and ``optional`` arrays of an ``.npz`` after checking, from
    the headers alone (``heads``: :func:`npz_headers`, read here when not given), that they
    exist and that their bytes plus ``extra_bytes(heads)`` (what building the graph from them
    needs) fit :func:`gnnpar.datasets.graph.check_memory`."""
    heads = npz_headers(path) if heads is None else heads
    missing = [k for k in keys if k not in heads]
    if missing:
        raise InputError(f"{path} is missing key '{missing[0]}' (it needs {', '.join(keys)})")
    wanted = [k for k in list(keys) + list(optional) if k in heads]
    need = sum(heads[k][2] for k in wanted) + (extra_bytes(heads) if extra_bytes else 0)
    check_memory(need, what or path)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in wanted}
    except _NPZ_ERRORS as exc:
        why = (f"the zip archive is damaged or truncated ({exc})"
               if isinstance(exc, (zipfile.BadZipFile, EOFError, zlib.error)) else str(exc))
        raise InputError(f"cannot read {path} as .npz: {why}") from None


def _npz_graph_bytes(directed: bool):
    """Bytes building a graph from npz arrays needs beyond the arrays: the int64 edge ends
    (both directions unless ``directed``) sorted into a CSR (~48 bytes an edge and
    direction), and a float32 copy of ``x`` when it is stored otherwise."""
    def extra(heads) -> int:
        shape = heads["edge_index"][0]
        edges = shape[1] if len(shape) == 2 else 0
        x_shape, x_dtype, _ = heads["x"]
        x_copy = 0 if x_dtype == np.float32 else 4 * math.prod(x_shape)
        return 48 * edges * (1 if directed else 2) + x_copy
    return extra


def _shape_words(heads) -> str:
    x = heads.get("x", ((0, 0),))[0]
    e = heads.get("edge_index", ((0, 0),))[0]
    n = x[0] if x else 0
    f = x[1] if len(x) > 1 else 0
    m = e[1] if len(e) > 1 else 0
    return f"{n:,} nodes, {m:,} edges, {f:,} features"


def read_npz(path: str, directed: bool = False) -> Graph:
    """Read a graph from one ``.npz`` file.

    Keys: ``edge_index`` (2, E) int, ``x`` (N, F) float, ``y`` (N,) int, ``train_mask``,
    ``val_mask``, ``test_mask`` (N,) bool. Optional: ``edge_weight`` (E,) float and
    ``num_classes`` (scalar int; default ``y.max() + 1``). Any other key is ignored.
    The array headers are read first: a file whose arrays (and the graph built from them)
    would not fit the memory limit is refused before anything is loaded.
    """
    if not os.path.isfile(path):
        raise InputError(f"npz file not found: {path}")
    heads = npz_headers(path)
    missing = [k for k in NPZ_KEYS if k not in heads]
    if missing:
        raise InputError(f"{path} is missing key '{missing[0]}' (an npz graph needs {', '.join(NPZ_KEYS)})")
    arrays = load_npz_arrays(path, NPZ_KEYS, ("edge_weight", "num_classes"),
                             _npz_graph_bytes(directed), f"{path} ({_shape_words(heads)})",
                             heads)
    num_classes = arrays.get("num_classes")
    if num_classes is not None:
        if num_classes.shape != () or not np.issubdtype(num_classes.dtype, np.integer):
            raise InputError(f"{path}: num_classes must be a scalar integer, "
                             f"got {num_classes.dtype} {num_classes.shape}")
        num_classes = int(num_classes)
    name = os.path.splitext(os.path.basename(path))[0]
    try:
        return graph_from_arrays(arrays["edge_index"], arrays["x"], arrays["y"],
                                 [arrays[k] for k in _MASKS], num_classes, directed=directed,
                                 edge_weight=arrays.get("edge_weight"), name=name,
                                 meta={"source": os.path.abspath(path)})
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


# ---------------------------------------------------------------- OGB
def _bad_line(lines, dtype, ncols: int, first_line: int):
    """Line number and text of the first line that does not hold ``ncols`` numbers of ``dtype``."""
    parse = int if np.issubdtype(dtype, np.integer) else float
    for i, line in enumerate(lines):
        fields = line.split(b",")
        try:
            ok = len(fields) == ncols and [parse(f) for f in fields] is not None
        except ValueError:
            ok = False
        if not ok:
            return first_line + i, line.decode(errors="replace")[:60]
    return first_line, "?"  # pragma: no cover - np.fromstring and Python agree on what parses


def read_csv_gz(path: str, dtype, block: int = 1 << 24, held: int = 0,
                row_bytes: int = 0) -> np.ndarray:
    """Parse a gzip'd comma-separated numeric table into a (rows, cols) array.

    Decompresses ``block`` bytes at a time and parses whole lines with ``np.fromstring``, so
    memory stays near one block plus the result. Every line must have the same number of
    fields; the first bad line is reported with its number.

    A small file may inflate to far more than the memory it is allowed (a 2 MB file to
    2 GiB of text): after every block, what the read holds so far — the rows parsed (twice:
    the pieces and their concatenation), the unfinished line, the block's copies — plus
    ``held`` (bytes the caller already holds) and ``row_bytes`` a row (what the caller will
    build from each row) is judged by :func:`check_memory`, and the read is refused (exit 2,
    naming the file and how far it inflated) as soon as it is over the limit.
    """
    if not os.path.isfile(path):
        raise InputError(f"file not found: {path}")
    parts, ncols, lines_done, tail, parsed, inflated = [], None, 0, b"", 0, 0
    try:
        with gzip.open(path, "rb") as f:
            while True:
                chunk = f.read(block)
                inflated += len(chunk)
                check_memory(held + 2 * parsed + lines_done * row_bytes + 2 * len(tail)
                             + 4 * len(chunk),
                             f"{path} (inflated to {format_bytes(inflated)} so far, "
                             f"{lines_done:,} rows)")
                data = tail + chunk
                if chunk:
                    cut = data.rfind(b"\n") + 1
                    data, tail = data[:cut], data[cut:]
                data = data.replace(b"\r", b"").rstrip(b"\n")
                if data:
                    if ncols is None:
                        ncols = data[: data.find(b"\n") if b"\n" in data else len(data)].count(b",") + 1
                    nlines = data.count(b"\n") + 1
                    try:
                        vals = np.fromstring(data.replace(b"\n", b","), dtype=dtype, sep=",")
                    except ValueError:
                        vals = None
                    if vals is None or vals.size != nlines * ncols:
                        no, text = _bad_line(data.split(b"\n"), dtype, ncols, lines_done + 1)
                        raise InputError(f"{path} line {no}: expected {ncols} comma-separated "
                                         f"{np.dtype(dtype).name} value(s), got '{text}'")
                    parts.append(vals.reshape(nlines, ncols))
                    lines_done += nlines
                    parsed += vals.nbytes
                if not chunk:
                    break
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"cannot decompress {path}: {exc}") from None
    if not parts:
        return np.zeros((0, ncols or 0), dtype=dtype)
    return np.concatenate(parts)


def _pick_split(root: str, split: Optional[str]) -> str:
    base = os.path.join(root, "split")
    found = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))) if os.path.isdir(base) else []
    if split is not None:
        if split not in found:
            raise InputError(f"split '{split}' not found under {base} (found: {', '.join(found) or 'none'})")
        return os.path.join(base, split)
    if not found:
        raise InputError(f"no split folder under {base} (expected split/<name>/train.csv.gz, ...)")
    if len(found) > 1:
        raise InputError(f"several splits under {base} ({', '.join(found)}): choose one with split=NAME")
    return os.path.join(base, found[0])


def _ogb_raw_csv(raw: str, directed: bool = False):
    """(edge_index (2, E), x (N, F), labels float64 (N,) with NaN = unlabelled) from the CSV
    layout. Each file is read within the memory limit, counting what is already held and
    what the graph will be built of: an edge row becomes a (2, E) copy and the CSR's sorted
    int64 ends (:func:`_npz_graph_bytes`), a label row the int64 labels and three masks."""
    for fname in ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz"):
        if not os.path.isfile(os.path.join(raw, fname)):
            raise InputError(f"{raw} has no {fname} (nor data.npz)")
    x = read_csv_gz(os.path.join(raw, "node-feat.csv.gz"), np.float32)
    count_file = os.path.join(raw, "num-node-list.csv.gz")
    if os.path.isfile(count_file):
        _check_node_count(read_csv_gz(count_file, np.int64, held=x.nbytes), count_file,
                          x.shape[0])
    edges = read_csv_gz(os.path.join(raw, "edge.csv.gz"), np.int64, held=x.nbytes,
                        row_bytes=16 + 48 * (1 if directed else 2))
    if edges.size and edges.shape[1] != 2:
        raise InputError(f"{raw}/edge.csv.gz must have 2 columns (src,dst), got {edges.shape[1]}")
    labels = read_csv_gz(os.path.join(raw, "node-label.csv.gz"), np.float64,
                         held=x.nbytes + 2 * edges.nbytes, row_bytes=8 + 3)
    return edges.T.reshape(2, -1), x, labels, "node-label.csv.gz"


def _ogb_raw_npz(raw: str):
    """The same from the binary layout of the largest sets (``data.npz`` + ``node-label.npz``)."""
    arrays = {}
    for fname, keys in (("data.npz", ("edge_index", "node_feat", "num_nodes_list")),
                        ("node-label.npz", ("node_label",))):
        path = os.path.join(raw, fname)
        if not os.path.isfile(path):
            raise InputError(f"{raw} has data.npz but no {fname}")
        arrays.update(load_npz_arrays(path, keys, extra_bytes=_ogb_bytes(fname)))
    x = arrays["node_feat"]
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.floating):
        raise InputError(f"{raw}/data.npz: node_feat must be a 2-D float array, got {x.dtype} {x.shape}")
    _check_node_count(arrays["num_nodes_list"], f"{raw}/data.npz num_nodes_list", x.shape[0])
    labels = arrays["node_label"]
    if not np.issubdtype(labels.dtype, np.number):
        raise InputError(f"{raw}/node-label.npz: node_label must be numeric, got {labels.dtype}")
    return arrays["edge_index"], x, labels.astype(np.float64), "node-label.npz"


def _ogb_bytes(fname: str):
    """What building the graph from ``data.npz`` needs beyond its arrays (see
    :func:`_npz_graph_bytes`; OGB keeps features as float32 and labels as float)."""
    if fname != "data.npz":
        return None
    return lambda heads: _npz_graph_bytes(False)({"x": heads["node_feat"], **heads})


def _check_node_count(counts: np.ndarray, where: str, n: int) -> None:
    counts = np.asarray(counts).ravel()
    if counts.size != 1:
        raise InputError(f"{where} must hold one node count (a single graph), got {counts.size} values")
    if int(counts[0]) != n:
        raise InputError(f"{where} says {int(counts[0])} nodes but the features have {n} rows")


def read_ogb(root: str, directed: bool = False, split: Optional[str] = None) -> Graph:
    """Read an OGB node-property dataset folder as OGB's downloader unpacks it (no ogb package).

    CSV layout: ``raw/edge.csv.gz`` ("src,dst" per line), ``raw/node-feat.csv.gz`` (N rows of F
    floats), ``raw/node-label.csv.gz`` (one label per line) and, optionally,
    ``raw/num-node-list.csv.gz`` (the node count, checked against the feature rows). Binary
    layout (ogbn-papers100M): ``raw/data.npz`` (``edge_index`` (2, E), ``node_feat`` (N, F),
    ``num_nodes_list``) and ``raw/node-label.npz`` (``node_label`` (N, 1)); used when
    ``raw/data.npz`` exists. Splits: ``split/<name>/{train,valid,test}.csv.gz`` (node ids, one
    per line); ``split`` names the subfolder and may be omitted when there is exactly one.

    Unlabelled nodes (label NaN, as in ogbn-papers100M) get label 0 and are left out of all
    three masks, even if a split file lists them; ``meta['unlabelled']`` counts them.
    OGB's edge files are directed (e.g. arxiv: "src cites dst"); the default symmetrises.
    """
    if not os.path.isdir(root):
        raise InputError(f"OGB dataset folder not found: {root}")
    raw = os.path.join(root, "raw")
    if not os.path.isdir(raw):
        raise InputError(f"OGB folder {root} has no raw/ subfolder")
    split_dir = _pick_split(root, split)
    for part in ("train", "valid", "test"):
        if not os.path.isfile(os.path.join(split_dir, f"{part}.csv.gz")):
            raise InputError(f"OGB split folder {split_dir} has no {part}.csv.gz")
    binary = os.path.isfile(os.path.join(raw, "data.npz"))
    edge_index, x, labels, label_file = (_ogb_raw_npz(raw) if binary
                                         else _ogb_raw_csv(raw, directed))
    n = x.shape[0]
    if labels.ndim == 2 and labels.shape[1] != 1:
        raise InputError(f"{raw}/{label_file} has {labels.shape[1]} columns: multi-label tasks are not supported")
    labels = labels.reshape(-1)
    if labels.shape[0] != n:
        raise InputError(f"{raw}/{label_file} has {labels.shape[0]} labels but the features have {n} rows")
    unlabelled = np.isnan(labels)
    known = labels[~unlabelled]
    if not np.all(np.isfinite(known)) or np.any(known != np.round(known)):
        raise InputError(f"{raw}/{label_file} holds a label that is neither an integer nor NaN")
    y = np.where(unlabelled, 0, labels).astype(np.int64)
    num_classes = int(known.max()) + 1 if known.size else 1

    masks = []
    for part in ("train", "valid", "test"):
        fname = os.path.join(split_dir, f"{part}.csv.gz")
        ids = read_csv_gz(fname, np.int64).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise InputError(f"{fname}: node id {bad} is out of range [0, {n})")
        mask = np.zeros(n, dtype=bool)
        mask[ids] = True
        masks.append(mask & ~unlabelled)
    name = os.path.basename(os.path.normpath(root))
    try:
        return graph_from_arrays(edge_index, x, y, masks, num_classes, directed=directed, name=name,
                                 meta={"source": os.path.abspath(root), "split": os.path.basename(split_dir),
                                       "unlabelled": int(unlabelled.sum())})
    except InputError as exc:
        raise InputError(f"OGB folder {root}: {exc}") from None
