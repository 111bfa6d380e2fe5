"""Binary graph cache: one ``.npy`` file per array plus ``meta.json``, loadable as memory maps.

Layout of a cache folder::

    meta.json       {"format": "gnnpar-graph-cache", "version": 1, "name", "num_classes",
                     "fingerprint", "arrays": {name: {"dtype", "shape"}}, "meta": {...}}
    indptr.npy  indices.npy  [edge_weight.npy]  x.npy  y.npy
    train_mask.npy  val_mask.npy  test_mask.npy

A cache is written into a temporary sibling folder and renamed into place, so readers (other
ranks loading the same dataset at the same time) see either no cache or a complete one.
:class:`CacheWriter` writes it array by array, whole or in blocks of rows, hashing the bytes
as they go, so a graph larger than memory can be cached; :func:`save_cache` stores a
:class:`Graph` through it.
Loading with ``mmap=True`` maps the files read-only: n × f features cost no memory until
touched, and several processes on one host share the page cache.
"""
from __future__ import annotations

import hashlib
import json
import mmap
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
#: bytes handed to one write or hash call: bounds the temporaries of a streamed array
_BLOCK_BYTES = 1 << 26


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
        raise InputError(f"cache {folder} has format version {meta.get('version')!r}; "
                         f"this gnnpar reads version {VERSION}: delete the folder to rebuild it")
    return meta


def _looks_like_cache(folder: str) -> bool:
    """True if meta.json names our format (any version, so stale caches can be replaced)."""
    try:
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def _shape_text(dtype, shape) -> bytes:
    """What :meth:`Graph.fingerprint` hashes before an array's bytes."""
    return str((np.dtype(dtype).str, tuple(int(s) for s in shape))).encode()


def _npy_header(f, dtype: np.dtype, shape: tuple) -> None:
    """The header ``np.save`` writes. numpy pads it so that the first axis may grow to 21
    digits in place: a header rewritten with the final row count keeps its length."""
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                             "fortran_order": False, "shape": tuple(shape)})


class NpyStream:
    """One ``.npy`` file written a block of rows at a time (:meth:`CacheWriter.open`).

    ``shape[0]`` may be None when the row count is known only at the end (a text file read
    line by line): the header is rewritten with the rows appended when the stream closes.
    """

    def __init__(self, path: str, dtype, shape, on_bytes=None):
        self.path, self.dtype = path, np.dtype(dtype)
        self.rows, self.tail = shape[0], tuple(int(s) for s in shape[1:])
        self.written, self._on_bytes = 0, on_bytes
        self._f = open(path, "wb")
        _npy_header(self._f, self.dtype, (self.rows or 0,) + self.tail)
        self._data_start = self._f.tell()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def append(self, block) -> None:
        """Write the next rows; ``block`` must have this stream's dtype and trailing shape."""
        block = np.ascontiguousarray(block)
        if block.dtype != self.dtype or block.ndim != 1 + len(self.tail) or \
                tuple(block.shape[1:]) != self.tail:
            raise ValueError(f"{self.path}: block {block.dtype} {block.shape} does not fit "
                             f"{self.dtype} (rows,) + {self.tail}")
        if self.rows is not None and self.written + block.shape[0] > self.rows:
            raise ValueError(f"{self.path}: more than the {self.rows} rows announced")
        data = memoryview(block).cast("B") if block.size else b""
        self._f.write(data)
        if self._on_bytes is not None:
            self._on_bytes(data)
        self.written += block.shape[0]

    def close(self) -> tuple:
        """Finish the file (rewrite the header when the rows were unknown, fsync); returns
        the final shape."""
        if self._f.closed:
            return (self.written,) + self.tail
        try:
            if self.rows is None:
                self._f.seek(0)
                _npy_header(self._f, self.dtype, (self.written,) + self.tail)
                if self._f.tell() != self._data_start:  # pragma: no cover - numpy pads the header
                    raise RuntimeError(f"{self.path}: the .npy header changed length")
                self._f.seek(0, os.SEEK_END)
            elif self.written != self.rows:
                raise ValueError(f"{self.path}: {self.written} rows written, {self.rows} announced")
            self._f.flush()
            os.fsync(self._f.fileno())
        finally:
            self._f.close()
        return (self.written,) + self.tail


def _hash_file(h, path: str) -> None:
    """Feed ``h`` what :meth:`Graph.fingerprint` feeds it for the array in the .npy file."""
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        h.update(_shape_text(dtype, shape))
        while True:
            data = f.read(_BLOCK_BYTES)
            if not data:
                break
            h.update(data)


class CacheWriter:
    """Writes a cache folder array by array, whole or in row blocks, and swaps it in atomically.

    Use as a context manager: the arrays go to a temporary sibling folder, which
    :meth:`finish` completes (meta.json with the content fingerprint, optional validation)
    and renames into place. Leaving the ``with`` block without :meth:`finish` (an error
    midway) deletes the temporary folder, so no half-written cache ever looks valid.
    Set ``name``, ``num_classes`` and ``meta`` before :meth:`finish`.

    The fingerprint equals :meth:`Graph.fingerprint` of the cached graph. It is computed while
    the bytes are written when the arrays come in the order of :data:`ARRAYS` with known
    shapes; otherwise :meth:`finish` reads the files back once to compute it.
    ``keep_existing``: when a valid cache appeared at ``folder`` meanwhile (another process
    building the same graph), keep it and drop this one.
    """

    holds_arrays = False  # the arrays go to disk, not memory (for memory estimates)

    def __init__(self, folder: str, extra: Optional[dict] = None, keep_existing: bool = False):
        self.folder = os.path.abspath(folder)
        self.extra, self.keep_existing = dict(extra or {}), keep_existing
        self.name, self.num_classes, self.meta = "graph", None, {}
        self.tmp = None
        self._specs, self._streams, self._scratch = {}, [], []
        self._hash, self._next = hashlib.sha256(), 0

    def __enter__(self) -> "CacheWriter":
        folder = self.folder
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise InputError(f"cannot write cache to {folder}: it is a file")
        if os.path.isdir(folder) and os.listdir(folder) and not _looks_like_cache(folder):
            raise InputError(f"refusing to overwrite {folder}: it exists and is not a gnnpar cache")
        parent = os.path.dirname(folder)
        os.makedirs(parent, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.tmp-", dir=parent)
        return self

    def __exit__(self, *exc) -> None:
        for s in self._streams:
            if not s.closed:
                try:
                    s.close()
                except (OSError, ValueError):
                    pass
        if self.tmp is not None and os.path.isdir(self.tmp):
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ---------------------------------------------------------------- arrays
    def scratch(self, name: str) -> str:
        """A path inside the temporary folder for the caller's own spill files (deleted before
        the folder is swapped in)."""
        path = os.path.join(self.tmp, f"scratch-{name}")
        self._scratch.append(path)
        return path

    def _hashed_in_order(self, name: str, dtype, shape) -> bool:
        """Advance the running fingerprint to ``name`` if it comes next; False once it cannot."""
        if self._next is None:
            return False
        want = ARRAYS.index(name)
        skipped = ARRAYS[self._next:want]
        if want < self._next or any(k != "edge_weight" for k in skipped) or shape[0] is None or \
                any(not s.closed for s in self._streams):
            self._next = None  # out of order: finish() reads the files back
            return False
        for _ in skipped:
            self._hash.update(b"none")
        self._hash.update(_shape_text(dtype, shape))
        self._next = want + 1
        return True

    def open(self, name: str, dtype, shape) -> NpyStream:
        """Start array ``name`` (one of :data:`ARRAYS`) to be written in row blocks with
        :meth:`NpyStream.append`, then closed; ``shape[0]`` None: rows counted as appended."""
        if name not in ARRAYS or name in self._specs:
            raise ValueError(f"cache array '{name}' is unknown or written twice")
        shape = tuple(shape)
        in_order = self._hashed_in_order(name, dtype, shape)
        stream = NpyStream(os.path.join(self.tmp, f"{name}.npy"), dtype, shape,
                           self._hash.update if in_order else None)
        self._streams.append(stream)
        self._specs[name] = stream
        return stream

    def write(self, name: str, arr) -> None:
        """Write a whole array (in blocks of rows, so a memory map is never copied whole)."""
        arr = np.asarray(arr) if not isinstance(arr, np.ndarray) else arr
        stream = self.open(name, arr.dtype, arr.shape)
        row = max(1, arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64)))
        step = max(1, _BLOCK_BYTES // row)
        for start in range(0, arr.shape[0], step):
            stream.append(arr[start:start + step])
        stream.close()

    # ---------------------------------------------------------------- completion
    def _fingerprint(self) -> str:
        if self._next is not None:
            h = self._hash
            for name in ARRAYS[self._next:]:
                if name != "edge_weight":
                    raise ValueError(f"cache array '{name}' was not written")
                h.update(b"none")
        else:
            h = hashlib.sha256()
            for name in ARRAYS:
                if name in self._specs:
                    _hash_file(h, self._specs[name].path)
                elif name == "edge_weight":
                    h.update(b"none")
                else:
                    raise ValueError(f"cache array '{name}' was not written")
        h.update(str(self.num_classes).encode())
        return h.hexdigest()[:16]

    def finish(self, validate: bool = True, where: str = "") -> str:
        """Complete the cache and rename it into place; returns the folder.

        ``validate``: check the memory-mapped graph (:meth:`Graph.validate`, in row blocks)
        before it is swapped in; a failure raises :class:`InputError` prefixed with ``where``
        and leaves nothing at the folder.
        """
        arrays = {}
        for name in ARRAYS:
            if name in self._specs:
                s = self._specs[name]
                arrays[name] = {"dtype": s.dtype.str, "shape": list(s.close())}
        for path in self._scratch:
            if os.path.exists(path):
                os.remove(path)
        meta = {"format": FORMAT, "version": VERSION, "name": self.name,
                "num_classes": int(self.num_classes), "fingerprint": self._fingerprint(),
                "arrays": arrays, "meta": self.meta, "extra": self.extra}
        with open(os.path.join(self.tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, default=str)  # meta may hold numpy scalars: store as text
            f.flush()
            os.fsync(f.fileno())
        if validate:
            try:
                load_cache(self.tmp).validate()
            except InputError as exc:
                raise InputError(f"{where}: {exc}" if where else str(exc)) from None
        os.chmod(self.tmp, 0o755)  # mkdtemp makes 0700; a cache is meant to be shared
        if self.keep_existing and os.path.isdir(self.folder) and _looks_like_cache(self.folder):
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            _swap_in(self.tmp, self.folder)
        self.tmp = None
        return self.folder


def save_cache(graph: Graph, folder: str, extra: Optional[dict] = None) -> str:
    """Write ``graph`` as a cache folder atomically; returns the folder path.

    ``extra`` is stored in meta.json (e.g. the spec the graph came from). An existing cache at
    ``folder`` is replaced; an existing folder that is not a cache (nor empty) is refused, so a
    mistyped path never deletes user files. The graph is not validated again.
    """
    with CacheWriter(folder, extra) as out:
        out.name, out.num_classes, out.meta = graph.name, int(graph.num_classes), graph.meta
        for name in ARRAYS:
            arr = getattr(graph, name)
            if arr is not None:
                out.write(name, arr)
        return out.finish(validate=False)


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
            raise InputError(f"corrupt cache {folder}: {key}.npy is {arr.dtype.str} "
                             f"{list(arr.shape)}, meta.json says {want.get('dtype')} "
                             f"{want.get('shape')}")
        loaded[key] = arr
    graph = Graph(num_classes=num_classes, name=name, meta=dict(meta.get("meta") or {}), **loaded)
    if verify and graph.fingerprint() != meta.get("fingerprint"):
        raise InputError(f"corrupt cache {folder}: content fingerprint differs from meta.json")
    return graph


def stored_fingerprint(graph: Graph) -> Optional[str]:
    """The fingerprint a cache's meta.json records for ``graph``, when every array of ``graph``
    is still the read-only memory map :func:`load_cache` gave of that one cache folder (so its
    content is the cache's: the folder is written whole and renamed, never edited); None
    otherwise. Spares hashing every byte (the features above all) to name a cached graph."""
    folder = None
    for key in ARRAYS:
        arr = getattr(graph, key)
        if arr is None and key == "edge_weight":
            continue
        path = getattr(arr, "filename", None)
        if (not isinstance(arr, np.memmap) or arr.flags.writeable or path is None
                or os.path.basename(path) != f"{key}.npy"
                or not isinstance(arr.base, mmap.mmap)):  # the map itself, not a view of it
            return None
        here = os.path.dirname(os.path.abspath(path))
        if folder not in (None, here):
            return None
        folder = here
    try:
        meta = _read_meta(folder)
    except InputError:
        return None
    specs = meta.get("arrays") or {}
    for key in ARRAYS:  # the same arrays, shapes and dtypes as recorded
        arr = getattr(graph, key)
        want = specs.get(key)
        if (arr is None) != (want is None) or (arr is not None and (
                arr.dtype.str != want.get("dtype") or list(arr.shape) != want.get("shape"))):
            return None
    if int(meta.get("num_classes", -1)) != int(graph.num_classes):
        return None
    return meta.get("fingerprint")
