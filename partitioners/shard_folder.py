"""The shard folder's layout names, and which folders :func:`~.shards.write_shards` may write.

gnnpar deletes or overwrites only what it wrote: a shard folder is claimed with the marker of
:mod:`gnnpar.datasets.owned` (kind ``"shards"``), and every entry of a folder to be (re)written
must be provably a gnnpar shard artefact (:func:`check_shard_folder`).

One writer at a time: every writer (``gnnpar-partition --out``, a trainer filling an empty
``--partition-dir``) holds the folder's :class:`~gnnpar.datasets.owned.FolderLock`
(:func:`shard_writer`) from before it loads the dataset until ``meta.json`` is written, and
checks the folder again under it; a second writer exits 2 naming the holder, or waits.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from typing import Callable, Optional

from gnnpar.datasets import InputError
from gnnpar.datasets.limits import check_disk, disk_full_message, free_disk, is_disk_full
from gnnpar.datasets.owned import (LOCK_NAME, MARKER, FolderLock, check_writable_folder, claim,
                                   read_claim, write_marker)
from gnnpar.datasets.spec import cache_key

META = "meta.json"
MANIFEST = "part.json"
GRID_DIR = "grid"
GRID_MANIFEST = "grid.json"
KIND = "shards"         # the owned-folder kind of a shard directory
PART_RE = re.compile(r"^part-(\d{5,})$")
LEFTOVER_RE = re.compile(r"^(part-\d{5,}|grid)\.(tmp|old)-\d+$")
TMP_FILE_RE = re.compile(r"^(meta\.json|\.gnnpar-owner\.json|vertex_order\.npy)\.tmp-\d+$")
#: new position -> dataset id of shards cut from a reordered graph (``meta["vertex_order"]``)
VERTEX_ORDER = "vertex_order.npy"


def dataset_source(spec: str, directed: bool = False) -> dict:
    """A cheap identity of the dataset a spec names (``meta.json["source"]``): the spec, the
    directed flag and :func:`~gnnpar.datasets.spec.cache_key` (canonical params; path, size and
    mtime of input files), so a reader can tell "same dataset" without loading it."""
    return {"spec": spec, "directed": bool(directed), "key": cache_key(spec, directed)}


#: files of a part folder besides its ``values_<norm>.npy`` and its two count arrays (the
#: manifest included)
PART_FILES = 13
_NPY_HEADER = 128


def shard_disk_bytes(parts: int, norms: int, block: int = 4096, graph=None) -> int:
    """Disk bytes a shard folder of ``parts`` parts with ``norms`` value arrays takes: every
    file rounded up to the file system's ``block``, and each part's two ``parts``-long count
    arrays (so the folder grows as ``parts``²). With ``graph`` the rows, features and entries
    of S = A' + I (at most ``m + n``) are added, the halo taken at its largest (every entry
    remote, at most ``n`` rows per peer); without it, the part that depends on ``parts`` alone
    — what to check before the dataset is loaded."""
    def rounded(nbytes: int) -> int:
        return -(-(nbytes + _NPY_HEADER) // block) * block
    total = parts * ((PART_FILES + norms) * block + 2 * rounded(8 * parts))
    if graph is not None:
        n, nnz = graph.num_nodes, graph.num_edges + graph.num_nodes
        halo = min(nnz, n * max(parts - 1, 0))
        raw = 8 if graph.edge_weight is not None and graph.edge_weight.dtype.itemsize == 8 else 4
        total += nnz * (8 + 4 * norms + raw + 1) + 16 * halo + 8 * (n + parts) \
            + n * (8 + 4 * graph.num_features + 8 + 3)
    return int(total)


def _tree_bytes(folder: str) -> int:
    """Bytes of the files under ``folder`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def check_shard_disk(out_dir: str, parts: int, norms: int, graph=None,
                     what: str = "shard folder") -> None:
    """Refuse (:class:`InputError`) a shard write the free disk space of ``out_dir``'s file
    system cannot hold (:func:`shard_disk_bytes`; what the folder holds now is counted as
    free: a rewrite replaces it), before anything is written."""
    found = free_disk(out_dir)
    if found is None:
        return
    need = shard_disk_bytes(parts, norms, found[1], graph)
    check_disk(need, out_dir, f"{what} {out_dir} ({parts:,} parts)", _tree_bytes(out_dir))


def _read_json(path: str):
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _is_meta(path: str) -> bool:
    meta = _read_json(path)
    return isinstance(meta, dict) and all(k in meta for k in ("format_version", "run_id",
                                                               "fingerprint", "parts"))


def _foreign_in_folder(path: str, manifest_name: str, complete: bool):
    """None when ``path`` is a folder gnnpar wrote: no links; every file its manifest or one the
    manifest lists. Without a readable manifest (``complete=False``: a write cut short before
    its manifest) every file must be a ``.npy`` at most three levels down. Else the first
    thing in it that is not gnnpar's (relative to ``path``; ``""``: the folder itself)."""
    if os.path.islink(path) or not os.path.isdir(path):
        return ""
    manifest = _read_json(os.path.join(path, manifest_name))
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict):
        if complete:
            return ""
        listed = None
    for root, dirs, files in os.walk(path):
        for name in sorted(dirs) + sorted(files):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path).replace(os.sep, "/")
            if os.path.islink(full):
                return rel
            if name in files and rel != manifest_name:
                if listed is not None and rel not in listed:
                    return rel
                if listed is None and (not name.endswith(".npy") or rel.count("/") > 2):
                    return rel
    return None


def _foreign(out_dir: str, entry: str):
    """None when top-level ``entry`` of ``out_dir`` is provably something a shard write made;
    else what in it is not (``entry`` itself, or ``entry/<path inside>``)."""
    path = os.path.join(out_dir, entry)
    if os.path.islink(path):
        return entry
    inside = ""
    if entry == MARKER:
        inside = None if read_claim(out_dir) is not None else ""
    elif entry == LOCK_NAME:
        inside = None if os.path.isfile(path) else ""
    elif entry == META:
        inside = None if _is_meta(path) else ""
    elif TMP_FILE_RE.match(entry) or entry == VERTEX_ORDER:
        inside = None if os.path.isfile(path) else ""
    elif PART_RE.match(entry):
        inside = _foreign_in_folder(path, MANIFEST, complete=True)
    elif entry == GRID_DIR:
        inside = _foreign_in_folder(path, GRID_MANIFEST, complete=True)
    elif LEFTOVER_RE.match(entry):
        leftover = LEFTOVER_RE.match(entry)
        inside = _foreign_in_folder(
            path, GRID_MANIFEST if leftover.group(1) == GRID_DIR else MANIFEST, complete=False)
    if inside is None:
        return None
    return f"{entry}/{inside}" if inside else entry


def check_shard_folder(out_dir: str, what: str = "shard folder") -> str:
    """Refuse (:class:`InputError`) a folder :func:`write_shards` may not write into; else say
    what it is: ``"new"`` (missing), ``"empty"``, ``"marked"`` (gnnpar's shards) or
    ``"legacy"`` (shards of an older gnnpar, without the marker). Writes nothing.

    Every entry must be a gnnpar shard artefact: the marker, the lock file, ``meta.json`` (with
    ``format_version``, ``run_id``, ``fingerprint``, ``parts``), ``part-NNNNN`` and ``grid``
    folders holding only the files their manifest lists, and the ``.tmp-``/``.old-`` debris
    of a write cut short. A marker of another kind, anything else, or a symbolic link is
    refused — with or without the marker, as a rewrite would delete it. A folder holding only
    a writer's lock (and its half-written marker) is ``"empty"``."""
    out_dir = os.fspath(out_dir)
    check_writable_folder(out_dir, what)
    if not os.path.exists(out_dir):
        return "new"
    entries = sorted(os.listdir(out_dir))
    if all(e == LOCK_NAME or TMP_FILE_RE.match(e) for e in entries):
        # only the lock of a writer that has not written yet (its marker maybe half written)
        if not any(_foreign(out_dir, e) for e in entries):
            return "empty"
    found = read_claim(out_dir)
    if found is not None and found.get("kind") != KIND:
        raise InputError(f"{what} {out_dir} holds gnnpar {found.get('kind')}, not {KIND}; "
                         "give another folder")
    foreign = [f for f in (_foreign(out_dir, e) for e in entries) if f is not None]
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise InputError(f"{what} {out_dir} holds files gnnpar did not write ({shown}); give an "
                         "empty or new folder, or one gnnpar wrote shards into")
    if found is None and META not in entries:
        raise InputError(f"{what} {out_dir} has no {META} and no gnnpar marker: cannot tell it "
                         "holds gnnpar shards; give an empty or new folder")
    return "marked" if found is not None else "legacy"


def claim_shard_folder(out_dir: str, what: str = "shard folder") -> dict:
    """Check ``out_dir`` (:func:`check_shard_folder`) and mark it as gnnpar's shards; an
    older gnnpar's shard folder gets the marker it lacks. Returns the marker."""
    out_dir = os.fspath(out_dir)
    if check_shard_folder(out_dir, what) == "legacy":
        marker = {"tool": "gnnpar", "kind": KIND, "identity": None}
        write_marker(out_dir, marker)
        return marker
    return claim(out_dir, KIND, None, what)


@contextlib.contextmanager
def shard_writer(out_dir: str, what: str = "shard folder", wait: bool = False,
                 notice: Optional[Callable[[str], None]] = None):
    """Hold ``out_dir``'s write lock for the ``with`` block, the folder checked under it
    (:func:`check_shard_folder`), so one writer at a time loads, partitions and writes.

    A second writer gets :class:`~gnnpar.datasets.owned.FolderBusy` (exit 2, the holder's pid
    named), or with ``wait`` blocks until the holder is done (``notice(holder)`` first). The
    lock file is made only in a folder gnnpar may write (a user's folder gets no stray file);
    a folder made here that still holds nothing but the lock when the block fails is removed,
    so a refused run leaves nothing behind."""
    out_dir = os.fspath(out_dir)
    if (read_claim(out_dir) or {}).get("kind") != KIND:
        check_shard_folder(out_dir, what)  # before the lock file is made in it
    created = not os.path.exists(out_dir)
    lock = _lock(out_dir, what, wait, notice)
    key = os.path.realpath(out_dir)
    _HELD.add(key)
    try:
        check_shard_folder(out_dir, what)  # again, now that no other writer is in it
        yield lock
    except BaseException as exc:
        full = is_disk_full(exc)
        if full:
            _remove_unfinished(out_dir, created)
        if created:
            _remove_if_only_lock(out_dir)
        if full:
            raise InputError(f"{disk_full_message(exc, f'{what} {out_dir}')}; the unfinished "
                             "shards were removed: free some space or write elsewhere") from None
        raise
    finally:
        _HELD.discard(key)
        lock.release()


#: real paths of the shard folders whose write lock this process holds (:func:`shard_writer`)
_HELD: set = set()


def writing(out_dir: str, what: str = "shard folder"):
    """The context a write into ``out_dir`` runs in: nothing more where this process already
    holds the folder's lock (``gnnpar-partition``, a trainer filling ``--partition-dir``),
    else :func:`shard_writer` — a library caller's write takes the lock as the command-line
    tools do, and a second writer is refused (exit 2) instead of interleaving with it."""
    if os.path.realpath(os.fspath(out_dir)) in _HELD:
        return contextlib.nullcontext()
    return shard_writer(out_dir, what)


def _remove_unfinished(out_dir: str, created: bool) -> None:
    """After a write into ``out_dir`` that found the disk full, remove what it left, so no
    half-written shard fills the disk: the ``.tmp-``/``.old-`` debris of the part cut short
    and, once ``meta.json`` is gone (the write had begun: the folder is unusable), every part;
    the marker too when the folder was made here. Only gnnpar's own entries are in the folder
    (checked under the lock before the write)."""
    try:
        entries = os.listdir(out_dir)
    except OSError:
        return
    begun = META not in entries
    for entry in entries:
        path = os.path.join(out_dir, entry)
        ours = LEFTOVER_RE.match(entry) or TMP_FILE_RE.match(entry) or begun and (
            PART_RE.match(entry) or entry == GRID_DIR or created and entry == MARKER)
        if not ours or os.path.islink(path):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)


def _remove_if_only_lock(out_dir: str) -> None:
    try:
        if os.listdir(out_dir) == [LOCK_NAME]:
            os.remove(os.path.join(out_dir, LOCK_NAME))  # a waiter sees it gone, starts again
            os.rmdir(out_dir)
    except OSError:
        pass  # someone else's by now: left as it is


def _lock(out_dir: str, what: str, wait: bool, notice) -> FolderLock:
    """The folder's lock, on the lock file still in place: a holder that made the folder
    removes it when it fails, so a waiter that gets the lock of a removed file starts again."""
    for _ in range(100):
        os.makedirs(out_dir, exist_ok=True)
        try:
            lock = FolderLock(out_dir, what, wait=wait, notice=notice)
        except FileNotFoundError:
            continue  # removed between makedirs and open
        if lock.current():
            return lock
        lock.release()
        notice = None
    raise InputError(f"{what} {out_dir}: cannot lock it (it keeps being removed)")
