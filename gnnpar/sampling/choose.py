"""Which neighbours each row keeps: per-row position choosers, vectorised over all rows.

A chooser sees only the degrees of the rows to sample (never their neighbour ids), so the
same draws serve a replicated graph (positions are looked up locally) and a partitioned one
(positions are sent to the row's owner). Row ``i`` with degree ``d_i`` keeps ``k_i``
positions in ``[0, d_i)``; the positions of all rows come back concatenated in row order.

- ``fanout = -1``: every position (``k_i = d_i``), no randomness used.
- without replacement: ``k_i = min(d_i, fanout)``; rows with ``d_i <= fanout`` keep all,
  the others draw a uniform ``fanout``-subset by Floyd's algorithm, run column-by-column over
  all such rows at once (``fanout`` vectorised steps, none per row).
- with replacement: ``k_i = fanout`` for every row with ``d_i > 0``, each position uniform.

Randomness: exactly one ``rng.random((rows_drawn, fanout))`` call per layer and minibatch, in
row order, so a minibatch's draws do not depend on what else is sampled with it.

Shapes: ``deg`` (R,) int → ``k`` (R,) int64, ``pos`` (k.sum(),) int64.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np


def draw_count(deg: np.ndarray, fanout: int, replace: bool) -> int:
    """How many rows of ``deg`` consume random numbers (each takes ``fanout`` of them)."""
    if fanout < 0:
        return 0
    return int(np.count_nonzero(deg > 0 if replace else deg > fanout))


def keeps_distinct(fanout: int, replace: bool) -> bool:
    """Whether every row keeps distinct positions (no position drawn twice): always but with
    replacement from a limited fanout."""
    return fanout < 0 or not replace


def floyd_subsets(deg: np.ndarray, k: int, u: np.ndarray) -> np.ndarray:
    """A uniform ``k``-subset of ``[0, deg_i)`` for every row (all ``deg_i >= k``).

    Floyd's algorithm: for j = d-k … d-1 draw t uniform in [0, j]; keep t unless already
    kept, else keep j. Step j is one vectorised pass over all rows (picks are held step-major,
    (k, R), so the "already kept?" test reduces over the outer axis). ``u`` (R, k) uniforms
    in [0, 1). Returns (R, k) int32 (int64 for huge rows), distinct within each row (in draw
    order, not sorted).
    """
    dtype = np.int32 if deg.size == 0 or deg.max() < 2 ** 31 else np.int64
    rows = deg.shape[0]
    out = np.empty((k, rows), dtype)
    seen_buf = np.empty((k, rows), bool)
    u_steps = np.ascontiguousarray(u.T)
    for step in range(k):
        j = (deg - k + step).astype(dtype)
        t = (u_steps[step] * (j + 1.0)).astype(dtype)
        np.minimum(t, j, out=t)
        if step:
            eq = np.equal(out[:step], t, out=seen_buf[:step])
            np.copyto(t, j, where=np.logical_or.reduce(eq, axis=0))
        out[step] = t
    return out.T


def choose_positions(deg: np.ndarray, fanout: int, replace: bool, u: np.ndarray = None
                     ) -> Tuple[np.ndarray, np.ndarray]:
    """Positions kept in each row: ``(k, pos)`` (see module docstring).

    ``u``: (draw_count(deg, fanout, replace), fanout) uniforms in [0, 1), consumed by the
    sampled rows in row order; ignored (may be None) for ``fanout = -1``.
    """
    deg = np.asarray(deg, dtype=np.int64)
    return choose_entries(deg, np.zeros_like(deg), fanout, replace, u)


def choose_entries(deg: np.ndarray, base: np.ndarray, fanout: int, replace: bool,
                   u: np.ndarray = None) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`choose_positions` shifted by each row's offset: ``(k, base_i + pos)``.

    ``base`` (R,) int64 is where each row starts in its CSR, so the result indexes the
    entries directly (one pass fewer over the kept entries than adding afterwards).
    """
    deg = np.asarray(deg, dtype=np.int64)
    if fanout == 0:
        return np.zeros_like(deg), np.zeros(0, np.int64)
    if fanout < 0:
        return deg.copy(), _row_ranges(deg, base)
    drawn = deg > 0 if replace else deg > fanout
    if u is None or u.shape != (int(np.count_nonzero(drawn)), fanout):
        need = (int(np.count_nonzero(drawn)), fanout)
        raise ValueError(f"u must have shape {need}, got {None if u is None else u.shape}")
    if replace:
        k = np.where(drawn, fanout, 0).astype(np.int64)
        d = deg[drawn][:, None]
        return k, (base[drawn][:, None] + np.minimum((u * d).astype(np.int64), d - 1)).ravel()
    k = np.minimum(deg, fanout)
    # rows that keep everything read base..base+d-1; the drawn rows' slots are overwritten
    entry = _row_ranges(k, base)
    if u.shape[0]:
        start = np.cumsum(k) - k
        slots = (start[drawn][:, None] + np.arange(fanout)).ravel()
        entry[slots] = (base[drawn][:, None] + floyd_subsets(deg[drawn], fanout, u)).ravel()
    return k, entry


def _row_ranges(k: np.ndarray, base: np.ndarray) -> np.ndarray:
    """``concatenate([base_i + arange(k_i)])``, (Σk,) int64."""
    total = int(k.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    start = np.cumsum(k) - k
    return np.arange(total, dtype=np.int64) - np.repeat(start - base, k)
