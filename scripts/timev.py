"""One command run alone under GNU ``/usr/bin/time -v``, measured: the benchmark scripts' child
processes (``scripts/bench_partition.py``, ``scripts/bench_ogb_ingest.py``).

:func:`measure` gives the wall time ("Elapsed (wall clock)"), the peak RSS ("Maximum resident
set size": of each process of the tree individually, the largest), the CPU times and the exit
status, plus the load averages before and after, the child's stdout and its stderr's last
lines. Without GNU time (``apt-get install time``) ``os.wait4`` gives the same rusage, the
wall time then from the parent's clock. A child still running at the timeout is killed with
its whole process group.

Imported by the scripts from their own folder (``sys.path``), so it needs nothing of gnnpar.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time

GNU_TIME = "/usr/bin/time"


def parse_gnu_time(text: str) -> dict:
    """The figures of ``/usr/bin/time -v`` output; a line that is absent gives no key."""
    out = {}
    for line in text.splitlines():
        key, _, val = line.strip().rpartition(": ")
        val = val.strip()
        try:
            if key.startswith("Maximum resident set size"):
                out["max_rss_bytes"] = int(val) * 1024
            elif key.startswith("Elapsed (wall clock) time"):
                secs = 0.0
                for part in val.split(":"):  # h:mm:ss or m:ss(.ss)
                    secs = secs * 60 + float(part)
                out["wall_s"] = secs
            elif key == "User time (seconds)":
                out["user_s"] = float(val)
            elif key == "System time (seconds)":
                out["sys_s"] = float(val)
            elif key == "Percent of CPU this job got":
                out["cpu_percent"] = float(val.rstrip("%"))
            elif key == "Exit status":
                out["exit_status"] = int(val)
        except ValueError:
            pass
    return out


def loadavg() -> list:
    """The 1, 5 and 15 minute load averages, rounded; None where the system has none."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def measure(cmd: list, timeout: float, env: dict = None, cwd: str = None,
            gnu_time: str = GNU_TIME) -> dict:
    """Run ``cmd`` alone under ``gnu_time -v`` (``os.wait4`` where it is not executable) and
    return its record: ``command``, ``load_before``, ``wall_s``, ``max_rss_bytes``,
    ``user_s``, ``sys_s``, ``rc``, ``rss_source`` (``gnu-time`` or ``wait4``), ``cpu_percent``
    (GNU time only), ``wall_s_outer`` (the parent's clock), ``load_after``, ``timed_out``;
    where the child failed or timed out, ``error`` (its last stderr line) and
    ``stderr_tail`` (blank lines left out); ``_stdout``, the child's whole stdout."""
    use_gnu = os.access(gnu_time, os.X_OK)
    rec = {"command": list(cmd), "load_before": loadavg()}
    with tempfile.TemporaryDirectory(prefix="timev-") as td:
        paths = {k: os.path.join(td, k) for k in ("out", "err", "time")}
        full = [gnu_time, "-v", "-o", paths["time"], *cmd] if use_gnu else list(cmd)
        killed = []

        def kill():
            killed.append(True)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass

        with open(paths["out"], "wb") as fo, open(paths["err"], "wb") as fe:
            t0 = time.perf_counter()
            proc = subprocess.Popen(full, stdout=fo, stderr=fe, env=env, cwd=cwd,
                                    start_new_session=True)
            timer = threading.Timer(timeout, kill)
            timer.start()
            try:
                _, status, ru = os.wait4(proc.pid, 0)
            finally:
                timer.cancel()
            outer = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        rec.update(wall_s=outer, max_rss_bytes=ru.ru_maxrss * 1024, user_s=ru.ru_utime,
                   sys_s=ru.ru_stime, rc=proc.returncode, rss_source="wait4")
        if use_gnu and os.path.exists(paths["time"]):
            with open(paths["time"], errors="replace") as f:
                gnu = parse_gnu_time(f.read())
            if "max_rss_bytes" in gnu:
                rec["rss_source"] = "gnu-time"
            rec.update({k: v for k, v in gnu.items() if k != "exit_status"})
            if "exit_status" in gnu and not killed:
                rec["rc"] = gnu["exit_status"]
        rec["wall_s_outer"] = outer
        with open(paths["out"], errors="replace") as f:
            stdout = f.read()
        with open(paths["err"], errors="replace") as f:
            err = [ln for ln in f.read().splitlines() if ln.strip()]
    rec["load_after"] = loadavg()
    rec["timed_out"] = bool(killed)
    if rec["rc"] != 0 or killed:
        rec["error"] = f"timed out after {timeout:g} s" if killed else \
            (err[-1] if err else f"exit status {rec['rc']}")
        rec["stderr_tail"] = err[-20:]
    rec["_stdout"] = stdout
    return rec
