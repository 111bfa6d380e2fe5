"""The files of an inference run (``gnnpar-predict --out DIR``, ``gnnpar-train
--save-predictions DIR``), written by every rank straight into shared memory-mapped arrays,
so no rank ever holds more than its own rows.

The contract (README, "Use a trained model"):

- ``predictions.npy``: (N, C) float32 logits; row i is vertex i **of the dataset's own
  order**, whatever ``--reorder``, partition or algorithm ran;
- ``embeddings.npy`` (``--embeddings``): (N, W) float32, or under ``--precision bf16`` the
  bfloat16 bits as uint16 (``torch.from_numpy(a).view(torch.bfloat16)``; ``predict.json``
  says which);
- a link model's run (``--task link``): ``embeddings.npy`` is its output rows (no
  ``predictions.npy``, no ``accuracy``), and with ``--pairs`` ``scores.npy``: (K,) float32,
  the decoder's logit of each pair, in the pairs file's order (:mod:`gnnpar.link.scoring`);
- with ``--per-rank`` instead: ``predictions.rankR.npy``, ``embeddings.rankR.npy`` and
  ``ids.rankR.npy`` (int64 dataset ids of those rows, ascending), R five digits;
- ``predict.json``, written last (its presence means every file is whole): ``format``
  (``gnnpar-predictions``), ``format_version``, ``model``, ``model_file``, ``dataset``,
  ``algo``, ``world_size``, ``task``, ``pairs``, ``inference`` (``full-batch`` or
  ``layer-wise`` with ``batch_size``), ``precision``, ``rows``, ``order`` (``dataset``),
  ``files`` (name → ``file`` or ``files``, ``shape``, ``dtype``; embeddings also
  ``layer``), and where the dataset has labels and masks ``accuracy``
  (``train``/``val``/``test``: argmax against the labels on each mask, over all ranks).

The folder is gnnpar's ``predictions`` folder (:mod:`gnnpar.datasets.owned`): a new or empty
folder is claimed, one of its own is reused (its old files removed first, ``predict.json``
before the rest), anything else refused before any work. The shared arrays are written as
``NAME.partial``, their full size reserved on disk before any row is written (a full disk
fails there, not in the middle of a mapped write), and renamed to their names once every rank
has written and synced its rows: a failed run leaves no file named like a finished one.
"""
from __future__ import annotations

import json
import os
import re
from typing import Callable, Dict, Optional

import numpy as np
import torch

from gnnpar.datasets import InputError
from gnnpar.datasets.owned import check_claimable, claim, refuse_claimed

from gnnpar.partitioners.node_stream import release

from gnnpar.cli.cli_common import disk_full_message, is_disk_full

FORMAT, FORMAT_VERSION, KIND = "gnnpar-predictions", 1, "predictions"
META = "predict.json"
#: bytes of a shared file written per block (:func:`_scatter`)
BLOCK_BYTES = 64 << 20
#: every name gnnpar writes into a predictions folder (removed before a new write)
OWN_FILE = re.compile(r"(predictions|embeddings|ids|scores)(\.rank\d{5})?\.npy(\.partial)?$")

#: ``agree(failed)`` -> whether any rank failed (an all-reduce of one flag; one process:
#: its own flag)
Agree = Callable[[bool], bool]


def check_out(out: str, flag: str = "--out") -> None:
    """Refuse, before any work, an ``out`` that is not (and may not become) a predictions
    folder: inside another gnnpar folder, a file, unwritable, holding files gnnpar did not
    write, or another kind of gnnpar folder."""
    if not out:
        raise InputError(f"{flag} needs a folder path")
    refuse_claimed(flag, out)
    check_claimable(out, KIND, flag)


def _prepare(out: str, flag: str) -> None:
    """Claim ``out`` and remove what an earlier write left (``predict.json`` first)."""
    claim(out, KIND, what=flag)
    meta = os.path.join(out, META)
    if os.path.exists(meta):
        os.remove(meta)
    for entry in os.listdir(out):
        if OWN_FILE.match(entry):
            os.remove(os.path.join(out, entry))


def _numpy_rows(t: torch.Tensor) -> np.ndarray:
    """Rows as numpy: float32, or a bfloat16 tensor's bits as uint16."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.float().numpy()


def _dtype_name(t: torch.Tensor) -> str:
    return "bfloat16" if t.dtype == torch.bfloat16 else "float32"


def _fail_all(agree: Agree, error: Optional[BaseException], what: str,
              debris: Optional[Callable[[], None]] = None) -> None:
    """Raise ``error`` on its rank and a pointer to it on the others, once any rank has one;
    ``debris`` (rank 0) first removes the half-written files."""
    if agree(error is not None):
        if debris is not None:
            debris()
        if error is not None:
            if isinstance(error, OSError) and is_disk_full(error):
                raise InputError(disk_full_message(error)) from None
            raise error
        raise InputError(f"another rank could not {what}; its message says why")


def write_outputs(out: str, rank: int, world: int, n: int, ids: np.ndarray,
                  arrays: Dict[str, torch.Tensor], meta: dict, agree: Agree,
                  per_rank: bool = False, flag: str = "--out",
                  then: Optional[Callable[[], Dict[str, dict]]] = None) -> dict:
    """Write this rank's rows of ``arrays`` (name → (n_rows, width) tensor; rows are the
    dataset's vertices ``ids``) into ``out``; collective (every rank calls it; ``agree``
    shares failures). ``n``: the dataset's vertex count. ``then`` (collective too) runs once
    the arrays have their names and before ``predict.json``: more files made from them
    (name → their ``files`` entry; :func:`write_column`). Returns ``predict.json``'s content
    (``meta`` plus the files)."""
    ids = np.asarray(ids, np.int64)
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    rows = {name: _numpy_rows(t) for name, t in arrays.items()}  # row order[k] is ids[k]
    widths = {name: int(t.shape[1]) for name, t in arrays.items()}
    # every rank's width is the same: rank 0's may be of zero rows but keeps its width
    files = {}
    for name, t in arrays.items():
        entry = {"shape": [n, widths[name]], "dtype": _dtype_name(t), "rows": "dataset order"}
        if per_rank:
            entry["files"] = [f"{name}.rank{r:05d}.npy" for r in range(world)]
            entry["ids"] = [f"ids.rank{r:05d}.npy" for r in range(world)]
        else:
            entry["file"] = f"{name}.npy"
        files[name] = entry
    error = None
    partial = [os.path.join(out, f"{name}.npy.partial") for name in arrays]

    def debris() -> None:
        for path in partial:
            if rank == 0 and os.path.exists(path):
                os.remove(path)
    if rank == 0:
        try:
            _prepare(out, flag)
            if not per_rank:
                for name in arrays:
                    _create(os.path.join(out, f"{name}.npy.partial"), (n, widths[name]),
                            rows[name].dtype)
        except (OSError, InputError) as e:
            error = e
    _fail_all(agree, error, f"prepare {flag} {out}", debris)
    try:
        if per_rank:
            _save(os.path.join(out, f"ids.rank{rank:05d}.npy"), ids)
            for name, a in rows.items():
                _save(os.path.join(out, f"{name}.rank{rank:05d}.npy"), a[order])
        else:
            for name, a in rows.items():
                _scatter(os.path.join(out, f"{name}.npy.partial"), ids, a, order)
    except OSError as e:
        error = e
    _fail_all(agree, error, f"write its rows into {flag} {out}", debris)
    content = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta, "rows": int(n),
               "order": "dataset", "per_rank": bool(per_rank), "files": files}
    if rank == 0 and not per_rank:
        try:
            for name in arrays:
                _finish(os.path.join(out, f"{name}.npy"))
        except OSError as e:
            error = e
    _fail_all(agree, error, f"finish {flag} {out}", debris)
    if then is not None:
        files.update(then())
    if rank == 0:
        try:
            _write_json(os.path.join(out, META), content)
        except OSError as e:
            error = e
    _fail_all(agree, error, f"finish {flag} {out}")
    return content


def write_column(out: str, name: str, k: int, rank: int, world: int,
                 fill: Callable[[int, int], np.ndarray], agree: Agree,
                 flag: str = "--out") -> dict:
    """``NAME.npy``: a (k,) float32 array each rank fills a contiguous share of (rank r rows
    ``k·r/world`` to ``k·(r+1)/world``, ``fill(a, b)`` giving rows ``a:b``, asked for in blocks
    of :data:`BLOCK_BYTES`), written as ``NAME.npy.partial`` and renamed once every rank has
    written and synced its share; collective. Returns its ``files`` entry."""
    path = os.path.join(out, f"{name}.npy.partial")
    error = None

    def debris() -> None:
        if rank == 0 and os.path.exists(path):
            os.remove(path)
    if rank == 0:
        try:
            _create(path, (k,), np.float32)
        except OSError as e:
            error = e
    _fail_all(agree, error, f"prepare {flag} {out}", debris)
    lo, hi = k * rank // world, k * (rank + 1) // world
    try:
        if hi > lo:
            mm = np.load(path, mmap_mode="r+")
            step = BLOCK_BYTES // mm.itemsize
            for a in range(lo, hi, step):
                b = min(hi, a + step)
                mm[a:b] = fill(a, b)
                mm.flush()
                release(mm)
            del mm
    except OSError as e:
        error = e
    _fail_all(agree, error, f"write its share of {name} into {flag} {out}", debris)
    if rank == 0:
        try:
            _finish(os.path.join(out, f"{name}.npy"))
        except OSError as e:
            error = e
    _fail_all(agree, error, f"finish {flag} {out}", debris)
    return {name: {"file": f"{name}.npy", "shape": [int(k)], "dtype": "float32"}}


def _finish(final: str) -> None:
    """``final.partial`` synced and renamed ``final``."""
    _sync(final + ".partial")
    os.replace(final + ".partial", final)


def _create(path: str, shape, dtype) -> None:
    """An .npy file of ``shape`` and ``dtype``, its whole size reserved on disk."""
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=tuple(shape))
    offset = mm.offset
    del mm
    with open(path, "r+b") as fh:
        size = offset + int(np.prod(shape)) * np.dtype(dtype).itemsize
        if size:
            os.posix_fallocate(fh.fileno(), 0, size)


def _scatter(path: str, ids: np.ndarray, rows: np.ndarray, order: np.ndarray) -> None:
    """``rows[order]`` into rows ``ids`` (ascending) of the shared .npy file, synced to disk.

    Block by block of about :data:`BLOCK_BYTES` of the file: a block's rows are gathered,
    written, synced, and the block's pages handed back (:func:`release`), so neither a sorted
    copy of the rows nor the file's pages (a rank's rows are spread over the whole file, so
    it touches nearly every page) add to the rank's resident set beyond one block."""
    if ids.shape[0] == 0:
        return
    mm = np.load(path, mmap_mode="r+")
    if mm.shape[1] != rows.shape[1] or mm.dtype != rows.dtype:
        raise ValueError(f"{path}: rows of width {rows.shape[1]} ({rows.dtype}) for a file of "
                         f"{mm.shape[1]} ({mm.dtype})")
    step = max(1, BLOCK_BYTES // max(1, mm.shape[1] * mm.itemsize))  # file rows per block
    cuts = np.searchsorted(ids, np.arange(0, mm.shape[0] + step, step))
    for a, b in zip(cuts[:-1], cuts[1:]):
        if b > a:
            mm[ids[a:b]] = rows[order[a:b]]
            mm.flush()
            release(mm)
    del mm


def _save(path: str, a: np.ndarray) -> None:
    """``a`` to ``path`` through a temporary name, synced, then renamed."""
    tmp = f"{path}.partial"
    with open(tmp, "wb") as fh:
        np.save(fh, a)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _sync(path: str) -> None:
    with open(path, "r+b") as fh:
        os.fsync(fh.fileno())


def _write_json(path: str, content: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(content, fh, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
