"""Contents checks of a loaded shard: shapes, dtypes, ranges and finiteness, in chunks so
memory-mapped arrays stay mapped; an error names the file (:class:`InputError`, exit 2)."""
from __future__ import annotations

import os

import numpy as np

from gnnpar.datasets import InputError

from .shard_build import NODE_ARRAYS
from .shard_folder import MANIFEST

CHECK_ELEMS = 1 << 22  # elements per chunk when validating a loaded array


def _row_chunks(a: np.ndarray):
    """``a`` in slices along its first axis of about ``CHECK_ELEMS`` elements each."""
    width = int(np.prod(a.shape[1:])) if a.ndim > 1 else 1
    step = max(1, CHECK_ELEMS // max(width, 1))
    for start in range(0, a.shape[0], step):
        yield start, np.asarray(a[start:start + step])


class Checker:
    """Shape, dtype, range and finiteness checks of loaded arrays; errors name the file."""

    def __init__(self, folder: str):
        self.folder = folder

    def fail(self, rel: str, msg: str):
        raise InputError(f"{os.path.join(self.folder, *rel.split('/'))}: {msg}; the shard is "
                         "corrupt or was edited: rewrite it with gnnpar-partition")

    def array(self, rel: str, a, shape: tuple, kind: str):
        """``kind``: 'int', 'float' or 'bool'; ``shape`` entries None match any length."""
        if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, a.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            self.fail(rel, f"shape {tuple(a.shape)}, expected {want}")
        ok = {"int": np.issubdtype(a.dtype, np.integer), "float": np.issubdtype(a.dtype, np.floating),
              "bool": a.dtype == np.bool_}[kind]
        if not ok:
            self.fail(rel, f"dtype {a.dtype}, expected {kind}")
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
        ck.finite(f"{name}.npy", ck.array(f"{name}.npy", arr[name], (nnz,), "float"))
    ck.array("orig_edge.npy", arr["orig_edge"], (nnz,), "bool")
    for name, total in (("recv_counts", n_halo), ("send_counts", None)):
        counts = ck.array(f"{name}.npy", arr[name], (P,), "int")
        ck.in_range(f"{name}.npy", counts, 0, n + 1, "count")
        if total is not None and int(np.sum(counts)) != total:
            ck.fail(f"{name}.npy", f"sums to {int(np.sum(counts))}, expected {total}")
    send = ck.array("send_local.npy", arr["send_local"], (int(np.sum(arr["send_counts"])),), "int")
    ck.in_range("send_local.npy", send, 0, n_local, "local id")
    ck.finite("x.npy", ck.array("x.npy", arr["x"], (n_local, F), "float"), "feature")
    ck.in_range("y.npy", ck.array("y.npy", arr["y"], (n_local,), "int"), 0, C, "label")
    for name in ("train_mask", "val_mask", "test_mask"):
        ck.array(f"{name}.npy", arr[name], (n_local,), "bool")
