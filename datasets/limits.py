"""Size limits: every estimate of the memory an input needs is judged in one place
(:func:`check_memory`) before the work starts, so a spec like ``rmat:scale=31`` or an npz
header claiming 10^12 rows is refused with exit 2 naming the size instead of exhausting the
machine. The limit is ``--max-memory`` / ``GNNPAR_MAX_BYTES``, else 80 % of this machine's
memory: the smallest of physical RAM, the cgroup limit and ``ulimit -v`` (``RLIMIT_AS``).
Disk is judged the same way (:func:`check_disk`): what a write needs against the free space
of the file system it lands on, before it starts."""
from __future__ import annotations

import contextlib
import errno
import math
import os
import re
from typing import Optional, Tuple

from .errors import InputError

try:
    import resource
except ImportError:  # not a Unix: no rlimits
    resource = None

#: environment variable holding the memory limit in bytes (the ``--max-memory`` of gnnpar-train,
#: gnnpar-partition and gnnpar-plan sets it when their work starts,
#: ``gnnpar.cli.cli_common.apply_max_memory``, so spawned ranks and forked jobs inherit it; their
#: flag checks judge by the flag's value without setting it); units are accepted too:
#: ``64GiB``, ``2e11``.
MAX_BYTES_ENV = "GNNPAR_MAX_BYTES"
#: share of this machine's memory (physical RAM, the cgroup limit or ``ulimit -v``, the
#: smallest) that an input may need before it is refused, when no limit is set.
DEFAULT_MEMORY_SHARE = 0.8
#: the class count may exceed the node count (small test graphs) up to this floor; more
#: classes than max(nodes, floor) means a label is an id that was never remapped to 0..C-1.
MAX_CLASSES_FLOOR = 1 << 16

_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "PB": 1e15,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40, "PIB": 2 ** 50}


def parse_bytes(text: str) -> float:
    """'80GB', '16GiB', '2e9' → bytes (a finite number >= 0)."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(text))
    value = None
    if m and m.group(2).upper() in _UNITS:
        try:
            value = float(m.group(1)) * _UNITS[m.group(2).upper()]
        except ValueError:
            value = None
    if value is None or not math.isfinite(value):
        raise InputError(f"cannot read a byte size from {text!r} (use e.g. 80GB, 16GiB, 2e9)")
    return value


def format_bytes(nbytes: float) -> str:
    """1536 → '1.5 KiB'; any size, however large."""
    value, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(value) < 1024 or unit == "EiB":
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else (
        f"{value:.1f} {unit}" if value < 1e6 else f"{value:.3g} {unit}")


def machine_memory() -> int:
    """Bytes of memory this process may use: physical RAM, or the cgroup limit or the address
    space limit (``ulimit -v``, ``RLIMIT_AS``: past it every allocation fails) when smaller
    (0 when none can be read)."""
    total = 0
    try:
        total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemTotal:"):
                        total = int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    for cg in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(cg) as f:
                limit = int(f.read().strip())
        except (OSError, ValueError):  # absent, or "max"
            continue
        if 0 < limit < (total or limit + 1):
            total = limit
    limit = address_space_limit()
    if limit is not None and 0 < limit < (total or limit + 1):
        total = limit
    return max(total, 0)


def address_space_limit():
    """The soft ``RLIMIT_AS`` (``ulimit -v``) in bytes, or None when unlimited or unknown."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError, AttributeError):  # no such limit here (resource is None)
        return None
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def memory_limit(max_bytes: Optional[float] = None) -> Tuple[float, str]:
    """(bytes an input may need, where that limit comes from): ``max_bytes`` when given (a
    ``--max-memory`` being checked), else :data:`MAX_BYTES_ENV`, else a share of the machine."""
    if max_bytes is not None:
        return max_bytes, "set by --max-memory"
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if text:
        try:
            return parse_bytes(text), f"set by --max-memory / {MAX_BYTES_ENV}"
        except InputError:
            raise InputError(f"{MAX_BYTES_ENV}={text!r} is not a byte size "
                             "(use e.g. 80GB, 16GiB, 2e9)") from None
    total = machine_memory()
    if total <= 0:
        return math.inf, "unknown machine memory"
    return DEFAULT_MEMORY_SHARE * total, (f"{DEFAULT_MEMORY_SHARE:.0%} of this machine's "
                                          f"{format_bytes(total)}")


def check_memory(nbytes: float, what: str, max_bytes: Optional[float] = None) -> None:
    """Refuse work whose estimated memory ``nbytes`` is over :func:`memory_limit`
    (``max_bytes``: a limit given explicitly), naming ``what`` needs it and how to raise the
    limit. The one place every size estimate is judged."""
    limit, source = memory_limit(max_bytes)
    if nbytes > limit:
        raise InputError(f"{what} needs about {format_bytes(nbytes)} of memory, over the limit of "
                         f"{format_bytes(limit)} ({source}); if the machine really has that much, "
                         f"raise it with --max-memory SIZE or {MAX_BYTES_ENV}=SIZE")


def existing_folder(path: str) -> str:
    """``path`` itself when it exists, else its nearest existing parent: where a write of
    ``path`` lands, file system and all."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe


def free_disk(path: str):
    """(free bytes, block size) of the file system ``path`` would be written on, or None when
    they cannot be read."""
    try:
        st = os.statvfs(existing_folder(path))
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize, st.f_frsize or 4096


def check_disk(nbytes: float, path: str, what: str, reclaimed: float = 0) -> None:
    """Refuse a write of about ``nbytes`` to ``path`` that the free space of its file system
    (plus ``reclaimed``: bytes the write replaces) cannot hold, naming ``what`` needs it —
    before the write starts, so no half-written output fills the disk."""
    found = free_disk(path)
    if found is None:
        return
    free = found[0]
    if nbytes > free + reclaimed:
        raise InputError(f"{what} needs about {format_bytes(nbytes)} of disk, more than the "
                         f"{format_bytes(free + reclaimed)} free on the file system of "
                         f"{existing_folder(path)}; free some space or write elsewhere")


#: ``errno`` values of a write that found no room: no space left, a file over the size limit
#: (``ulimit -f``), a quota exceeded
DISK_FULL_ERRNOS = tuple(getattr(errno, name) for name in ("ENOSPC", "EFBIG", "EDQUOT")
                         if hasattr(errno, name))


#: numpy's ``tofile``/``np.save`` report a short ``fwrite`` — what a full disk, a quota or
#: ``ulimit -f`` cause — without an errno: "96000 requested and 65504 written"
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def is_disk_full(exc: BaseException) -> bool:
    """True when ``exc`` is a write that found the disk (or its quota, or ``ulimit -f``) full:
    an OSError with one of :data:`DISK_FULL_ERRNOS`, or numpy's short write."""
    return isinstance(exc, OSError) and (exc.errno in DISK_FULL_ERRNOS or exc.errno is None
                                         and bool(_SHORT_WRITE.search(str(exc))))


@contextlib.contextmanager
def writing_to(path: str):
    """Inside: a write that finds the disk full (:func:`is_disk_full`) without naming its
    file (``fh.write``, ``torch.save`` into a buffer or handle) is given ``path`` as its
    file name, so the one line the user reads says where."""
    try:
        yield
    except OSError as exc:
        if is_disk_full(exc) and not exc.filename:
            exc.filename = str(path)
        raise


def disk_full_message(exc: OSError, where: str = "") -> str:
    """One line for a write that found no room (:func:`is_disk_full`): the path (``where``,
    else the file the error names) and that the disk is full."""
    path = where or exc.filename or "a file"
    why = exc.strerror or (os.strerror(exc.errno) if exc.errno else f"short write: {exc}")
    return (f"{path}: the disk is full ({why}"
            + (f" writing {exc.filename}" if where and exc.filename else "") + ")")


def check_num_classes(num_classes: int, n: int, where: str = "num_classes",
                      hint: str = "labels must be class ids 0..C-1 (remap them, e.g. with "
                                  "np.unique(y, return_inverse=True))") -> None:
    """Refuse a class count far beyond the node count (a label that is no class id): the
    output layer and its logits grow with it."""
    cap = max(int(n), MAX_CLASSES_FLOOR)
    if num_classes > cap:
        raise InputError(f"{where} {num_classes:,} is more than the node count ({n:,}) and "
                         f"{MAX_CLASSES_FLOOR:,}: {hint}")
