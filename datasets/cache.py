"""Binary graph cache: one ``.npy`` file per array plus ``meta.json``, loadable as memory maps.

Layout of a cache folder::

    meta.json       {"format": "gnnpar-graph-cache", "version": 1, "name", "num_classes",
                     "fingerprint", "arrays": {name: {"dtype", "shape"}}, "meta": {...}}
    indptr.npy  indices.npy  [edge_weight.npy]  x.npy  y.npy
    train_mask.npy  val_mask.npy  test_mask.npy

A cache is written into a temporary sibling folder and renamed into place, so readers (other
ranks loading the same dataset at the same time) see either no cache or a complete one.
Loading with ``mmap=True`` maps the files read-only: n × f features cost no memory until
touched, and several processes on one host share the page cache.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Optional

import numpy as np

from .errors import InputError
from .graph import Graph

FORMAT = "gnnpar-graph-cache"
VERSION = 1
ARRAYS = ("indptr", "indices", "edge_weight", "x", "y", "train_mask", "val_mask", "test_mask")


def _write_npy(path: str, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _read_meta(folder: str) -> dict:
    path = os.path.join(folder, "meta.json")
    if not os.path.isdir(folder):
        raise InputError(f"cache folder not found: {folder}")
    if not os.path.isfile(path):
        raise InputError(f"{folder} is not a gnnpar cache (no meta.json)")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise InputError(f"corrupt cache {folder}: meta.json unreadable ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"{folder} is not a gnnpar cache (meta.json has no format '{FORMAT}')")
    if meta.get("version") != VERSION:
        raise InputError(f"cache {folder} has format version {meta.get('version')!r}; this gnnpar reads "
                         f"version {VERSION}: delete the folder to rebuild it")
    return meta


def _looks_like_cache(folder: str) -> bool:
    """True if meta.json names our format (any version, so stale caches can be replaced)."""
    try:
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def save_cache(graph: Graph, folder: str, extra: Optional[dict] = None) -> str:
    """Write ``graph`` as a cache folder atomically; returns the folder path.

    ``extra`` is stored in meta.json (e.g. the spec the graph came from). An existing cache at
    ``folder`` is replaced; an existing folder that is not a cache (nor empty) is refused, so a
    mistyped path never deletes user files.
    """
    folder = os.path.abspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise InputError(f"cannot write cache to {folder}: it is a file")
    if os.path.isdir(folder) and os.listdir(folder) and not _looks_like_cache(folder):
        raise InputError(f"refusing to overwrite {folder}: it exists and is not a gnnpar cache")
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.tmp-", dir=parent)
    try:
        arrays = {}
        for name in ARRAYS:
            arr = getattr(graph, name)
            if arr is None:
                continue
            arr = np.asarray(arr)
            _write_npy(os.path.join(tmp, f"{name}.npy"), arr)
            arrays[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape)}
        meta = {"format": FORMAT, "version": VERSION, "name": graph.name,
                "num_classes": int(graph.num_classes), "fingerprint": graph.fingerprint(),
                "arrays": arrays, "meta": graph.meta, "extra": extra or {}}
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, default=str)  # meta may hold numpy scalars: store as text
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a cache is meant to be shared
        _swap_in(tmp, folder)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _swap_in(tmp: str, folder: str) -> None:
    """Rename ``tmp`` to ``folder``; an old cache there is moved aside first and then deleted."""
    try:
        os.rename(tmp, folder)  # atomic; succeeds when folder is absent or an empty directory
        return
    except OSError:
        if not os.path.isdir(folder):
            raise
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.old-", dir=os.path.dirname(folder))
    os.rmdir(old)
    os.rename(folder, old)
    os.rename(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def load_cache(folder: str, mmap: bool = True, verify: bool = False) -> Graph:
    """Load a cache folder written by :func:`save_cache`.

    With ``mmap`` every array is ``np.load(..., mmap_mode='r')`` (read-only memory maps);
    otherwise it is read into memory. Array files are checked against meta.json's dtypes and
    shapes (a truncated or swapped file is refused); ``verify`` also recomputes the content
    fingerprint (reads everything). Raises :class:`InputError` for a missing, corrupt or
    wrong-version cache.
    """
    meta = _read_meta(folder)
    try:
        specs = meta["arrays"]
        num_classes = int(meta["num_classes"])
        name = str(meta["name"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"corrupt cache {folder}: meta.json lacks {exc}") from None
    loaded = {}
    for key in ARRAYS:
        if key not in specs:
            if key == "edge_weight":
                loaded[key] = None
                continue
            raise InputError(f"corrupt cache {folder}: meta.json lists no array '{key}'")
        path = os.path.join(folder, f"{key}.npy")
        if not os.path.isfile(path):
            raise InputError(f"corrupt cache {folder}: {key}.npy is missing")
        try:
            arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(f"corrupt cache {folder}: cannot read {key}.npy ({exc})") from None
        want = specs[key]
        if arr.dtype.str != want.get("dtype") or list(arr.shape) != want.get("shape"):
            raise InputError(f"corrupt cache {folder}: {key}.npy is {arr.dtype.str} {list(arr.shape)}, "
                             f"meta.json says {want.get('dtype')} {want.get('shape')}")
        loaded[key] = arr
    graph = Graph(num_classes=num_classes, name=name, meta=dict(meta.get("meta") or {}), **loaded)
    if verify and graph.fingerprint() != meta.get("fingerprint"):
        raise InputError(f"corrupt cache {folder}: content fingerprint differs from meta.json")
    return graph
