"""What every gnnpar command shares: exit codes, one-line errors, progress, JSON lines."""
from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Callable, Optional

from gnnpar.datasets import InputError

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT = 0, 1, 2


def run_cli(body: Callable[[], int], debug: bool, prog: str) -> int:
    """Run ``body``; bad input → one line on stderr and exit 2, other errors → exit 1.

    Tracebacks are shown only with ``--debug``.
    """
    try:
        return body() or EXIT_OK
    except (InputError, FileNotFoundError) as e:
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
    """Appends one JSON object per line, flushed each time (safe to ``tail -f``)."""

    def __init__(self, path: Optional[str], append: bool = False):
        self.f = None
        if path:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            self.f = open(path, "a" if append else "w", encoding="utf-8")

    def write(self, obj: dict) -> None:
        if self.f is not None:
            self.f.write(json.dumps(obj, sort_keys=False) + "\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


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
