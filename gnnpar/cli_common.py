"""What every gnnpar command shares: exit codes, one-line errors, progress, JSON lines."""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import traceback
from typing import Callable, Optional

from gnnpar.datasets import InputError

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT = 0, 1, 2
#: training stopped because the loss became NaN or infinite (3 is a lost peer, 143 a
#: SIGTERM preemption, both in ``gnnpar.watchdog``; 130 an interrupt)
EXIT_DIVERGED = 4


def run_cli(body: Callable[[], int], debug: bool, prog: str) -> int:
    """Run ``body``; bad input → one line on stderr and exit 2, other errors → exit 1.

    Bad input is :class:`InputError` alone (argparse exits 2 itself): code that reads a path
    the user gave checks it and raises InputError. Any other error — a FileNotFoundError in
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
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the last line of defence of a CLI
        if debug:
            traceback.print_exc()
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


def cut_log(path: str, epoch: int) -> int:
    """Keep only the epoch records of ``path`` with ``epoch`` < ``epoch`` (no final record, no
    unreadable line — a run killed mid-write leaves half a line), rewritten atomically: a
    temporary file in the same folder replaces the log. A path that is no regular file
    (``/dev/stdout``) is left alone. Returns the number of records kept."""
    if not os.path.isfile(path):
        return 0
    kept = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if (isinstance(rec, dict) and not rec.get("final")
                    and isinstance(rec.get("epoch"), int) and rec["epoch"] < epoch):
                kept.append(line if line.endswith("\n") else line + "\n")
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
