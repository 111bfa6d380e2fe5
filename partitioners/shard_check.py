"""Contents checks of a loaded shard: shapes, dtypes, ranges and finiteness, in chunks so
memory-mapped arrays stay mapped; an error names the file (:class:`InputError`, exit 2).

Values are the dtypes gnnpar writes (``values_*`` float32, ``raw_weight`` float32 or
float64): a float16 array would be read and silently widened, losing the precision the run
believes it has. The send lists are checked against the peers they feed: the ids rank r sends
to rank q (``global_ids[send_local[group q]]``) must be, in order, q's halo rows owned by r
(``halo_ids`` of q, its ``recv_counts`` segment r), so an in-range edit of ``send_local`` or
``send_counts`` cannot make a rank send the wrong rows. This reads only the peers' halo
segments for this rank: as many ids as the rank sends in one exchange. A peer folder that is
not there is skipped (that rank's own load refuses it; or this rank's disk holds only its own
part).

The checks read every page of a memory-mapped shard, and a page read stays in the process's
resident set: they hand the pages back as they go (:func:`release` after each chunk, and
every array at the end), so validating costs a chunk, not the shard, and only what the run
then reads is resident again (a GCN run never reads ``values_mean``, ``raw_weight`` or
``orig_edge``).
"""
from __future__ import annotations

import json
import os

import numpy as np

from gnnpar.datasets import InputError

from .node_stream import release
from .shard_build import NODE_ARRAYS
from .shard_folder import MANIFEST

CHECK_ELEMS = 1 << 22  # elements per chunk when validating a loaded array


def _row_chunks(a: np.ndarray):
    """``a`` in slices along its first axis of about ``CHECK_ELEMS`` elements each; the
    pages of a memory-mapped ``a`` are handed back after each (module docstring)."""
    width = int(np.prod(a.shape[1:])) if a.ndim > 1 else 1
    step = max(1, CHECK_ELEMS // max(width, 1))
    for start in range(0, a.shape[0], step):
        yield start, np.asarray(a[start:start + step])
        release(a)


class Checker:
    """Shape, dtype, range and finiteness checks of loaded arrays; errors name the file."""

    def __init__(self, folder: str):
        self.folder = folder

    def fail(self, rel: str, msg: str):
        raise InputError(f"{os.path.join(self.folder, *rel.split('/'))}: {msg}; the shard is "
                         "corrupt or was edited: rewrite it with gnnpar-partition")

    def array(self, rel: str, a, shape: tuple, kind: str, dtypes: tuple = ()):
        """``kind``: 'int', 'float' or 'bool'; ``shape`` entries None match any length;
        ``dtypes``, when given, the only dtypes accepted."""
        if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, a.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            self.fail(rel, f"shape {tuple(a.shape)}, expected {want}")
        ok = {"int": np.issubdtype(a.dtype, np.integer),
              "float": np.issubdtype(a.dtype, np.floating),
              "bool": a.dtype == np.bool_}[kind]
        if not ok:
            self.fail(rel, f"dtype {a.dtype}, expected {kind}")
        if dtypes and a.dtype not in [np.dtype(d) for d in dtypes]:
            self.fail(rel, f"dtype {a.dtype}, expected {' or '.join(map(str, dtypes))}")
        return a

    def in_range(self, rel: str, a, lo: int, hi: int, what: str = "value") -> None:
        for _, c in _row_chunks(a):
            if c.size and (c.min() < lo or c.max() >= hi):
                bad = int(c.min()) if c.min() < lo else int(c.max())
                self.fail(rel, f"{what} {bad} is outside [{lo}, {hi})")

    def finite(self, rel: str, a, what: str = "value") -> None:
        for start, c in _row_chunks(a):
            if not np.all(np.isfinite(c)):
                bad = np.nonzero(~np.isfinite(c))[0]
                self.fail(rel, f"{what} NaN or inf at row {start + int(bad[0])}")

    def csr(self, prefix: str, indptr, indices, rows: int, cols: int) -> None:
        self.array(f"{prefix}indptr.npy", indptr, (rows + 1,), "int")
        self.array(f"{prefix}indices.npy", indices, (None,), "int")
        nnz = int(indices.shape[0])
        if int(indptr[0]) != 0 or int(indptr[-1]) != nnz:
            self.fail(f"{prefix}indptr.npy", f"runs {int(indptr[0])}..{int(indptr[-1])}, "
                                             f"expected 0..{nnz}")
        prev = 0
        for _, c in _row_chunks(indptr):  # non-decreasing, across chunk borders too
            if c.size and (int(c[0]) < prev or np.any(np.diff(c) < 0)):
                self.fail(f"{prefix}indptr.npy", "is not non-decreasing")
            prev = int(c[-1]) if c.size else prev
        self.in_range(f"{prefix}indices.npy", indices, 0, cols, "column")


def validate_shard(folder: str, meta: dict, manifest: dict, arr: dict) -> None:
    """Refuse a shard whose arrays no valid graph gives (see module docstring)."""
    ck = Checker(folder)
    n, P, C = int(meta["n"]), int(meta["parts"]), int(meta["num_classes"])
    F = int(meta["num_features"])
    for name in ("global_ids", "indptr", "indices", "raw_weight", "orig_edge", "halo_ids",
                 "recv_counts", "send_counts", "send_local", *NODE_ARRAYS,
                 *(f"values_{k}" for k in meta["norms"])):
        if name not in arr:
            ck.fail(MANIFEST, f"lists no {name}.npy")
    n_local = int(ck.array("global_ids.npy", arr["global_ids"], (None,), "int").shape[0])
    n_halo = int(ck.array("halo_ids.npy", arr["halo_ids"], (None,), "int").shape[0])
    ck.in_range("global_ids.npy", arr["global_ids"], 0, n, "vertex id")
    ck.in_range("halo_ids.npy", arr["halo_ids"], 0, n, "vertex id")
    ck.csr("", arr["indptr"], arr["indices"], n_local, n_local + n_halo)
    nnz = int(arr["indices"].shape[0])
    for name in ("raw_weight", *(f"values_{k}" for k in meta["norms"])):
        dtypes = ("float32", "float64") if name == "raw_weight" else ("float32",)
        ck.finite(f"{name}.npy", ck.array(f"{name}.npy", arr[name], (nnz,), "float", dtypes))
    ck.array("orig_edge.npy", arr["orig_edge"], (nnz,), "bool")
    for name, total in (("recv_counts", n_halo), ("send_counts", None)):
        counts = ck.array(f"{name}.npy", arr[name], (P,), "int")
        ck.in_range(f"{name}.npy", counts, 0, n + 1, "count")
        if total is not None and int(np.sum(counts)) != total:
            ck.fail(f"{name}.npy", f"sums to {int(np.sum(counts))}, expected {total}")
    send = ck.array("send_local.npy", arr["send_local"], (int(np.sum(arr["send_counts"])),), "int")
    ck.in_range("send_local.npy", send, 0, n_local, "local id")
    check_sends(ck, meta, arr)
    ck.finite("x.npy", ck.array("x.npy", arr["x"], (n_local, F), "float"), "feature")
    ck.in_range("y.npy", ck.array("y.npy", arr["y"], (n_local,), "int"), 0, C, "label")
    for name in ("train_mask", "val_mask", "test_mask"):
        ck.array(f"{name}.npy", arr[name], (n_local,), "bool")
    for a in arr.values():  # the pages the checks read (module docstring)
        release(a)


def _peer_array(ck: Checker, peer: str, name: str, run_id) -> np.ndarray:
    """Array ``name`` of the peer part folder ``peer``, of the same write as this shard."""
    try:
        with open(os.path.join(peer, MANIFEST)) as f:
            manifest = json.load(f)
        if not isinstance(manifest, dict) or manifest.get("run_id") != run_id:
            raise ValueError(f"{peer} comes from another write")
        return np.load(os.path.join(peer, f"{name}.npy"), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        ck.fail("send_local.npy", f"cannot check it against {peer}: "
                                  f"{' '.join(str(err).split())}")


def check_sends(ck: Checker, meta: dict, arr: dict) -> None:
    """Each group of ``send_local`` against the peer it feeds (see the module docstring)."""
    rank = int(os.path.basename(ck.folder).rsplit("-", 1)[1])
    parent = os.path.dirname(ck.folder)
    counts = np.asarray(arr["send_counts"], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for q in np.nonzero(counts)[0].tolist():
        if q == rank:
            ck.fail("send_counts.npy", f"sends {int(counts[q])} rows to its own rank {rank}")
        peer = os.path.join(parent, f"part-{q:05d}")
        if not os.path.isdir(peer):
            continue  # that rank's own load says it is missing (or it lives on another disk)
        recv = _peer_array(ck, peer, "recv_counts", meta.get("run_id"))
        if recv.shape != counts.shape or int(recv[rank]) != int(counts[q]):
            got = int(recv[rank]) if recv.shape == counts.shape else "?"
            ck.fail("send_counts.npy", f"sends {int(counts[q])} rows to rank {q}, which expects "
                                       f"{got}")
        halo = _peer_array(ck, peer, "halo_ids", meta.get("run_id"))
        at = int(np.sum(np.asarray(recv[:rank], dtype=np.int64)))
        for off in range(0, int(counts[q]), CHECK_ELEMS):
            stop = min(off + CHECK_ELEMS, int(counts[q]))
            local = np.asarray(arr["send_local"][starts[q] + off:starts[q] + stop])
            sent = np.asarray(arr["global_ids"])[local] if local.size else local
            if not np.array_equal(sent, np.asarray(halo[at + off:at + stop])):
                ck.fail("send_local.npy", f"its rows for rank {q} are not the halo rows rank {q} "
                                          "expects from this rank")
