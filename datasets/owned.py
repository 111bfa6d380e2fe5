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

Outputs never land in another gnnpar folder: :func:`claiming_folder` answers "which gnnpar
folder, if any, holds this path" (the nearest folder above it with a marker, a dataset cache's
``meta.json`` or an older gnnpar's shard ``meta.json``), and :func:`refuse_claimed` turns a hit
into exit 2 for every output path of every tool, whoever's folder it is.

A ``--cache-dir`` is the user's folder, not gnnpar's: gnnpar owns only the entries it writes
there (:data:`CACHE_ENTRY`, one ``KIND-HASH`` folder per spec), so outputs may sit beside them
and :func:`cache_overlap` refuses only a path inside an entry, built or still to be built.

One writer at a time: :class:`FolderLock` is an exclusive ``flock`` on ``FOLDER/.gnnpar-lock``
holding the holder's pid and host; checkpoint folders and shard folders both use it.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import socket
import time
import warnings
from typing import Any, Callable, Mapping, Optional, Tuple

from .errors import InputError

MARKER = ".gnnpar-owner.json"
LOCK_NAME = ".gnnpar-lock"
#: what the ``meta.json`` of a folder gnnpar wrote without a marker holds: a dataset cache
#: (``format``, :mod:`.cache`) or the shards of an older gnnpar (every one of these keys)
CACHE_FORMAT = "gnnpar-graph-cache"
SHARD_META_KEYS = ("format_version", "run_id", "fingerprint", "parts")


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
    the folder's marker, or None when it has none yet (a folder holding only a writer's lock
    file is still unmarked and claimable)."""
    check_writable_folder(folder, what)
    if not os.path.isdir(folder):
        return None
    found = read_claim(folder)
    if found is None:
        # a marker being written by another rank of this run (node-local disks) is no stranger
        others = sorted(e for e in os.listdir(folder) if e not in (MARKER, LOCK_NAME)
                        and not e.startswith(MARKER + ".tmp-"))
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


# ---------------------------------------------------------------- whose folder is this
#: the names gnnpar gives what it writes into a ``--cache-dir``: an entry per spec,
#: ``KIND-HASH`` (20 hex digits of the spec's key, :func:`cache_entry_name`), and its hidden
#: temporaries ``.KIND-HASH.tmp-*`` (being written) and ``.KIND-HASH.old-*`` (being replaced)
CACHE_ENTRY = re.compile(r"[a-z]+-[0-9a-f]{20}|\.[a-z]+-[0-9a-f]{20}\.(?:tmp|old)-.+")


def cache_entry_name(kind: str, key: str) -> str:
    """The entry of a ``--cache-dir`` that holds the graph of spec kind ``kind`` whose cache
    key is ``key`` (:func:`gnnpar.datasets.spec.cache_key`)."""
    return f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:20]}"


def cache_overlap(path: str, cache_dir: str) -> str:
    """How output ``path`` meets the dataset cache folder ``cache_dir`` (links resolved):
    ``"overwrite"`` when it is that folder, ``"write into"`` when it is or lies inside one of
    its entries (:data:`CACHE_ENTRY`, whether built yet or not: gnnpar replaces or deletes an
    entry as a whole), ``""`` otherwise: the rest of the folder is the user's."""
    inner, root = os.path.realpath(path), os.path.realpath(cache_dir)
    if inner == root:
        return "overwrite"
    if not inner.startswith(root.rstrip(os.sep) + os.sep):
        return ""
    first = os.path.relpath(inner, root).split(os.sep)[0]
    return "write into" if CACHE_ENTRY.fullmatch(first) else ""


def _meta_kind(folder: str) -> Optional[str]:
    """What the ``meta.json`` of ``folder`` says gnnpar wrote there without a marker."""
    path = os.path.join(folder, "meta.json")
    try:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 16 << 20:
            return None  # (a user's large meta.json is not read: gnnpar's are small)
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    if meta.get("format") == CACHE_FORMAT:
        return "dataset cache"
    return "shards" if all(k in meta for k in SHARD_META_KEYS) else None


def folder_kind(folder: str) -> Optional[str]:
    """The kind of gnnpar output ``folder`` itself is (its marker's kind, ``"dataset
    cache"``, or ``"shards"`` of an older gnnpar), or None."""
    if not os.path.isdir(folder):
        return None
    found = read_claim(folder)
    if found is not None:
        return str(found.get("kind"))
    return _meta_kind(folder)


def claiming_folder(path: str, include_self: bool = False) -> Optional[Tuple[str, str]]:
    """``(folder, kind)`` of the nearest gnnpar folder above ``path`` (links resolved; with
    ``include_self``, ``path`` itself counts), or None when no gnnpar folder holds it.

    Every output path of every tool is checked with it, so no output replaces a shard array,
    another run's checkpoint, a cache's ``meta.json``, or puts a stranger's file into a folder
    gnnpar would later rewrite (see :func:`refuse_claimed`)."""
    real = os.path.realpath(path)
    probe = real if include_self else os.path.dirname(real)
    while True:
        kind = folder_kind(probe)
        if kind is not None:
            return probe, kind
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent


def refuse_claimed(flag: str, path: str, include_self: bool = False) -> None:
    """Exit 2 (:class:`InputError`) when output ``path`` of ``flag`` lies inside a gnnpar
    folder (:func:`claiming_folder`), whichever run it belongs to; ``include_self``: the path
    is a folder the tool writes into that must not be a gnnpar folder itself either."""
    hit = claiming_folder(path, include_self)
    if hit is not None:
        folder, kind = hit
        where = "is" if os.path.realpath(path) == folder else "lies inside"
        raise InputError(f"{flag} {path} {where} {folder}, a gnnpar {kind} folder: gnnpar "
                         "writes there only that folder's own files; give a path outside it")


# ---------------------------------------------------------------- one writer at a time
class FolderBusy(InputError):
    """Another live process holds the lock of a gnnpar folder (exit 2, the holder named);
    ``holder``: "pid N[ on HOST]" or "pid unknown"."""

    def __init__(self, message: str, holder: str = "pid unknown"):
        super().__init__(message)
        self.holder = holder


class LockWarning(UserWarning):
    """The file system cannot lock: nothing keeps a second writer out."""


class FolderLock:
    """An exclusive ``fcntl.flock`` on ``FOLDER/.gnnpar-lock``, held until :meth:`release`
    (or the process ends: the kernel drops it even after SIGKILL, so a crashed run never
    leaves a stale lock). The holder's pid and host are written into the file for the message
    a second run gets. A file system without lock support gives a warning, not an error.

    ``wait``: block until the holder lets go instead of raising :class:`FolderBusy`;
    ``notice(holder)`` is called once before waiting."""

    warning = LockWarning  #: the category of the no-lock-support warning

    def __init__(self, folder: str, what: str = "folder", wait: bool = False,
                 notice: Optional[Callable[[str], None]] = None):
        self.path = os.path.join(folder, LOCK_NAME)
        self.fd: Optional[int] = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._holder()
                if not wait:
                    raise FolderBusy(f"{what} {folder} is in use by another run ({holder}); "
                                     "wait for it to finish or give another folder",
                                     holder) from None
                if notice is not None:
                    notice(holder)
                fcntl.flock(self.fd, fcntl.LOCK_EX)
        except FolderBusy:
            self.release()
            raise
        except OSError as e:  # e.g. ENOLCK: no locks on this file system
            warnings.warn(f"cannot lock {self.path} ({e.strerror}): nothing stops a second run "
                          "from writing into this folder", self.warning, stacklevel=2)
            return
        except BaseException:
            self.release()
            raise
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)

    def _holder(self) -> str:
        """The holder as written in the lock file. A holder writes its pid just after it
        locks, so an empty file is read again for up to half a second."""
        for _ in range(50):
            try:
                with open(self.path, encoding="utf-8", errors="replace") as fh:
                    pid, _, host = fh.read(200).strip().partition(" ")
            except OSError:
                return "pid unknown"
            if pid.isdigit():
                return f"pid {pid}" + (f" on {host}" if host and host != socket.gethostname()
                                       else "")
            time.sleep(0.01)
        return "pid unknown"

    @property
    def held(self) -> bool:
        return self.fd is not None

    def current(self) -> bool:
        """Whether the locked file is still the one at the path (a holder that made the
        folder may remove it, lock file and all, when its run fails before writing)."""
        if self.fd is None:
            return False
        try:
            return os.path.samestat(os.fstat(self.fd), os.stat(self.path))
        except OSError:
            return False

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # drops the flock; the file stays (removing it would race a waiter)
