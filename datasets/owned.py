"""Folders gnnpar writes into are *claimed*: a marker file says which kind of output it is and
whose, so gnnpar deletes or overwrites only what it made itself and can prove it made.

``claim(folder, kind, identity)`` makes ``folder`` gnnpar's ``kind`` (``"shards"``,
``"checkpoints"``): a missing folder is created, an empty one is marked, a folder
already marked with the same kind is reused; anything else — files without the marker, a
marker of another kind, a path that is a file, a folder this process cannot write — is refused
with :class:`InputError` (exit 2) before any work starts. With ``identity`` given, a folder
marked with another identity is refused too, naming the keys that differ.

Marker (``.gnnpar-owner.json``, written atomically)::

    {"tool": "gnnpar", "kind": "checkpoints", "identity": {...}}
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional

from .errors import InputError

MARKER = ".gnnpar-owner.json"


def read_claim(folder: str) -> Optional[dict]:
    """The marker of ``folder``, or None when it has none (or an unreadable one)."""
    path = os.path.join(folder, MARKER)
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            claim = json.load(f)
    except (OSError, ValueError):
        return None
    return claim if isinstance(claim, dict) and claim.get("tool") == "gnnpar" else None


def check_writable_folder(folder: str, what: str, label: str = None) -> None:
    """Refuse a path that is a file, or a folder whose nearest existing ancestor is a file or
    not writable (missing folders are made when written). Messages start with ``label``
    (default ``"<what> <folder>"``)."""
    label = label or f"{what} {folder}"
    probe = os.path.abspath(folder)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise InputError(f"{label}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{label}: no permission to write in {probe}")


def check_claimable(folder: str, kind: str, what: str) -> Optional[dict]:
    """Refuse, writing nothing, what :func:`claim` would refuse (a file, a parent that is a
    file, no write permission, files gnnpar did not write, another kind's marker); returns
    the folder's marker, or None when it has none yet."""
    check_writable_folder(folder, what)
    if not os.path.isdir(folder):
        return None
    found = read_claim(folder)
    if found is None:
        # a marker being written by another rank of this run (node-local disks) is no stranger
        others = sorted(e for e in os.listdir(folder)
                        if e != MARKER and not e.startswith(MARKER + ".tmp-"))
        if others:
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise InputError(f"{what} {folder} holds files gnnpar did not write ({shown}); "
                             "give an empty or new folder")
    elif found.get("kind") != kind:
        raise InputError(f"{what} {folder} holds gnnpar {found.get('kind')}, not {kind}; "
                         "give another folder")
    return found


def claim(folder: str, kind: str, identity: Optional[Mapping[str, Any]] = None,
          what: Optional[str] = None) -> dict:
    """Make ``folder`` gnnpar's ``kind`` output folder (see the module docstring); returns
    its marker. ``what`` names the folder in messages (e.g. ``"--checkpoint-dir"``)."""
    what = what or f"{kind} folder"
    found = check_claimable(folder, kind, what)
    os.makedirs(folder, exist_ok=True)
    if found is None:
        found = {"tool": "gnnpar", "kind": kind,
                 "identity": dict(identity) if identity is not None else None}
        write_marker(folder, found)
        return found
    if identity is not None:
        check_identity(folder, found, identity, what)
    return found


def _value(identity: Mapping[str, Any], key: str) -> str:
    """A setting as the refusal shows it; an identity leaves out settings at their default
    (``precision`` of an fp32 run, say)."""
    return repr(identity[key]) if key in identity else "the default (not recorded)"


def check_identity(folder: str, found: Mapping[str, Any], identity: Mapping[str, Any],
                   what: str) -> None:
    """Refuse ``folder`` when its marker records another identity (keys that differ named)."""
    theirs = found.get("identity") or {}
    differ = sorted(k for k in set(theirs) | set(identity) if theirs.get(k) != identity.get(k))
    if differ:
        shown = "; ".join(f"{k}: folder has {_value(theirs, k)}, this run {_value(identity, k)}"
                          for k in differ[:3])
        raise InputError(f"{what} {folder} belongs to another run ({shown}); give a new "
                         "folder")


def write_marker(folder: str, claim_: Mapping[str, Any]) -> None:
    path = os.path.join(folder, MARKER)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(claim_, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
