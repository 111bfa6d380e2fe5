"""Peak memory of this process (and, in a distributed run, the largest over ranks)."""
from __future__ import annotations

import resource
import sys

import torch


def local_peak_bytes(device=None) -> int:
    """Peak GPU bytes allocated on a CUDA device, else the process's peak resident set."""
    if device is not None and torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def peak_memory_bytes(device=None, rt=None) -> int:
    """Largest rank's peak; ``rt.all_reduce_max`` is used when the runtime has it."""
    mine = local_peak_bytes(device)
    if rt is not None and hasattr(rt, "all_reduce_max"):
        return int(rt.all_reduce_max(mine))
    return mine
