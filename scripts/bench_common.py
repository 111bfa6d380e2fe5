"""What every benchmark script prints beside its figures: the commit it ran at and the load."""
from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit() -> str:
    """The short commit of the checkout, ``+dirty`` when it has uncommitted changes (a figure
    from a dirty tree is not the commit's), or ``unknown``."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        if head.returncode != 0:
            return "unknown"
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
        return head.stdout.strip() + ("+dirty" if st.returncode != 0 or st.stdout.strip()
                                      else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def load() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]
