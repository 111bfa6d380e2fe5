"""Scores of given pairs from a trained link model (``gnnpar-predict --pairs FILE.npy``).

A pairs file is a ``(2, K)`` integer ``.npy`` of dataset vertex ids (row 0 the sources, row 1
the targets). The pairs are scored once the encoder's embeddings are in the shared
``embeddings.npy``: each rank takes a contiguous share of the pairs and reads both endpoints'
rows from that file (the page cache's; a block at a time), so no rank holds the embeddings of
every vertex, and the scores do not depend on how the graph was partitioned. A score is the
decoder's logit (``torch.sigmoid`` of it is the pair's probability).
"""
from __future__ import annotations

import numpy as np
import torch

from gnnpar.datasets import InputError
from gnnpar.partitioners.node_stream import release

#: pairs whose ids are checked at a time
CHECK_BLOCK = 1 << 20
#: bytes of one endpoint's embedding rows gathered per block of pairs scored
ROWS_BYTES = 32 << 20


def read_pairs(path: str) -> np.ndarray:
    """The pairs of ``path`` (memory-mapped), or an InputError naming what is wrong: not an
    ``.npy`` file, not ``(2, K)``, not integers."""
    try:
        pairs = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"--pairs {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"--pairs {path}: not a .npy array ({exc})") from None
    if pairs.ndim != 2 or pairs.shape[0] != 2:
        raise InputError(f"--pairs {path}: shape {tuple(pairs.shape)}; give a (2, K) array of "
                         "vertex ids (row 0 sources, row 1 targets)")
    if not np.issubdtype(pairs.dtype, np.integer):
        raise InputError(f"--pairs {path}: dtype {pairs.dtype}; vertex ids must be integers")
    return pairs


def check_pair_ids(pairs: np.ndarray, n: int, path: str) -> None:
    """Every id of ``pairs`` in ``[0, n)``, else an InputError naming the first bad one."""
    for a in range(0, pairs.shape[1], CHECK_BLOCK):
        block = np.asarray(pairs[:, a:a + CHECK_BLOCK])
        bad = np.flatnonzero(((block < 0) | (block >= n)).any(axis=0))
        if bad.size:
            j = a + int(bad[0])
            raise InputError(f"--pairs {path}: pair {j} ({int(pairs[0, j])}, "
                             f"{int(pairs[1, j])}) names a vertex outside 0..{n - 1} (the "
                             f"dataset has {n:,} vertices)")


def _rows(emb: np.ndarray, ids: np.ndarray) -> torch.Tensor:
    """Rows ``ids`` of the embeddings file as float32 (bf16 bits widened)."""
    rows = np.asarray(emb[ids])
    if rows.dtype == np.uint16:
        return torch.from_numpy(rows.view(np.int16)).view(torch.bfloat16).float()
    return torch.from_numpy(rows)


def score_rows(decoder, emb_path: str, pairs: np.ndarray, a: int, b: int) -> np.ndarray:
    """The decoder's logits of pairs ``a:b``, from the embeddings file ``emb_path``: in
    blocks whose endpoint rows take about :data:`ROWS_BYTES`, each block's pages of the file
    handed back once scored (random pairs touch every page of it)."""
    emb = np.load(emb_path, mmap_mode="r")
    step = max(1, ROWS_BYTES // max(1, emb.shape[1] * emb.itemsize))
    device = next((p.device for p in decoder.parameters()), torch.device("cpu"))
    out = np.empty(b - a, np.float32)
    with torch.inference_mode():
        for c in range(a, b, step):
            d = min(b, c + step)
            block = np.asarray(pairs[:, c:d], np.int64)
            z = decoder(_rows(emb, block[0]).to(device), _rows(emb, block[1]).to(device))
            out[c - a:d - a] = z.float().reshape(-1).cpu().numpy()
            release(emb)
    return out
