"""The shard folder's layout names, and which folders :func:`~.shards.write_shards` may write.

gnnpar deletes or overwrites only what it wrote: a shard folder is claimed with the marker of
:mod:`gnnpar.datasets.owned` (kind ``"shards"``), and every entry of a folder to be (re)written
must be provably a gnnpar shard artefact (:func:`check_shard_folder`).
"""
from __future__ import annotations

import json
import os
import re

from gnnpar.datasets import InputError
from gnnpar.datasets.owned import MARKER, check_writable_folder, claim, read_claim, write_marker
from gnnpar.datasets.spec import cache_key

META = "meta.json"
MANIFEST = "part.json"
GRID_DIR = "grid"
GRID_MANIFEST = "grid.json"
KIND = "shards"         # the owned-folder kind of a shard directory
PART_RE = re.compile(r"^part-(\d{5,})$")
LEFTOVER_RE = re.compile(r"^(part-\d{5,}|grid)\.(tmp|old)-\d+$")
TMP_FILE_RE = re.compile(r"^(meta\.json|\.gnnpar-owner\.json)\.tmp-\d+$")  # atomic JSON writes


def dataset_source(spec: str, directed: bool = False) -> dict:
    """A cheap identity of the dataset a spec names (``meta.json["source"]``): the spec, the
    directed flag and :func:`~gnnpar.datasets.spec.cache_key` (canonical params; path, size and
    mtime of input files), so a reader can tell "same dataset" without loading it."""
    return {"spec": spec, "directed": bool(directed), "key": cache_key(spec, directed)}


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
    elif entry == META:
        inside = None if _is_meta(path) else ""
    elif TMP_FILE_RE.match(entry):
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

    Every entry must be a gnnpar shard artefact: the marker, ``meta.json`` (with
    ``format_version``, ``run_id``, ``fingerprint``, ``parts``), ``part-NNNNN`` and ``grid``
    folders holding only the files their manifest lists, and the ``.tmp-``/``.old-`` debris
    of a write cut short. A marker of another kind, anything else, or a symbolic link is
    refused — with or without the marker, as a rewrite would delete it."""
    out_dir = os.fspath(out_dir)
    check_writable_folder(out_dir, what)
    if not os.path.exists(out_dir):
        return "new"
    entries = sorted(os.listdir(out_dir))
    if not entries:
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
