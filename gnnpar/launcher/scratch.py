"""Private scratch folders in ``$TMPDIR`` that no exit can strand.

:func:`make_scratch_dir` makes ``$TMPDIR/<prefix><pid>-<random>`` with an owner file (pid,
process start time, boot id, host, pid namespace); its maker removes it on every way out it
controls. A process that is SIGKILLed cannot, so the next gnnpar run calls
:func:`remove_stale_scratch_dirs`, which removes only folders of this user whose name *and*
owner file say gnnpar made them for a process that is provably gone (no such pid, a zombie,
a reused pid, an earlier boot), on this host and pid namespace, and that hold no symbolic
link (nor a folder, for kinds that hold only files). Used for the local rendezvous
(``gnnpar-rdzv-``) and temporary shards (``gnnpar-shards-``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
from typing import List, Optional

OWNER_FILE = "gnnpar-scratch.owner"


def process_start(pid: int) -> Optional[str]:
    """Start time of a live process (clock ticks after boot, /proc/<pid>/stat field 22);
    None if there is no such process or it is a zombie, "" where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


def _read_text(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _host_identity() -> dict:
    pidns = ""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pass
    return {"host": socket.gethostname(), "pidns": pidns,
            "boot": _read_text("/proc/sys/kernel/random/boot_id")}


def make_scratch_dir(prefix: str) -> str:
    """A new private ``$TMPDIR/<prefix><pid>-<random>`` holding its owner file."""
    tmp = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    try:
        owner = {"pid": os.getpid(), "start": process_start(os.getpid()), **_host_identity()}
        with open(os.path.join(tmp, OWNER_FILE), "w") as fh:
            json.dump(owner, fh)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _only_own_files(path: str, allow_dirs: bool) -> bool:
    """No symbolic link inside ``path``, and no folder unless ``allow_dirs``."""
    for root, dirs, files in os.walk(path):
        if (dirs and not allow_dirs) or any(os.path.islink(os.path.join(root, n))
                                            for n in dirs + files):
            return False
    return True


def _stale(path: str, pid: int, me: dict, allow_dirs: bool) -> bool:
    """The folder is gnnpar's (owner file agrees with its name, same host and pid namespace,
    no symbolic link inside, no folder unless ``allow_dirs``) and its owner process is
    provably gone."""
    try:
        with open(os.path.join(path, OWNER_FILE)) as fh:
            owner = json.load(fh)
    except (OSError, ValueError):
        return False
    if not isinstance(owner, dict) or owner.get("pid") != pid \
            or owner.get("host") != me["host"] or owner.get("pidns") != me["pidns"] \
            or not _only_own_files(path, allow_dirs):
        return False
    if owner.get("boot") and me["boot"] and owner["boot"] != me["boot"]:
        return True  # made before the last reboot
    start = process_start(pid)
    if start is None:
        return True
    return bool(start and owner.get("start") and start != owner["start"])  # pid reused


def remove_stale_scratch_dirs(prefix: str, root: Optional[str] = None,
                              allow_dirs: bool = False) -> List[str]:
    """Remove the ``prefix`` folders under ``root`` ($TMPDIR) left by gnnpar processes that
    were killed; returns the paths removed. A folder that is not provably gnnpar's, or whose
    owner may still run, is kept (one holding folders too, unless ``allow_dirs``: the kinds
    whose contents are folders say so). Never raises."""
    removed: List[str] = []
    name_re = re.compile(re.escape(prefix) + r"(\d+)-[A-Za-z0-9_]+")
    try:
        root = root or tempfile.gettempdir()
        me = _host_identity()
        uid = os.getuid() if hasattr(os, "getuid") else None
        with os.scandir(root) as it:
            candidates = [e for e in it if name_re.fullmatch(e.name)]
        for e in candidates:
            try:
                if not e.is_dir(follow_symlinks=False) \
                        or (uid is not None and e.stat(follow_symlinks=False).st_uid != uid):
                    continue
                pid = int(name_re.fullmatch(e.name).group(1))
                if pid != os.getpid() and _stale(e.path, pid, me, allow_dirs):
                    shutil.rmtree(e.path, ignore_errors=True)
                    removed.append(e.path)
            except (OSError, ValueError):
                continue
    except OSError:
        pass
    return removed
