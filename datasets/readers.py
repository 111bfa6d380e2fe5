"""On-disk readers: user arrays, a plain ``.npz`` file, and (re-exported from :mod:`.ogb`) an
OGB node-property folder (without the ogb package).

Edge lists are read as (source, target) pairs; in the CSR the target's row holds the source
(the target aggregates from the source, PyG's ``source_to_target`` flow). Undirected reading
(the default) adds the reverse of every edge; ``directed=True`` keeps the edges as given.
Duplicate edges are merged; self loops present in the file are kept (nothing is added or
removed behind the user's back). Every reader returns a validated :class:`Graph` or raises
:class:`InputError` with one line naming the file and what is wrong.

:func:`write_npz` streams an ``.npz`` into an output (:mod:`.ingest`, e.g. a cache folder):
edges and features straight from the zip members a block at a time; :func:`read_npz` runs
the same code into memory.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Optional

import numpy as np

from .csr_stream import csr_bytes
from .errors import InputError
from .file_stream import (BLOCK_BYTES, iter_csv_gz, iter_npz_edges, iter_npz_rows, load_npz_arrays,
                          npz_headers, read_csv_gz)
from .graph import Graph
from .ingest import MemoryWriter, checked_edges, feature_block_bytes, write_edges, write_features
from .limits import check_memory, check_num_classes
from .ogb import read_ogb, write_ogb

__all__ = ["NPZ_KEYS", "graph_from_arrays", "read_npz", "write_npz", "read_ogb", "write_ogb",
           "iter_csv_gz", "read_csv_gz", "npz_headers", "load_npz_arrays"]

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


def _node_arrays(y, masks, n: int, num_classes: Optional[int]):
    """Checked ``(y int64 (n,), [train, val, test] bool, num_classes)``; ``y`` may be (n, 1)
    and masks 0/1 integers; ``num_classes`` None means ``y.max() + 1``."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.shape != (n,):
        raise InputError(f"y must have shape (N={n},) like x's rows, got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"y must be an integer array, got {y.dtype}")
    if len(masks) != 3:
        raise InputError(f"need 3 masks (train, val, test), got {len(masks)}")
    masks = [_as_mask(m, k, n) for m, k in zip(masks, _MASKS)]
    if n and np.issubdtype(y.dtype, np.unsignedinteger) and int(y.max()) > np.iinfo(np.int64).max:
        raise InputError(f"y holds label {int(y.max())} ({y.dtype}), which is no class id: labels "
                         "must be 0..C-1 (a -1 stored as unsigned?)")
    if num_classes is None:
        num_classes = int(y.max()) + 1 if n else 0
        check_num_classes(num_classes, n, "num_classes (largest label + 1)")
    return y.astype(np.int64, copy=False), masks, num_classes


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
    y, (train, val, test), num_classes = _node_arrays(y, masks, n, num_classes)
    w = None
    if edge_weight is not None:
        w = np.asarray(edge_weight)
        if w.shape != (ei.shape[1],) or not np.issubdtype(w.dtype, np.floating):
            raise InputError(f"edge_weight must be a float array of shape ({ei.shape[1]},), "
                             f"got {w.dtype} {w.shape}")
    src, dst = ei[0].astype(np.int64), ei[1].astype(np.int64)
    if not directed and w is None:  # one sort instead of build-then-symmetrize's two
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    indptr, indices, w = Graph.csr_from_edges(src, dst, n, w)
    g = Graph(indptr, indices, x.astype(np.float32, copy=False), y,
              train, val, test, int(num_classes), edge_weight=w, name=name, meta=dict(meta or {}))
    if not directed and w is not None:
        g = g.symmetrize()
    g.meta["directed"] = bool(directed)
    return g.validate()


# ---------------------------------------------------------------- npz
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


def _num_classes(arrays, path: str) -> Optional[int]:
    num_classes = arrays.get("num_classes")
    if num_classes is None:
        return None
    if num_classes.shape != () or not np.issubdtype(num_classes.dtype, np.integer):
        raise InputError(f"{path}: num_classes must be a scalar integer, "
                         f"got {num_classes.dtype} {num_classes.shape}")
    return int(num_classes)


def _npz_in_memory(out, path: str, heads, directed: bool) -> None:
    """An npz with edge weights (a pair's weights are merged across directions): built in
    memory by :func:`graph_from_arrays`, then stored whole into ``out``."""
    arrays = load_npz_arrays(path, NPZ_KEYS, ("edge_weight", "num_classes"),
                             _npz_graph_bytes(directed), f"{path} ({_shape_words(heads)})",
                             heads)
    try:
        g = graph_from_arrays(arrays["edge_index"], arrays["x"], arrays["y"],
                              [arrays[k] for k in _MASKS], _num_classes(arrays, path),
                              directed=directed, edge_weight=arrays.get("edge_weight"))
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    for name in ("indptr", "indices", "edge_weight", "x", "y") + _MASKS:
        out.write(name, getattr(g, name))
    out.num_classes = g.num_classes


def write_npz(out, path: str, directed: bool = False,
              progress: Optional[Callable[[str], None]] = None) -> None:
    """An ``.npz`` graph written into ``out`` (:mod:`.ingest`); see :func:`read_npz` for the
    keys. Edges and features are read a block at a time from the zip, the rest whole; a file
    with ``edge_weight`` is built in memory. The caller finishes ``out`` (validating it)."""
    if not os.path.isfile(path):
        raise InputError(f"npz file not found: {path}")
    heads = npz_headers(path)
    missing = [k for k in NPZ_KEYS if k not in heads]
    if missing:
        raise InputError(f"{path} is missing key '{missing[0]}' "
                         f"(an npz graph needs {', '.join(NPZ_KEYS)})")
    out.name = os.path.splitext(os.path.basename(path))[0]
    out.meta = {"source": os.path.abspath(path), "directed": bool(directed)}
    if "edge_weight" in heads:
        return _npz_in_memory(out, path, heads, directed)
    (e_shape, e_dtype, _), (x_shape, x_dtype, _) = heads["edge_index"], heads["x"]
    if len(e_shape) != 2 or e_shape[0] != 2:
        raise InputError(f"{path}: edge_index must have shape (2, E), got {e_shape}")
    if not np.issubdtype(e_dtype, np.integer):
        raise InputError(f"{path}: edge_index must be an integer array, got {e_dtype}")
    if len(x_shape) != 2:
        raise InputError(f"{path}: x must have shape (N, F), got {x_shape}")
    if not np.issubdtype(x_dtype, np.floating):
        raise InputError(f"{path}: x must be a float array, got {x_dtype}")
    n, f, edges = x_shape[0], x_shape[1], e_shape[1]
    dirs = 1 if directed else 2
    small = sum(heads[k][2] for k in ("y",) + _MASKS)
    check_memory(csr_bytes(dirs * edges, n, out.holds_arrays) + small
                 + (4 * n * f if out.holds_arrays else 0)
                 + feature_block_bytes(heads["x"][2], x_dtype.itemsize, BLOCK_BYTES),
                 f"{path} ({_shape_words(heads)})")
    small = load_npz_arrays(path, ("y",) + _MASKS, ("num_classes",), heads=heads)
    try:
        y, masks, num_classes = _node_arrays(small["y"], [small[k] for k in _MASKS], n,
                                             _num_classes(small, path))
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    write_edges(out, checked_edges(iter_npz_edges(path, "edge_index"), n,
                                   lambda first, i: f"{path}: edge_index column {first + i}"),
                n, directed, progress)
    write_features(out, iter_npz_rows(path, "x", scratch=out.scratch("npz-x")), n, path)
    out.write("y", y)
    for name, mask in zip(_MASKS, masks):
        out.write(name, mask)
    out.num_classes = int(num_classes)


def read_npz(path: str, directed: bool = False,
             progress: Optional[Callable[[str], None]] = None) -> Graph:
    """Read a graph from one ``.npz`` file.

    Keys: ``edge_index`` (2, E) int, ``x`` (N, F) float, ``y`` (N,) int, ``train_mask``,
    ``val_mask``, ``test_mask`` (N,) bool. Optional: ``edge_weight`` (E,) float and
    ``num_classes`` (scalar int; default ``y.max() + 1``). Any other key is ignored.
    The array headers are read first: a file whose arrays (and the graph built from them)
    would not fit the memory limit is refused before anything is loaded.
    """
    with MemoryWriter() as out:
        write_npz(out, path, directed, progress)
        return out.finish(validate=True, where=path)


