"""Which CPU product is faster for a float32 or bf16 SpMM on this machine: measured once, kept.

Under ``GNNPAR_SPMM=auto`` (:mod:`gnnpar.kernels.cpu_spmm`) a product goes to the compiled
kernel or to torch's (MKL) by a size rule, per feature dtype a pair ``(min_width,
min_work)``: the kernel serves products at least ``min_width`` wide with at least
``min_work`` multiply-adds (nnz·width). Which product is faster depends on the CPU (its
vector width, caches and memory, MKL's code path for it) and on the thread count, so the rule
is measured on the machine at hand rather than written down once.

**The probe** (:func:`measure`). One CSR matrix, :data:`PROBE_ROWS` square with
:data:`PROBE_DEGREE` entries a row at uniformly drawn columns (a fixed seed), times H of each
width of :data:`PROBE_WIDTHS`, in the dtype asked for, at the calling process's torch thread
count. The matrix is as tall as a graph whose H does not fit a CPU's last-level cache at the
wider widths (2¹⁷ rows: 32 MiB of H at width 64), because that is where the sides part: a
product whose H stays in cache favours MKL on some CPUs, one that gathers rows from memory
favours the kernel, and the large products are the ones a step's time is made of (on a
2-core AMD EPYC, a probe of 2¹⁴ rows gave every width to MKL while the kernel served a
2.6 · 10⁵-row graph's width-64 product in 0.65 × MKL's time: ``docs/performance.md``). Both
sides write into a reused output, as the library calls them. Each width is timed on both
sides back to back, the order alternating: a warm-up round first (it compiles or loads the
kernel), then :data:`PROBE_ROUNDS` rounds, and each side's best time is kept: the question
is which side is faster, and the least disturbed run answers it. One width's H and output
are held at a time (at most 2 × 64 MiB). The kernel takes a width where its time is under
:data:`MARGIN` × torch's. The rule (:func:`rule_of`) gives the kernel the products at least
as wide as the narrowest probed width from which it wins at every wider probed width, and
at least as large as the probe's product at that width; products narrower or smaller than
that were not measured and follow the fixed rule (a product wider than the widest probed
follows the widest). The probe is (:data:`PROBE_ROUNDS` + 1) × 2 × len(:data:`PROBE_WIDTHS`)
products of 2²⁰ entries (about a second), run once per machine key by the first process
whose product is large enough to be decided by it; the cache entry records what it took
(``probe_s``, numba's import and the kernel's first load included).

**The cache.** The rule is kept per machine key and dtype in the per-machine cache
(:mod:`.machine_rules`: one file, ``flock``-ed, the first of ranks that start together probes
and the others read its entry), with the times it was decided from and the load average then.
``python scripts/bench_spmm.py --probe --write`` measures again and replaces the entries (e.g.
once the machine is quiet). Where the probe cannot run or be kept, the caller's fixed rule
serves, the same everywhere.

The choice changes only a product's last bits, within the rounding of its sum: both products
add each row's entries in CSR order in float32 (``tests/exact.py`` states the bound). A run and
its resume choose alike while the cached entry stands; ``GNNPAR_SPMM`` (``torch``, ``numba``
or ``fixed``) pins the choice without probing.
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch

# the cache's names are this module's too: the rule's tests and scripts name them here
from .machine_rules import (CACHE_ENV, FILE_NAME, LOCK_WAIT_S, VERSION, _locked,  # noqa: F401
                            cache_path, decided, keep, machine_key, read_cache)

PROBE_ROWS = 1 << 17
PROBE_DEGREE = 8
PROBE_WIDTHS = (32, 64, 128)
PROBE_ROUNDS = 3
#: the kernel takes a width where its best time is under this fraction of torch's
MARGIN = 0.9

Rule = Optional[Tuple[int, int]]
#: ``(A, h, out) -> out``: one side's product into a reused output
Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def probe_nnz() -> int:
    return PROBE_ROWS * PROBE_DEGREE


def measurable(width: int, work: int) -> bool:
    """Whether a product ``width`` wide of ``work`` multiply-adds is as large as the smallest
    the probe measures: only such a product can be given to the kernel by a measured rule,
    so a smaller one never starts the probe."""
    return width >= PROBE_WIDTHS[0] and work >= probe_nnz() * PROBE_WIDTHS[0]


def probe_matrix() -> torch.Tensor:
    """The probe's CSR matrix: uniform columns, a fixed seed, sorted within each row."""
    rng = np.random.default_rng(0)
    n, d = PROBE_ROWS, PROBE_DEGREE
    cols = np.sort(rng.integers(0, n, size=(n, d)), axis=1).reshape(-1)
    indptr = np.arange(0, n * d + 1, d, dtype=np.int64)
    values = rng.random(n * d, dtype=np.float32)
    with warnings.catch_warnings():  # torch calls its CSR tensors "beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(cols),
                                       torch.from_numpy(values), (n, n),
                                       check_invariants=False)


def measure(dtype: torch.dtype, kernel_mm: Product, torch_mm: Product,
            rounds: int = PROBE_ROUNDS) -> Dict[int, Tuple[float, float]]:
    """``{width: (kernel's best seconds, torch's best seconds)}`` of the probe's product in
    ``dtype`` at the current torch thread count (see the module docstring)."""
    A = probe_matrix()
    gen = torch.Generator().manual_seed(0)
    best = {w: [float("inf"), float("inf")] for w in PROBE_WIDTHS}
    for w in PROBE_WIDTHS:  # one width's arrays at a time
        h = torch.randn(PROBE_ROWS, w, generator=gen).to(dtype)
        out = torch.empty(PROBE_ROWS, w, dtype=dtype)
        for r in range(rounds + 1):  # round 0 warms up
            for side in ((0, 1) if r % 2 else (1, 0)):
                mm = kernel_mm if side == 0 else torch_mm
                t = time.perf_counter()
                mm(A, h, out)
                t = time.perf_counter() - t
                if r:
                    best[w][side] = min(best[w][side], t)
        del h, out
    return {w: (k, t) for w, (k, t) in best.items()}


def rule_of(times: Dict[int, Tuple[float, float]]) -> Rule:
    """``(min_width, min_work)`` from :func:`measure`'s times: the narrowest probed width
    from which the kernel wins at every wider probed width, and the probe's work there;
    ``None`` (never the kernel) where it does not win at the widest."""
    chosen = None
    for w in sorted(times, reverse=True):
        kernel_s, torch_s = times[w]
        if not kernel_s < MARGIN * torch_s:
            break
        chosen = w
    return None if chosen is None else (chosen, probe_nnz() * chosen)


def _entry_rule(entry) -> Tuple[bool, Rule]:
    """``(valid, rule)`` of a cached entry; anything of another shape is not valid."""
    if not isinstance(entry, dict) or "rule" not in entry:
        return False, None
    rule = entry["rule"]
    if rule is None:
        return True, None
    if (isinstance(rule, list) and len(rule) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in rule)):
        return True, (rule[0], rule[1])
    return False, None


def cached_entry(dtype: torch.dtype, threads: int) -> Optional[dict]:
    """This machine's cached entry for ``dtype`` at ``threads`` threads, if a valid one is
    kept (read without the lock: the file is only ever replaced whole)."""
    entry = read_cache(cache_path()).get(machine_key(threads), {}).get(_name(dtype))
    return entry if _entry_rule(entry)[0] else None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def measured_rule(dtype: torch.dtype, threads: int, kernel_mm: Product, torch_mm: Product,
                  fallback: Rule) -> Rule:
    """The size rule for ``dtype`` at ``threads`` threads on this machine: the cached entry,
    else probed now and cached; ``fallback`` where that cannot be done (see the module
    docstring)."""
    return decided(_name(dtype), threads, lambda: measure(dtype, kernel_mm, torch_mm),
                   rule_of, _entry_rule, fallback)


def store(dtype: torch.dtype, threads: int, times: Dict[int, Tuple[float, float]],
          probe_s: float) -> Rule:
    """Replace this machine's cached entry for ``dtype`` at ``threads`` threads with the rule
    of ``times`` (a probe run again, ``scripts/bench_spmm.py --probe --write``); returns it.
    Processes that already read the old entry keep it until they end."""
    path = cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with _locked(path + ".lock", LOCK_WAIT_S):
        return keep(path, read_cache(path), machine_key(threads), _name(dtype), times,
                    probe_s, rule_of)
