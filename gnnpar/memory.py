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


def peak_memory_bytes(device=None, reduce_max=None) -> int:
    """This rank's peak, or the largest over ranks through ``reduce_max(int) -> int``."""
    mine = local_peak_bytes(device)
    return int(reduce_max(mine)) if reduce_max is not None else mine
