"""Progress lines for long ingestion phases, at most one every few seconds.

Generators and readers take an optional ``progress(msg)`` callable (the command line passes
its printer); :func:`throttled` wraps it so that the per-chunk calls of a phase print only
when enough time has passed, while ``force=True`` lines (phase starts and ends) always print.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

#: seconds between two unforced progress lines
INTERVAL = 5.0


def throttled(progress: Optional[Callable[[str], None]], interval: float = INTERVAL):
    """``say(msg, force=False)``: calls ``progress(msg)`` when forced or when ``interval``
    seconds passed since the last line; a no-op without ``progress``."""
    if progress is None:
        return lambda msg, force=False: None
    if getattr(progress, "throttled", False):
        return progress
    last = [time.monotonic()]

    def say(msg: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - last[0] >= interval:
            last[0] = now
            progress(msg)
    say.throttled = True
    return say
