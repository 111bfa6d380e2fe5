"""CSR × dense on CPUs: a parallel row-blocked kernel compiled by numba.

``Z = A · H`` with A an ``n_dst × n_src`` CSR matrix and H (n_src, f) float32 (or bf16, see
below). The rows of A are cut into blocks of equal non-zero counts (R-MAT rows are very
uneven, so equal row counts would leave one thread with most of the work), a few blocks per
thread; each thread walks its rows and, for each entry a_ic, adds a_ic · H[c] into row i of
Z, the f-wide inner loop vectorised, in one pass over the entries with the output row held in
cache and no per-call setup.

**Arithmetic, chosen on purpose.** Each row's entries are added in CSR order in float32, each
product rounded before it is added: no fused multiply-add (numba does not contract a multiply
and an add unless told to). A product therefore has the same bits on every x86-64 CPU, with
or without FMA units, at every thread count (a row is never split between threads). torch's
CSR product (MKL) adds in the same order but fuses the multiply and the add on CPUs that have
FMA, so its last bits depend on the CPU, within the rounding of the sum (``tests/exact.py``
states the bound); the tests hold the kernel to a sequential sum in its own arithmetic, bit
for bit, and torch within that bound.

**Which product serves a call** (``GNNPAR_SPMM``). ``auto`` (the default) follows a size rule
per feature dtype, ``(min_width, min_work)``: the kernel serves the float32 and bf16 products
at least ``min_width`` wide with at least ``min_work`` multiply-adds, torch's product the
rest. Which side is faster depends on the CPU: on some, MKL's product was faster at every
width measured, on others this kernel on wide, large products (``docs/performance.md``). So
the rule is measured on the machine, once per CPU, library versions and thread count, by the
first product large enough to be decided by it, and kept in a small cache file that later
processes read (:mod:`gnnpar.kernels.cpu_spmm_probe`). Where it cannot be measured or kept,
and for products smaller than any the probe measures, the fixed :data:`SIZE_RULE` serves.
``fixed`` follows :data:`SIZE_RULE` alone, never probing. torch's product is ``addmm`` into
the given output, or into an empty one, not ``torch.sparse.mm``, which zeroes a fresh CPU
output, multiplies into another and copies it over; MKL has no bf16 product, so torch's path
widens H to a float32 copy first. ``numba`` sends every float32 and bf16 product to the
kernel: the same bits on every x86-64 CPU, so a run and its checkpoints reproduce on a
machine with another instruction set. ``torch`` sends every product to torch. Whichever side
serves, the two differ only within the rounding of the sum (both add in CSR order), and a
process keeps the rule it looked up, so its products do not change sides mid-run.

:func:`csr_mm` is the one entry every local product uses (:mod:`gnnpar.kernels.local` and
each distributed kernel's local part). On CUDA it uses ``torch.sparse.mm`` (cuSPARSE), or the
Triton kernel of :mod:`gnnpar.kernels.triton_spmm` with ``GNNPAR_SPMM_GPU=triton``; on the
CPU this kernel or torch's product as above (torch's for dtypes other than float32 and bf16,
and without numba).
Writes into a given ``out`` that torch cannot see (the kernels write through numpy views or
raw pointers) bump ``out``'s version counter, so autograd still refuses a backward through a
tensor that was saved and then overwritten.

Narrow features (bf16 or fp16 H, ``--precision bf16``) with a float32 A are summed in float32
and the sum rounded once to H's dtype, on every path. This kernel reads bf16 rows at their
own width (a bf16 is the top half of a float32: widening is a shift) and sums them in the
float32 kernel's order, so it gives the bits of the widened float32 product, rounded, with
half the gather traffic. The Triton kernel gathers bf16/fp16 likewise; elsewhere (fp16 on the
CPU, cuSPARSE, ``torch.sparse.mm``) H is widened to a float32 copy and the product of the
copy rounded.
Calls are serialised by a lock: numba's default thread pool must not be entered by two
threads at once (the sampler threads never multiply, but a user's might).

The pool is sized to the process's torch threads (:func:`size_pool`, called as a rank starts)
rather than numba's default of every core, and :func:`run_parallel` keeps torch's thread count
as it was: numba's OpenMP layer, when its pool starts, sets the OpenMP thread count that torch
shares to the pool's size, which would leave a one-thread rank running every later torch op on
all the host's cores (``docs/performance.md`` has what that cost on a 16-core host).

Shapes: ``indptr`` (n_dst+1,), ``indices`` (nnz,) int32 or int64, ``values`` (nnz,)
float32, H (n_src, f) float32 or bf16 → Z (n_dst, f) in H's dtype.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Optional

import numpy as np
import torch
from torch.profiler import record_function

from . import cpu_spmm_probe, triton_spmm
from .jit import compile_module, numba_installed

#: blocks per thread: enough to even out rows of unequal cost, few enough to stay cheap
BLOCKS_PER_THREAD = 8
ENV = "GNNPAR_SPMM"
_LOCK = threading.Lock()
prange = range  # numba.prange once the kernels are compiled (gnnpar.kernels.jit)
# the compiled kernels, set by _compiled()
spmm_blocks = spmm_blocks_bf16 = None


def _spmm_blocks(indptr, indices, values, h, out, bounds):  # pragma: no cover - compiled
    f = h.shape[1]
    for b in prange(bounds.shape[0] - 1):
        for i in range(bounds[b], bounds[b + 1]):
            acc = out[i]
            for j in range(f):
                acc[j] = 0.0
            for e in range(indptr[i], indptr[i + 1]):
                v = values[e]
                row = h[indices[e]]
                for j in range(f):
                    acc[j] += v * row[j]


def _spmm_blocks_bf16(indptr, indices, values, h, out, bounds):  # pragma: no cover
    # h, out: the bf16 bit patterns as uint16. A bf16 is the top half of a float32, so
    # widening is a shift; each row is summed in float32 as the float32 kernel sums it
    # and rounded once, to nearest even as torch rounds (NaN → torch's quiet NaN).
    f = h.shape[1]
    for b in prange(bounds.shape[0] - 1):
        acc = np.empty(f, np.float32)
        acc_bits = acc.view(np.uint32)
        wide = np.empty(f, np.uint32)
        wide_f = wide.view(np.float32)
        for i in range(bounds[b], bounds[b + 1]):
            for j in range(f):
                acc[j] = 0.0
            for e in range(indptr[i], indptr[i + 1]):
                v = values[e]
                row = h[indices[e]]
                for j in range(f):
                    wide[j] = np.uint32(row[j]) << np.uint32(16)
                for j in range(f):
                    acc[j] += v * wide_f[j]
            o = out[i]
            for j in range(f):
                bits = acc_bits[j]
                if (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                    o[j] = np.uint16(0x7FC0)
                else:
                    o[j] = np.uint16((bits + np.uint32(0x7FFF)
                                      + ((bits >> np.uint32(16)) & np.uint32(1)))
                                     >> np.uint32(16))


@functools.lru_cache(maxsize=None)
def _compiled():
    """``(numba, {dtype: kernel})``, made on first use: importing numba takes most of a
    second, which no process that never multiplies on a CPU (a launcher, ``--help``) should
    pay; the kernels are module-level functions (:func:`gnnpar.kernels.jit.compile_module`),
    so their machine code is cached on disk (``cache=True``). One dict per process: every
    product looks its kernel up there."""
    import numba
    kernels = compile_module(__name__, ("spmm_blocks", "spmm_blocks_bf16"), parallel=True,
                             cache=True, nogil=True)
    return numba, {torch.float32: kernels.spmm_blocks, torch.bfloat16: kernels.spmm_blocks_bf16}


def available() -> bool:
    """Whether the compiled kernel serves CPU products here (numba is a dependency; the
    fallback keeps a broken or missing install working). Ranks launched by ``mpirun`` use it
    too: their process groups are shut down before the thread pool at exit
    (:func:`gnnpar.kernels.comm.import_dynamo_first`), so its threads end cleanly."""
    return mode() != "torch" and numba_installed()


#: the values of ``GNNPAR_SPMM`` (see the module docstring)
MODES = ("auto", "fixed", "numba", "torch")


def mode() -> str:
    """``GNNPAR_SPMM``: ``auto`` unless set; an unknown value is an error, not a silent
    default (a typo must not change which arithmetic a run uses)."""
    value = os.environ.get(ENV, "auto")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: use one of {', '.join(MODES)}")
    return value


def row_blocks(indptr: np.ndarray, parts: int) -> np.ndarray:
    """``parts + 1`` row bounds cutting the rows into blocks of about equal non-zeros."""
    n = indptr.shape[0] - 1
    nnz = int(indptr[-1])
    if n == 0:
        return np.zeros(2, np.int64)
    targets = (np.arange(1, parts, dtype=np.float64) * (nnz / parts)).astype(np.int64)
    cuts = np.searchsorted(indptr, targets, side="left").clip(0, n)
    return np.unique(np.concatenate([[0], cuts, [n]])).astype(np.int64)


#: per feature dtype, ``(min_width, min_work)``: the kernel serves a product at least
#: ``min_width`` wide with at least ``min_work`` multiply-adds (nnz·width), torch's product
#: the rest; a dtype not listed always goes to torch. The fixed rule: ``GNNPAR_SPMM=fixed``
#: follows it alone, ``auto`` where the machine's rule cannot be measured or kept and for
#: products smaller than the probe's (:func:`kernel_picked`). float32 is not listed: on the
#: machine it was derived on MKL's product into a reused output was faster at every width and
#: size swept. bf16: the kernel reads the rows at their width and won on wide, large products,
#: torch's widened copy below. ``scripts/bench_spmm.py --size-rule`` measures the crossover;
#: ``docs/performance.md`` has the figures behind these values.
SIZE_RULE = {torch.bfloat16: (128, 1 << 26)}
#: the dtypes the kernel multiplies, and so the ones whose rule is measured
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
_RULES: dict = {}  # (dtype, threads) -> this process's measured rule
_RULES_LOCK = threading.Lock()


def machine_rule(dtype: torch.dtype) -> Optional[tuple]:
    """``(min_width, min_work)``, or None for never the kernel: the rule ``GNNPAR_SPMM=auto``
    follows for ``dtype`` at the current torch thread count, from the machine's cached probe
    (:func:`gnnpar.kernels.cpu_spmm_probe.measured_rule`, which probes once if need be,
    under a lock shared by the processes of the machine), else :data:`SIZE_RULE`'s. Looked
    up once per process and thread count."""
    key = (dtype, torch.get_num_threads())
    try:
        return _RULES[key]
    except KeyError:
        pass
    with _RULES_LOCK:
        if key not in _RULES:
            _RULES[key] = cpu_spmm_probe.measured_rule(
                dtype, key[1], kernel_product, probe_torch_product, SIZE_RULE.get(dtype))
        return _RULES[key]


def kernel_picked(dtype: torch.dtype, width: int, nnz: int) -> bool:
    """Whether the size rule gives a product of ``nnz`` entries, ``width`` wide, in
    ``dtype`` to the kernel: the machine's measured rule (:func:`machine_rule`), or
    :data:`SIZE_RULE` under ``GNNPAR_SPMM=fixed`` and for a product smaller than any the
    probe measures (so a small product never starts the probe)."""
    if dtype not in KERNEL_DTYPES:
        return False
    work = nnz * width
    if mode() == "fixed" or not cpu_spmm_probe.measurable(width, work):
        rule = SIZE_RULE.get(dtype)
    else:
        rule = machine_rule(dtype)
    return rule is not None and width >= rule[0] and work >= rule[1]


def _usable(A: torch.Tensor, h: torch.Tensor) -> bool:
    if not (available() and A.device.type == "cpu" and h.device.type == "cpu"
            and A.layout == torch.sparse_csr and A.dtype == torch.float32
            and h.dtype in (torch.float32, torch.bfloat16) and h.dim() == 2):
        return False
    return mode() == "numba" or kernel_picked(h.dtype, h.shape[1], A.values().shape[0])


def _bits(t: torch.Tensor) -> np.ndarray:
    """The numba kernel's view of ``t``: itself for float32, the bit patterns (uint16) for
    bf16, which numpy has no type for."""
    t = t.detach()
    return t.numpy() if t.dtype == torch.float32 else t.view(torch.int16).numpy().view(np.uint16)


#: feature dtypes summed in float32 and returned in their own dtype
NARROW = (torch.bfloat16, torch.float16)


def csr_mm(A: torch.Tensor, h: torch.Tensor, out: Optional[torch.Tensor] = None
           ) -> torch.Tensor:
    """``A @ h`` for a CSR tensor A (into ``out`` when given, same shape and dtype as the
    result), in h's dtype; bf16/fp16 h with float32 A is summed in float32. No autograd: the
    callers are autograd Functions that give the backward themselves. Runs with autocast
    off: the callers run inside the training step's autocast region, where CPU and CUDA
    autocast would cast A itself to bf16 for ``torch.sparse.mm`` (MKL has no bf16 sparse
    product, and bf16 Â values would lose the fp32 sums' point). Each call is a profiler
    range, ``gnnpar::csr_mm``, so ``scripts/profile_epoch.py`` counts torch's ``addmm``
    inside it as a sparse product, not a dense one."""
    with torch.autocast(h.device.type, enabled=False), record_function("gnnpar::csr_mm"):
        return _product(A, h, out)


def _product(A: torch.Tensor, h: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    if triton_spmm.selected(h) and A.layout == torch.sparse_csr:
        return written(triton_spmm.csr_mm(A, h, out))
    if h.dtype in NARROW and A.dtype == torch.float32 and not _usable(A, h):
        z = _product(A, h.float(), None)
        return z.to(h.dtype) if out is None else out.copy_(z)
    if not _usable(A, h):
        return torch_product(A, h, out)
    return kernel_product(A, h, out)


#: bytes of product per row block of :func:`add_csr_mm`
ADD_BLOCK_BYTES = 32 << 20


def add_csr_mm(y: torch.Tensor, A: torch.Tensor, h: torch.Tensor,
               block_bytes: int = ADD_BLOCK_BYTES) -> torch.Tensor:
    """``y += A @ h`` in place (``y`` returned), as :func:`csr_mm` computes ``A @ h``.

    On the CPU in row blocks of about ``block_bytes`` of product, added as each is made: one
    block-sized buffer instead of a second tensor of ``y``'s size beside it (a rank's halo
    product is as tall as its rows). The side that serves the product (the size rule) is
    picked once, for the whole of ``A``, and each row's sum is taken alone on either side, so
    ``y`` gets the bits of ``y.add_(csr_mm(A, h))``. On CUDA, and where ``h`` would be
    widened to float32 for torch's product (per block, that copy would be made again each
    time), one product."""
    n, width = int(A.shape[0]), int(h.shape[1])
    rows = max(1, int(block_bytes) // max(1, width * y.element_size()))
    if n <= rows or A.device.type != "cpu" or A.layout != torch.sparse_csr \
            or h.dtype != y.dtype or triton_spmm.selected(h):
        return y.add_(csr_mm(A, h))
    with torch.autocast(h.device.type, enabled=False), record_function("gnnpar::csr_mm"):
        if _usable(A, h):
            side = kernel_product
        elif h.dtype == torch.float32 and A.dtype == torch.float32:
            side = torch_product
        else:
            return y.add_(_product(A, h, None))
        crow, col, val = A.crow_indices(), A.col_indices(), A.values()
        buf = torch.empty((rows, width), dtype=y.dtype)
        for a in range(0, n, rows):
            b = min(n, a + rows)
            lo, hi = int(crow[a]), int(crow[b])
            block = torch.sparse_csr_tensor(crow[a:b + 1] - lo, col[lo:hi], val[lo:hi],
                                            (b - a, int(A.shape[1])))
            y[a:b].add_(side(block, h, buf[:b - a]))
    return y


def torch_product(A: torch.Tensor, h: torch.Tensor, out: Optional[torch.Tensor]
                  ) -> torch.Tensor:
    """torch's product of A and h, in their dtypes (into ``out`` when given)."""
    if out is None and A.device.type == "cpu" and A.layout == torch.sparse_csr:
        # torch.sparse.mm would zero a fresh output, multiply into another, then copy
        out = torch.empty((A.shape[0], h.shape[1]), dtype=torch.result_type(A, h))
    if out is None:
        return torch.sparse.mm(A, h)
    return torch.addmm(out, A, h, beta=0, out=out)


def probe_torch_product(A: torch.Tensor, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """torch's side as the probe times it: :func:`torch_product`, for bf16 ``h`` on its
    widened float32 copy, rounded into ``out`` (what a bf16 product torch serves costs)."""
    if h.dtype in NARROW:
        return out.copy_(torch_product(A, h.float(), None))
    return torch_product(A, h, out)


def kernel_product(A: torch.Tensor, h: torch.Tensor, out: Optional[torch.Tensor]
                   ) -> torch.Tensor:
    """The compiled kernel's product of a float32 CPU CSR A and float32 or bf16 h, whatever
    the size rule says (into ``out`` when given)."""
    h = h.detach().contiguous()
    n_dst, f = A.shape[0], h.shape[1]
    if out is None:
        out = torch.empty((n_dst, f), dtype=h.dtype)
    if n_dst == 0 or f == 0:
        return out.zero_()
    indptr = A.crow_indices().numpy()
    numba, kernels = _compiled()
    threads = pool_threads(numba)
    run_parallel(numba, threads, kernels[h.dtype], indptr, A.col_indices().numpy(),
                 A.values().detach().numpy(), _bits(h), _bits(out),
                 row_blocks(indptr, threads * BLOCKS_PER_THREAD))
    return written(out)


def written(out: torch.Tensor) -> torch.Tensor:
    """``out`` with its version counter bumped, after a write torch did not see (a numpy view
    or a raw pointer): a tensor autograd saved before the write then fails its backward's
    version check instead of giving a wrong gradient."""
    torch.autograd.graph.increment_version(out)
    return out


def size_pool(threads: int) -> None:
    """Give numba's thread pool ``threads`` threads when it starts (this process's share of
    the cores; see the module docstring). Takes effect if the pool has not started yet — it
    starts on the first compiled parallel call — and changes nothing after that."""
    threads = max(1, int(threads))
    os.environ["NUMBA_NUM_THREADS"] = str(threads)  # read when numba is imported
    parallel = sys.modules.get("numba.np.ufunc.parallel")
    if parallel is not None and not getattr(parallel, "_is_initialized", True):
        sys.modules["numba"].config.NUMBA_NUM_THREADS = threads  # imported, not started
        parallel.NUM_THREADS = threads


def pool_threads(numba) -> int:
    """Threads a compiled call may use: torch's intra-op count, within numba's pool."""
    return max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))


def run_parallel(numba, threads: int, kernel, *args):
    """Call a compiled ``parallel=True`` kernel on ``threads`` of numba's pool, one call at a
    time (the pool must not be entered by two threads at once; see the module docstring).

    torch's thread count is put back if the call changed it: numba's OpenMP pool, started by
    the first call, sets the OpenMP thread count that torch shares to the pool's size, which
    turned one-thread ranks into ranks using every core."""
    with _LOCK:
        torch_threads = torch.get_num_threads()
        numba.set_num_threads(threads)
        try:
            return kernel(*args)
        finally:
            if torch.get_num_threads() != torch_threads:
                torch.set_num_threads(torch_threads)
