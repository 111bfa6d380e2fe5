"""What every gnnpar command shares: exit codes, one-line errors, progress, JSON lines."""
from __future__ import annotations

import json
import math
import argparse
import os
import re
import shutil
import sys
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

from gnnpar.datasets import InputError
from gnnpar.datasets.limits import MAX_BYTES_ENV, disk_full_message, is_disk_full, parse_bytes

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT = 0, 1, 2
#: a lost rank: a peer died, hung, or never joined a launched world (the same code as
#: ``gnnpar.launcher.watchdog.EXIT_PEER_LOST``, which a rank's watchdog exits with)
EXIT_LOST_RANK = 3
#: training stopped because the loss became NaN or infinite (143 is a SIGTERM preemption, in
#: ``gnnpar.launcher.watchdog``; 130 an interrupt)
EXIT_DIVERGED = 4


class LostRank(RuntimeError):
    """A peer of a launched world is gone before this rank could join it (it died, or never
    started); :func:`run_cli` exits :data:`EXIT_LOST_RANK` with the message as one line."""


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's formatter that appends each option's default, except to a help text that
    states its default itself ("(default ..." or "; default ..."): there the parser's default
    is often None, meaning "not given", and "(default 1) (default: None)" would contradict
    itself."""

    def _get_help_string(self, action):
        if re.search(r"[(;] ?default\b", action.help or ""):
            return action.help
        return super()._get_help_string(action)


# ---------------------------------------------------------------- bounds of count flags
#: most ranks (``--parts``, ``--replication``, ``gnnpar-plan --world``): ranking the grids of
#: a world and writing its shards take time, memory and disk growing with it (a shard holds
#: per-rank counts, so a shard folder grows as its square), and no machine has more.
MAX_RANKS = 1 << 20
#: most threads a process starts (``--threads``): OpenMP crashes (SIGSEGV) at ~10^5, and no
#: machine gnnpar runs on has more cores than this.
MAX_THREADS = 1024
#: most sampler threads a rank runs (``--sampler-workers``): each is a thread with its own
#: communicator and macrobatch in flight, so memory and process groups grow with them.
MAX_SAMPLER_WORKERS = 256
#: most macrobatches a rank may have sampled ahead (``--prefetch``): each is held in memory.
MAX_PREFETCH = 1024
#: widest hidden layer (``--hidden``, ``--feat-width``): width² weights must stay far inside
#: int64 arithmetic (and 2^48 of them no machine holds).
MAX_WIDTH = 1 << 24
#: deepest model (``--layers``): RevGNN trained 1,001 layers; the plan and the model build a
#: list of widths this long.
MAX_LAYERS = 4096
#: largest ``--seed``: every tool's random streams take it (numpy's legacy seeding stops at
#: 2^32 - 1, and a rank's torch seed ``seed * 1000003 + rank`` must fit in 64 bits); negative
#: seeds are refused by numpy's generators.
MAX_SEED = 2 ** 32 - 1


@dataclass(frozen=True)
class Bound:
    """The range ``lo..hi`` of an integer flag; ``why`` says where the upper end comes from."""

    lo: int
    hi: int
    why: str


#: every count and size flag of gnnpar-train, gnnpar-partition and gnnpar-plan, by its
#: argparse name (a flag means the same in every tool that has it)
BOUNDS = {
    "threads": Bound(1, MAX_THREADS, "threads of one process"),
    "jobs": Bound(1, MAX_THREADS, "processes of one machine"),
    "seed": Bound(0, MAX_SEED, "the range every random generator accepts"),
    "hidden": Bound(1, MAX_WIDTH, "features of a layer"),
    "heads": Bound(1, MAX_WIDTH, "heads of a layer, each at least one feature wide"),
    "feat_width": Bound(1, MAX_WIDTH, "features of a layer"),
    "layers": Bound(1, MAX_LAYERS, "layers of a model"),
    "parts": Bound(1, MAX_RANKS, "ranks of a world"),
    "replication": Bound(1, MAX_RANKS, "ranks of a world"),
    "sampler_workers": Bound(1, MAX_SAMPLER_WORKERS, "sampler threads of a rank"),
    "prefetch": Bound(1, MAX_PREFETCH, "macrobatches held ahead"),
}


def check_bounds(args) -> None:
    """Refuse (:class:`InputError`, exit 2) a flag of :data:`BOUNDS` outside its range, naming
    the flag and the range; a flag the tool lacks, or left unset (None), is skipped. Every
    tool calls it first, before anything is loaded, spawned or written: an unbounded count
    would otherwise reach a C library (an overflow, exit 1), an allocation (MemoryError) or
    a loop that never ends."""
    for name, bound in BOUNDS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if value < bound.lo:
            raise InputError(f"{flag} must be >= {bound.lo}, got {value}")
        if value > bound.hi:
            raise InputError(f"{flag} must be at most {bound.hi:,} ({bound.why}), "
                             f"got {value:,}")


# ---------------------------------------------------------------- the memory limit
def add_max_memory_arg(p) -> None:
    """``--max-memory SIZE``, the flag every memory refusal names (``datasets/limits.py``):
    every tool that loads or sizes a graph has it."""
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="largest memory an input may need before it is refused, e.g. 64GiB "
                        "(default: env GNNPAR_MAX_BYTES, else 80%% of this machine's memory)")


def max_memory_bytes(text: "str | None") -> "float | None":
    """``--max-memory``'s value ``text`` checked, in bytes (None when not given): what the
    flag checks judge sizes by. Checking changes nothing; :func:`apply_max_memory` makes it
    the limit of the work."""
    if text is None:
        return None
    try:
        value = parse_bytes(text)
    except InputError as e:
        raise InputError(f"--max-memory: {e}") from None
    if value <= 0:
        raise InputError(f"--max-memory must be > 0, got {text}")
    return value


def apply_max_memory(text: "str | None") -> None:
    """Make ``--max-memory``'s value ``text`` (checked, :func:`max_memory_bytes`) the limit of
    the work about to start: put in the environment (``GNNPAR_MAX_BYTES``), where this
    process's size checks, its forked jobs and its spawned ranks read it. Called when the
    work starts, after the flags are checked (the checks themselves write nothing)."""
    value = max_memory_bytes(text)
    if value is not None:
        os.environ[MAX_BYTES_ENV] = repr(float(value))


def run_cli(body: Callable[[], int], debug: bool, prog: str) -> int:
    """Run ``body``; bad input → one line on stderr and exit 2, a peer lost before it joined
    (:class:`LostRank`) → one line and exit 3, other errors → exit 1.

    Bad input is :class:`InputError` (argparse exits 2 itself): code that reads a path the
    user gave checks it and raises InputError; and a write that found the disk full (no space,
    a quota, ``ulimit -f``): exit 2 naming the path. Any other error — a FileNotFoundError in
    the middle of training included — is an internal error (exit 1), never blamed on the
    user's input. Tracebacks are shown only with ``--debug``.
    """
    try:
        return body() or EXIT_OK
    except InputError as e:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LostRank as e:
        if debug:
            traceback.print_exc()
        print(f"{prog}: lost rank: {_one_line(e)}", file=sys.stderr)
        return EXIT_LOST_RANK
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the last line of defence of a CLI
        if debug:
            traceback.print_exc()
        if is_disk_full(e):  # the user's disk, not a bug: say which path found it full
            print(f"{prog}: error: {_one_line(disk_full_message(e))}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"{prog}: internal error: {type(e).__name__}: {_one_line(e)} (rerun with --debug "
              "for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, FileNotFoundError) and e.filename:
        text = f"no such file or directory: {e.filename}"
    return " ".join(text.split())


class JsonLog:
    """Writes one JSON object per line, flushed each time (safe to ``tail -f``).

    Every line is strict JSON: a float that is not finite (a diverged loss, an accuracy not
    evaluated) is written as ``null``. ``resume_epoch`` (a resumed run's first epoch): the
    existing log is first cut back, atomically, to the records of the epochs before it, and
    the run appends from there, so no epoch is logged twice.
    """

    def __init__(self, path: Optional[str], append: bool = False,
                 resume_epoch: Optional[int] = None):
        self.f = None
        if path:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            if resume_epoch is not None:
                cut_log(path, resume_epoch)
                append = True
            self.f = open(path, "a" if append else "w", encoding="utf-8")

    def write(self, obj: dict) -> None:
        if self.f is not None:
            self.f.write(json_line(obj) + "\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def json_line(obj) -> str:
    """``obj`` as one line of strict JSON: non-finite floats become ``null``."""
    return json.dumps(_finite(obj), sort_keys=False, allow_nan=False)


def _finite(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def epoch_records(path: str, before: int):
    """``(line, record)`` of each epoch record of the log at ``path`` with ``epoch`` <
    ``before``, in file order: final records and unreadable lines (a run killed mid-write
    leaves half a line) are skipped."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if (isinstance(rec, dict) and not rec.get("final")
                    and isinstance(rec.get("epoch"), int) and rec["epoch"] < before):
                yield line, rec


def cut_log(path: str, epoch: int) -> int:
    """Keep only the epoch records of ``path`` with ``epoch`` < ``epoch`` (no final record, no
    unreadable line — a run killed mid-write leaves half a line), rewritten atomically: a
    temporary file in the same folder replaces the log. A path that is no regular file
    (``/dev/stdout``) is left alone. Returns the number of records kept."""
    if not os.path.isfile(path):
        return 0
    kept = [line if line.endswith("\n") else line + "\n"
            for line, _ in epoch_records(path, epoch)]
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return len(kept)


def progress(total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr when ``enabled`` and stderr is a terminal, else a no-op object."""
    if enabled and sys.stderr.isatty():
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)
    return _NoBar()


class _NoBar:
    def update(self, n=1):
        pass

    def set_postfix(self, *a, **k):
        pass

    def close(self):
        pass
