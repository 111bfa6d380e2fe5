"""Per-machine product choices, measured once and kept: the cache every probe shares.

Which product is faster (the compiled SpMM kernel or torch's, :mod:`.cpu_spmm_probe`; torch's
bf16 GEMM or float32 GEMMs of bf16 values, :mod:`gnnpar.nn.bf16_dense`) depends on the CPU and
the thread count, so each choice is measured on the machine at hand by a probe, once, and kept
here for every later process: :func:`decided`.

**The cache.** One JSON file, ``spmm_rule.json`` under ``$GNNPAR_CACHE_DIR`` (default
``$XDG_CACHE_HOME/gnnpar``, else ``~/.cache/gnnpar``; the name is the first rule it held), one
entry per machine key (:func:`machine_key`: the CPU's model name and instruction-set flags,
torch's and numba's versions, the thread count) and choice name, with the times it was
decided from, what the probe took and the load average then. The file is read and written
under an exclusive ``flock`` on ``spmm_rule.json.lock``, and the entry looked up again once
the lock is held: ranks that start together do not each probe; the first measures and
writes, the others wait for it and read its entry. The file is replaced whole (a temporary
file renamed over it), so a reader never sees half of it. A file that cannot be parsed, or
an entry of another shape, is ignored: the probe runs again and the file is rewritten.

**Where a probe cannot run** (the cache folder cannot be created or written, the lock is not
had within :data:`LOCK_WAIT_S`, or the probe fails) the caller's fallback serves. Probing in
each process instead would let two ranks of one run, or a run and its ``--resume``, decide
differently on noisy timings; the fallback is the same everywhere.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import platform
import tempfile
import time
from typing import Any, Callable, Dict, Tuple

import torch

#: folder of gnnpar's small per-machine caches; see the module docstring
CACHE_ENV = "GNNPAR_CACHE_DIR"
FILE_NAME = "spmm_rule.json"
#: the file's format; a file of another version is ignored and rewritten (2: the SpMM probe's
#: matrix 2¹⁷ rows tall, not 2¹⁴, so version-1 rules are measured again)
VERSION = 2
#: seconds a process waits for another's probe before it takes the fallback
LOCK_WAIT_S = 60.0


def cache_dir() -> str:
    """``$GNNPAR_CACHE_DIR``, else ``$XDG_CACHE_HOME/gnnpar``, else ``~/.cache/gnnpar``."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gnnpar")


def _cpu() -> Tuple[str, str]:
    """The CPU's model name and its instruction-set flags (``/proc/cpuinfo``), else what
    :mod:`platform` knows."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name in ("model name", "cpu model", "hardware") and not model:
                    model = value.strip()
                elif name in ("flags", "features") and not flags:
                    flags = " ".join(sorted(value.split()))
                if model and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or "unknown", flags


def machine_key(threads: int) -> str:
    """What the rule depends on: CPU model, its flags (hashed), torch's and numba's
    versions, and the thread count."""
    import numba
    model, flags = _cpu()
    digest = hashlib.sha1(flags.encode()).hexdigest()[:12]
    return (f"{platform.machine()} {model} flags:{digest} torch {torch.__version__} "
            f"numba {numba.__version__} threads {threads}")


def read_cache(path: str) -> dict:
    """The file's entries, ``{key: {dtype name: entry}}``; empty for a missing or unreadable
    file or one of another format or version."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not (isinstance(data, dict) and data.get("version") == VERSION
            and isinstance(data.get("entries"), dict)):
        return {}
    return {k: v for k, v in data["entries"].items() if isinstance(v, dict)}


def _write_cache(path: str, entries: dict) -> None:
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".spmm_rule.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"version": VERSION, "entries": entries}, fh, indent=1, sort_keys=True)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from a shared cache's readers
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: str, wait_s: float):
    """An exclusive ``flock`` on ``path`` (created if need be) for a ``with`` block; raises
    :class:`TimeoutError` after ``wait_s`` seconds of another holder."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} held by another process") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # drops the lock


def cache_path() -> str:
    return os.path.join(cache_dir(), FILE_NAME)


def keep(path: str, entries: dict, key: str, name: str, times: Dict, probe_s: float,
         decide: Callable[[Dict], Any]) -> Any:
    """Put the rule ``decide(times)`` into ``entries`` under ``key`` and ``name``, with the
    times, what the probe took and the load average, and write the file (the lock held);
    returns the rule."""
    rule = decide(times)
    entries.setdefault(key, {})[name] = {
        "rule": list(rule) if isinstance(rule, tuple) else rule,
        "times_s": {str(w): [k, s] for w, (k, s) in sorted(times.items())},
        "probe_s": round(probe_s, 4), "load": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _write_cache(path, entries)
    return rule


def decided(name: str, threads: int, probe: Callable[[], Dict], decide: Callable[[Dict], Any],
            entry_rule: Callable[[Any], Tuple[bool, Any]], fallback: Any) -> Any:
    """A rule of this machine at ``threads`` threads kept in the cache under ``name``: the
    cached entry where ``entry_rule(entry)`` finds it valid, else ``decide(probe())`` measured
    now (one process at a time, the lock held) and cached; ``fallback`` where that cannot be
    done (module docstring). The SpMM size rules (:mod:`gnnpar.kernels.cpu_spmm_probe`) are
    ``name`` = their dtype; the bf16 dense product's choice (:mod:`gnnpar.nn.bf16_dense`) is
    ``dense_bf16``."""
    try:
        path = cache_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        key = machine_key(threads)
        valid, rule = entry_rule(read_cache(path).get(key, {}).get(name))
        if valid:
            return rule
        with _locked(path + ".lock", LOCK_WAIT_S):
            entries = read_cache(path)  # another process may have probed while this one waited
            valid, rule = entry_rule(entries.get(key, {}).get(name))
            if valid:
                return rule
            t = time.perf_counter()
            times = probe()
            keep(path, entries, key, name, times, time.perf_counter() - t, decide)
            return entry_rule(entries[key][name])[1]  # as a later process reads it
    except Exception:  # noqa: BLE001 - no cache, no lock or a failed probe: the fallback
        return fallback
