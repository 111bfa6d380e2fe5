"""Memory of this process and of every rank: peaks, the baseline before any data, and the
bytes of a rank's data, for the JSON log (``docs/architecture.md``, "JSON log").

On a CUDA device the numbers are torch's allocations on the device
(``max_memory_allocated``, ``memory_allocated``). On the host they are the resident set:
on Linux ``VmHWM`` (peak) and ``VmRSS`` (now) of ``/proc/self/status``, which count this
process only. ``getrusage``'s ``ru_maxrss`` is the fallback elsewhere; on Linux it is not
used, since a process started by ``exec`` (the spawned and the launched ranks) inherits in it
the high-water mark of the process that started it (a launcher that loaded the dataset to
write the shards would show its peak in every rank's).

:class:`RankMemory` gathers each rank's numbers with one all-reduce of a small int64 tensor
(each rank fills its own row, the sum gives every row): the constant ones (baseline, shard
and halo bytes) once, the peaks once per epoch.
"""
from __future__ import annotations

import resource
import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

_STATUS = "/proc/self/status"


def _status_bytes(key: str) -> Optional[int]:
    """``key`` (``VmHWM``, ``VmRSS``) of ``/proc/self/status`` in bytes; None without it."""
    try:
        with open(_STATUS) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024  # always kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _rusage_peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def local_peak_bytes(device=None) -> int:
    """Peak GPU bytes allocated on a CUDA device, else this process's peak resident set."""
    if _is_cuda(device):
        return int(torch.cuda.max_memory_allocated(device))
    hwm = _status_bytes("VmHWM")
    return hwm if hwm is not None else _rusage_peak()


def local_current_bytes(device=None) -> int:
    """GPU bytes allocated now on a CUDA device, else this process's resident set now
    (without ``/proc``: the peak so far, an upper bound)."""
    if _is_cuda(device):
        return int(torch.cuda.memory_allocated(device))
    rss = _status_bytes("VmRSS")
    return rss if rss is not None else _rusage_peak()


def peak_memory_bytes(device=None, reduce_max=None) -> int:
    """This rank's peak, or the largest over ranks through ``reduce_max(int) -> int``."""
    mine = local_peak_bytes(device)
    return int(reduce_max(mine)) if reduce_max is not None else mine


def array_bytes(obj) -> int:
    """Bytes of every numpy array (or tensor) among ``obj``'s attributes, the arrays in a
    dict attribute (a shard's ``values``) included: a shard's arrays as loaded (memory-mapped
    or not)."""
    total = 0
    for value in vars(obj).values():
        items = value.values() if isinstance(value, dict) else (value,)
        for a in items:
            if isinstance(a, np.ndarray):
                total += int(a.nbytes)
            elif isinstance(a, torch.Tensor):
                total += int(a.numel() * a.element_size())
    return total


def spmm_width(widths: Sequence[int]) -> int:
    """The widest feature width any layer's SpMM runs at, for layer widths ``widths``
    (``[f_in, hidden, …, f_out]``): every layer (GCN, SAGE) multiplies by Â at the narrower
    of its input and output widths (:mod:`gnnpar.nn.models`)."""
    return max(min(a, b) for a, b in zip(widths[:-1], widths[1:]))


def halo_row_bytes(n_halo: int, widths: Sequence[int], precision: str = "fp32") -> int:
    """Bytes of the halo rows one SpMM of the 1D halo kernel holds: ``n_halo`` rows of the
    widest SpMM width (:func:`spmm_width`), 2 bytes each element under ``--precision bf16``
    (the operator takes its features in the autocast dtype), else 4. The forward receives
    them; the backward sends back a buffer of the same size; neither outlives its product."""
    return int(n_halo) * spmm_width(widths) * (2 if precision == "bf16" else 4)


def gather_ints(values: Sequence[int], rank: int, world: int,
                reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> List[List[int]]:
    """Every rank's ``values`` (the same count on every rank), index = rank: one all-reduce
    (sum) of a (world, k) int64 tensor in which each rank fills its own row."""
    t = torch.zeros((world, len(values)), dtype=torch.int64)
    t[rank] = torch.tensor([int(v) for v in values], dtype=torch.int64)
    return [[int(v) for v in row] for row in reduce_sum(t).tolist()]


def data_ratios(peaks: Sequence[int], baselines: Sequence[int], shard: Sequence[int],
                halo: Sequence[int]) -> Dict[str, float]:
    """``peak_over_data_max`` (largest peak / (shard + halo rows) of any rank) and
    ``peak_net_over_data_max`` (the same with each rank's baseline taken off its peak)."""
    data = [max(s + h, 1) for s, h in zip(shard, halo)]
    return {"peak_over_data_max": max(p / d for p, d in zip(peaks, data)),
            "peak_net_over_data_max": max((p - b) / d
                                          for p, b, d in zip(peaks, baselines, data))}


#: the per-rank lists :class:`RankMemory` logs (``peak_mem_bytes_ranks`` changes each epoch)
RANK_LISTS = ("peak_mem_bytes_ranks", "baseline_mem_bytes_ranks", "shard_bytes_ranks",
              "halo_row_bytes_ranks")


class RankMemory:
    """One rank's memory facts, logged for every rank.

    ``baseline``: this rank's memory before it loaded any data (:func:`local_current_bytes`
    right after the imports and the device); ``shard_bytes``/``halo_bytes`` (None: not
    known, e.g. mini batch): the rank's data (:func:`array_bytes` of its shard,
    :func:`halo_row_bytes`). :meth:`setup` gathers the constants (once, on every rank at the
    same point); :meth:`record` each epoch's fields (every rank, at the same point)."""

    def __init__(self, rank: int, world: int, device, baseline: int,
                 shard_bytes: Optional[int] = None, halo_bytes: Optional[int] = None):
        self.rank, self.world, self.device = int(rank), int(world), device
        self.mine = [int(baseline)] + ([int(shard_bytes), int(halo_bytes)]
                                       if shard_bytes is not None else [])
        self.fixed: Optional[Dict[str, List[int]]] = None

    def setup(self, reduce_sum) -> None:
        rows = gather_ints(self.mine, self.rank, self.world, reduce_sum)
        self.fixed = {"baseline_mem_bytes_ranks": [r[0] for r in rows]}
        if len(self.mine) == 3:
            self.fixed["shard_bytes_ranks"] = [r[1] for r in rows]
            self.fixed["halo_row_bytes_ranks"] = [r[2] for r in rows]

    def record(self, reduce_sum) -> dict:
        """``peak_mem_bytes`` (largest rank), ``peak_mem_bytes_ranks``, the constant lists and
        the ratios (:func:`with_ratios`)."""
        if self.fixed is None:
            self.setup(reduce_sum)
        peaks = [r[0] for r in gather_ints([local_peak_bytes(self.device)], self.rank,
                                            self.world, reduce_sum)]
        return with_ratios({"peak_mem_bytes": max(peaks), "peak_mem_bytes_ranks": peaks,
                            **self.fixed})


def with_ratios(rec: dict) -> dict:
    """``rec`` with :func:`data_ratios` of its lists added, when it has the data lists."""
    if "shard_bytes_ranks" not in rec or "peak_mem_bytes_ranks" not in rec:
        return rec
    return {**rec, **data_ratios(rec["peak_mem_bytes_ranks"], rec["baseline_mem_bytes_ranks"],
                                 rec["shard_bytes_ranks"], rec["halo_row_bytes_ranks"])}


def merge_rank_peaks(records: Sequence[dict]) -> dict:
    """The run's per-rank fields over ``records`` (epoch records, or an earlier segment's
    totals): each rank's largest peak, the last constants, the ratios of those. Empty when no
    record has ``peak_mem_bytes_ranks``."""
    have = [r for r in records if isinstance(r.get("peak_mem_bytes_ranks"), list)]
    if not have:
        return {}
    out = {k: have[-1][k] for k in RANK_LISTS if k in have[-1]}
    out["peak_mem_bytes_ranks"] = [max(col) for col in
                                   zip(*(r["peak_mem_bytes_ranks"] for r in have))]
    return with_ratios(out)
