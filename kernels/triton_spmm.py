"""CSR × dense on GPUs: a Triton row-split kernel with fp32 accumulation.

``Z = A · H``; program (p, t) computes ``ROWS`` rows of Z, one after another, for the feature
columns ``[t·BLOCK_F, (t+1)·BLOCK_F)``, walking each row ``BLOCK_E`` entries a step (a ``BLOCK_E
× BLOCK_F`` gather of the H rows the entries name, summed over the entries each step, or — a
tile's ``defer`` — added into a ``BLOCK_E × BLOCK_F`` accumulator summed once per row). H is
read at its own width (fp32, bf16 or fp16: bf16 features halve the gather traffic), the terms
are multiplied by the entry values and summed in fp32, and each row is stored once in H's dtype.
Each output row is written by exactly one program: no atomics, no partial outputs, and the same
sums in the same order on every run of a tile.

Rows are visited longest first (:func:`row_order`, computed once per matrix and kept): on
power-law graphs a hub row of 10⁴–10⁵ entries is one program's serial loop, and started last
it would run alone at the end of the launch. Longest-first is the classic list-scheduling fix,
and it puts rows of like length into one program.

cuSPARSE stays :data:`DEFAULT`: on the GPU sweep (``bench_spmm.py --device cuda --sweep``;
figures in ``docs/performance.md``) this kernel at its best tile is slower than cuSPARSE.

The tile shape (``BLOCK_F``, ``BLOCK_E``, ``ROWS``, warps, ``defer``) is tuned: the first product of
each (GPU, dtype, width class) times every :data:`CANDIDATES` tile on its own operands and
keeps the fastest for the rest of the process (:func:`tuned`; about a second per class, the
compiled tiles are cached on disk by Triton; a tile this Triton fails to compile is skipped
with a warning). ``GNNPAR_TRITON_CONFIG=BF,BE,R,W[,DEFER]`` fixes the
tile, and so does :func:`torch.use_deterministic_algorithms` (to :func:`config_for`'s): tiles
may sum a row's terms in different orders, so a tile chosen by timing can differ in the last
bits from one process to the next. ``scripts/bench_spmm.py --device cuda --sweep`` prints
every tile's time.

Selected by ``GNNPAR_SPMM_GPU`` (:func:`selected`; :func:`gnnpar.kernels.cpu_spmm.csr_mm`
routes CUDA products here then): ``triton`` uses this kernel, ``cusparse`` keeps
``torch.sparse.mm``; unset means :data:`DEFAULT`. Without Triton (CPU-only torch wheels do not
ship it) nothing here is used. The tests run the same kernel on CPU tensors in Triton's
interpreter (``TRITON_INTERPRET=1``) and compare it with ``torch.sparse.mm``.

Shapes: ``indptr`` (n_dst+1,), ``indices`` (nnz,) int32/int64, ``values`` (nnz,), H
(n_src, f) → Z (n_dst, f).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from typing import NamedTuple

import torch

ENV = "GNNPAR_SPMM_GPU"
CONFIG_ENV = "GNNPAR_TRITON_CONFIG"
#: what CUDA products use when ``GNNPAR_SPMM_GPU`` is unset
DEFAULT = "cusparse"
MODES = ("triton", "cusparse")


class Config(NamedTuple):
    """A launch's tile: feature columns per program, entries per step of a row, rows per
    program, warps per program, and ``defer``: 1 keeps a ``BLOCK_E × BLOCK_F`` accumulator and
    sums it across the entries once a row is done, 0 sums each step's products at once."""
    block_f: int
    block_e: int
    rows: int
    warps: int
    defer: int = 0


#: the tiles ``bench_spmm.py --sweep`` times and :func:`tuned` picks from (block_f is capped at
#: the width's power of two): the row-split tiles fastest on the GPU sweep at widths 64–512,
#: then deferred-sum tiles, which keep the per-step sum across threads out of the loop
CANDIDATES = tuple(Config(*c) for c in (
    (64, 16, 1, 2), (64, 32, 1, 4), (128, 32, 1, 4), (256, 16, 1, 8),
    (64, 16, 1, 2, 1), (64, 32, 1, 4, 1), (128, 16, 1, 4, 1), (256, 8, 1, 4, 1)))


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether Triton is installed (it ships with CUDA builds of torch; optional elsewhere;
    looked up once, as :func:`selected` runs on every CUDA product)."""
    return importlib.util.find_spec("triton") is not None


def mode() -> str:
    """``GNNPAR_SPMM_GPU``, or :data:`DEFAULT` when unset; ValueError for anything else."""
    m = os.environ.get(ENV) or DEFAULT
    if m not in MODES:
        raise ValueError(f"{ENV} must be one of {', '.join(MODES)}, got {m!r}")
    return m


def selected(h: torch.Tensor) -> bool:
    """Whether this CUDA product goes through this kernel."""
    return h.device.type == "cuda" and mode() == "triton" and available()


def _pow2(f: int, low: int = 16) -> int:
    b = low
    while b < f:
        b *= 2
    return b


def capped(c: Config, f: int) -> Config:
    """``c`` with no more feature columns a program than width ``f`` needs (a power of two)."""
    return c._replace(block_f=min(c.block_f, _pow2(f)))


def fixed_config() -> Config:
    """``GNNPAR_TRITON_CONFIG`` as a :class:`Config`, or None when unset."""
    env = os.environ.get(CONFIG_ENV)
    if not env:
        return None
    try:
        c = Config(*(int(x) for x in env.split(",")))
    except (TypeError, ValueError):
        raise ValueError(f"{CONFIG_ENV} must be BLOCK_F,BLOCK_E,ROWS,WARPS[,DEFER], got "
                         f"{env!r}")
    if (min(c.block_f, c.block_e, c.rows, c.warps) < 1 or c.defer not in (0, 1)
            or any(x & (x - 1) for x in (c.block_f, c.block_e, c.warps))):
        raise ValueError(f"{CONFIG_ENV}: BLOCK_F, BLOCK_E and WARPS powers of two, ROWS at "
                         f"least 1, DEFER 0 or 1, got {env!r}")
    return c


def config_for(f: int, dtype: torch.dtype) -> Config:
    """The untuned tile for width ``f`` (``GNNPAR_TRITON_CONFIG`` overrides): the row-split
    tile fastest at most widths on the GPU sweep — 64 feature columns, 16 entries a step, 2
    warps."""
    return capped(fixed_config() or Config(64, 16, 1, 2), f)


_TUNED: dict = {}


def tuned(A: torch.Tensor, h: torch.Tensor, out: torch.Tensor) -> Config:
    """The fastest :data:`CANDIDATES` tile for products like ``A @ h`` on this GPU, timed on
    the first such product (two launches each after a warm-up one) and kept per (device, h's
    dtype, width rounded up to a power of two). :func:`config_for`'s tile where the tile is
    fixed (see the module docstring) or outside CUDA (Triton's interpreter)."""
    f = h.shape[1]
    if (h.device.type != "cuda" or fixed_config() is not None
            or torch.are_deterministic_algorithms_enabled()):
        return config_for(f, h.dtype)
    key = (h.device.index, h.dtype, _pow2(f))
    if key not in _TUNED:
        order, times = row_order(A), {}
        for c in dict.fromkeys(capped(c, f) for c in CANDIDATES):
            launch = functools.partial(_launch, A, h, out, c, order)
            try:
                launch()
            except Exception as e:  # noqa: BLE001 - a tile this Triton cannot build: skip it
                _skipped(c, e)
                continue
            start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            launch()
            launch()
            stop.record()
            stop.synchronize()
            times[c] = start.elapsed_time(stop)
        if not times:
            raise RuntimeError("triton_spmm: no candidate tile compiled on this GPU; set "
                               f"{ENV}=cusparse")
        _TUNED[key] = min(times, key=times.get)
    return _TUNED[key]


def _skipped(c: Config, e: Exception) -> None:
    """Say once per tile that tuning skipped it (the compiler refused it)."""
    if c not in _SKIPPED:
        _SKIPPED.add(c)
        warnings.warn(f"triton_spmm: tile {tuple(c)} skipped: {type(e).__name__}: "
                      f"{str(e).splitlines()[-1][:200] if str(e) else ''}", RuntimeWarning)


_SKIPPED: set = set()


_ORDERS: dict = {}


def row_order(A: torch.Tensor) -> torch.Tensor:
    """A's row ids, longest row first (int32, on A's device), kept per matrix.

    Kept by (device, address of the row pointers, rows, entries): a later matrix at the same
    address with the same sizes gets the kept order, which is still a permutation of its rows
    — so at worst a slower launch, never a wrong result."""
    crow = A.crow_indices()
    key = (str(crow.device), crow.data_ptr(), A.shape[0], int(A.values().shape[0]))
    order = _ORDERS.get(key)
    if order is None:
        lengths = crow[1:] - crow[:-1]
        order = torch.argsort(lengths, descending=True, stable=True).to(torch.int32)
        if len(_ORDERS) >= 16:
            _ORDERS.pop(next(iter(_ORDERS)))
        _ORDERS[key] = order
    return order


@functools.lru_cache(maxsize=None)
def _kernel():
    """The compiled kernel, defined on first use: importing Triton takes most of a second,
    which no process that never multiplies on a GPU should pay."""
    import triton
    import triton.language as tl

    @triton.jit
    def _row_split(indptr, indices, values, order, h, out, n_rows, f, stride_h, stride_out,
                   BLOCK_F: tl.constexpr, BLOCK_E: tl.constexpr, ROWS: tl.constexpr,
                   DEFER: tl.constexpr):  # pragma: no cover
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        fmask = cols < f
        for r in range(ROWS):
            slot = tl.program_id(0) * ROWS + r
            if slot < n_rows:
                row = tl.load(order + slot).to(tl.int64)
                start = tl.load(indptr + row).to(tl.int64)
                end = tl.load(indptr + row + 1).to(tl.int64)
                acc = tl.zeros([BLOCK_F], dtype=tl.float32)
                terms = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)
                for e0 in range(start, end, BLOCK_E):
                    e = e0 + tl.arange(0, BLOCK_E)
                    emask = e < end
                    c = tl.load(indices + e, mask=emask, other=0).to(tl.int64)
                    v = tl.load(values + e, mask=emask, other=0.0).to(tl.float32)
                    hv = tl.load(h + c[:, None] * stride_h + cols[None, :],
                                 mask=emask[:, None] & fmask[None, :], other=0.0)
                    if DEFER:  # summed across the entries once, after the row
                        terms += v[:, None] * hv.to(tl.float32)
                    else:
                        acc += tl.sum(v[:, None] * hv.to(tl.float32), axis=0)
                if DEFER:
                    acc = tl.sum(terms, axis=0)
                tl.store(out + row * stride_out + cols, acc.to(out.dtype.element_ty),
                         mask=fmask)

    return _row_split, triton.cdiv


def csr_mm(A: torch.Tensor, h: torch.Tensor, out=None, config: Config = None,
           order: torch.Tensor = None) -> torch.Tensor:
    """``A @ h`` by the Triton kernel (A a CSR tensor on h's device; no autograd), with the
    tile of :func:`config_for` and the rows in :func:`row_order` unless ``config`` / ``order``
    (a permutation of A's rows, int32) are given."""
    h = h.detach().contiguous()
    n_dst, f = A.shape[0], h.shape[1]
    if out is None:
        out = torch.empty((n_dst, f), dtype=h.dtype, device=h.device)
    if n_dst == 0 or f == 0:
        return out.zero_()
    _launch(A, h, out, config or tuned(A, h, out), row_order(A) if order is None else order)
    return out


def _launch(A, h, out, c: Config, order) -> None:
    row_split, cdiv = _kernel()
    n_dst, f = A.shape[0], h.shape[1]
    args = (A.crow_indices(), A.col_indices(), A.values().detach(), order, h, out, n_dst, f,
            h.stride(0), out.stride(0))
    grid = (cdiv(n_dst, c.rows), cdiv(f, c.block_f))
    row_split[grid](*args, BLOCK_F=c.block_f, BLOCK_E=c.block_e, ROWS=c.rows,
                    DEFER=bool(c.defer), num_warps=c.warps)
