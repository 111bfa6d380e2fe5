"""Issue 24: a rank's resident memory against its shard. Loading and validating a shard leaves
its memory-mapped pages handed back (the checks read every page); the 1D halo runtime keeps
the node rows mapped from the file (no copy) and hands back the shard's pages once its
operator holds its own arrays; the operator's parts, built in chunked passes with int32
indices on the CPU, are bit for bit those of sorting each part by (row, column), and multiply
as int64 ones do. That training results are unchanged is ``tests/test_fullbatch_dist.py``'s
(every algorithm against the serial trainer).
"""
import os

import numpy as np
import pytest
import torch

import gnnpar.kernels.overlap as overlap
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.partitioners import partition_graph, write_shards
from gnnpar.partitioners.shards import load_shard
from gnnpar.launcher.spawn import spawn

from .graphs import random_graph

MB = 1 << 20


def _status_mb(key: str = "VmRSS") -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def mappings():
    """``(start, end, path, resident bytes)`` of each of this process's mappings
    (``/proc/self/smaps``; ``path`` is "" for an anonymous one)."""
    current = None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                current = (lo, hi, head[5] if len(head) >= 6 else "")
            elif current is not None and head[0] == "Rss:":
                yield (*current, int(head[1]) * 1024)
                current = None


def mapping_rss(address: int) -> int:
    """Resident bytes of the mapping that holds ``address``."""
    for lo, hi, _, rss in mappings():
        if lo <= address < hi:
            return rss
    raise LookupError(f"no mapping holds {address:#x}")


def files_rss_mb(folder: str) -> float:
    """Resident MB of this process's mappings of files under ``folder``."""
    folder = os.path.realpath(folder) + os.sep
    return sum(rss for _, _, path, rss in mappings() if path.startswith(folder)) / MB


def shard_arrays(shard):
    return [shard.global_ids, shard.indptr, shard.indices, shard.raw_weight, shard.orig_edge,
            shard.x, shard.y, shard.train_mask, shard.val_mask, shard.test_mask,
            *shard.values.values()]


@pytest.fixture(scope="module")
def big_shard(tmp_path_factory):
    """One part of ~67 MB (2.9 M non-zeros, 120 k × 32 features), written in about a second."""
    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("needs /proc (Linux)")
    g = random_graph(n=120_000, avg_deg=12, f=32, classes=4, seed=1)
    out = str(tmp_path_factory.mktemp("big") / "shards")
    write_shards(g, partition_graph(g, 1, "block", seed=0), out, norms=("gcn", "mean"))
    return out


def test_validation_hands_back_the_mapped_pages(big_shard):
    before = _status_mb("VmRSS")
    shard = load_shard(big_shard, 0)  # validates: reads every page of every array
    grown = _status_mb("VmRSS") - before
    size = sum(a.nbytes for a in shard_arrays(shard)) / MB
    assert size >= 50
    assert grown < 0.1 * size, f"VmRSS grew {grown:.1f} MB loading a {size:.1f} MB shard"
    for a in shard_arrays(shard):
        assert isinstance(a, np.memmap)
        assert mapping_rss(a.ctypes.data) <= 64 << 10, f"{a.filename} is still resident"
    # handed back, not lost: a read maps the file's pages again
    assert np.array_equal(shard.indices, np.load(shard.indices.filename))


def runtime_body(rank, world, folder):
    """One rank: VmRSS before the shard, after it, and after the 1D halo runtime; where its
    rows and the shard's arrays live."""
    from gnnpar.training.distributed import DistRuntime, _file_id, _mapped_file
    from gnnpar.kernels.algorithms import make_grid

    grid = make_grid("1d-halo", world)
    before = {k: _status_mb(k) for k in ("RssAnon", "RssFile")}
    shard = load_shard(folder, rank)
    rt = DistRuntime(grid, shard, algorithm("1d-halo"), "gcn")
    grown = {k: _status_mb(k) - v for k, v in before.items()}
    blocks = [*rt.op.block.fwd.blocks.values(), *rt.op.block.bwd.blocks.values()]
    op_mb = sum(t.crow_indices().nbytes + t.col_indices().nbytes + t.values().nbytes
                for t in blocks) / MB
    resident = {os.path.basename(a.filename): mapping_rss(a.ctypes.data)
                for a in shard_arrays(shard)}  # before the comparisons below read them
    shard_files_mb = files_rss_mb(folder)
    x_file = _file_id(os.stat(os.path.join(folder, f"part-{rank:05d}", "x.npy")))
    return {"grown": grown, "op_mb": op_mb, "shard_files_mb": shard_files_mb,
            "shard_mb": sum(a.nbytes for a in shard_arrays(shard)) / MB, "resident": resident,
            "x_mapped": _mapped_file(rt.x.data_ptr()) == x_file,
            "x_equal": bool(torch.equal(rt.x, torch.from_numpy(np.array(shard.x)))),
            "y_equal": bool(torch.equal(rt.y, torch.from_numpy(np.array(shard.y))))}


def test_runtime_maps_rows_and_hands_back_the_shard(big_shard):
    (r,) = spawn(runtime_body, 1, args=(big_shard,), timeout_s=120)
    assert r["x_mapped"] and r["x_equal"] and r["y_equal"]
    assert all(b <= 64 << 10 for b in r["resident"].values()), r["resident"]
    # no shard page left resident (the operator read indices and values: 36 MB), counted on
    # the mappings of the shard's own files: a rank forked from the fork server
    # (gnnpar/launcher/rank_start.py) faults in the library code it inherited as it first runs it, so
    # its gross RssFile growth counts libraries too (26.8 MB in CI at 12a2112) ...
    assert r["shard_files_mb"] < 0.25 * r["shard_mb"], r
    # ... and besides the operator's own arrays (24 bytes a non-zero) only setup leftovers
    # (freed transients malloc keeps): no second copy of the sparse arrays (+36 MB)
    assert r["grown"]["RssAnon"] < r["op_mb"] + 0.3 * r["shard_mb"], r


def reference_parts(rows, cols, vals, shape, row_cut, col_cut):
    """The parts as each part's entries sorted by (row, column) make them (stable)."""
    held_c, cpos = col_cut.split(cols)
    widths = dict(zip(("held", "rest"), col_cut.widths(shape[1])))
    if row_cut is None:
        own_r, rpos, heights = np.ones(rows.shape[0], bool), rows, {"own": shape[0]}
    else:
        own_r, rpos = row_cut.split(rows)
        heights = dict(zip(("own", "send"), row_cut.widths(shape[0])))
    out = {}
    for rp, rmask in (("own", own_r), ("send", ~own_r)):
        if rp not in heights:
            continue
        for cp, cmask in (("held", held_c), ("rest", ~held_c)):
            m = rmask & cmask
            r, c, v = rpos[m], cpos[m], vals[m]
            order = np.lexsort((c, r))
            indptr = np.zeros(heights[rp] + 1, np.int64)
            np.cumsum(np.bincount(r, minlength=heights[rp]), out=indptr[1:])
            out[rp, cp] = (indptr, c[order], v[order], (heights[rp], widths[cp]))
    return out


def random_csr(rng, n_rows, width, sort, dups):
    rows, cols = [], []
    for r in range(n_rows):
        if rng.random() < 0.25:
            continue  # empty rows
        c = rng.choice(width, size=rng.binomial(width, 0.4), replace=dups)
        rows += [r] * c.shape[0]
        cols += list(np.sort(c) if sort else c)
    indptr = np.zeros(n_rows + 1, np.int64)
    np.cumsum(np.bincount(np.asarray(rows, np.int64), minlength=n_rows), out=indptr[1:])
    cols = np.asarray(cols, np.int64)
    return indptr, cols, rng.standard_normal(cols.shape[0]).astype(np.float32)


class _Axis:
    def __init__(self, cut):
        self.cut = cut


@pytest.mark.parametrize("chunk", [3, overlap.CHUNK])
def test_operator_parts_equal_the_sorted_reference(monkeypatch, chunk):
    monkeypatch.setattr(overlap, "CHUNK", chunk)
    rng = np.random.default_rng(5)
    for trial in range(120):
        n_rows, own, extra = (int(v) for v in rng.integers(0, 25, 3))
        width = max(1, own + extra)
        halo = trial % 2 == 0  # the 1D halo layout, else a dense axis's middle range
        lo = 0 if halo else int(rng.integers(0, width))
        col_cut = overlap.Cut(0, own, own) if halo else overlap.Cut(lo, min(width, lo + own), 0)
        row_cut = None
        if trial % 3:
            a = int(rng.integers(0, n_rows + 1))
            b = int(rng.integers(a, n_rows + 1))
            row_cut = overlap.Cut(0, b, b) if trial % 3 == 1 else overlap.Cut(a, b, 0)
        indptr, cols, vals = random_csr(rng, n_rows, width, sort=trial % 5 != 0,
                                        dups=trial % 7 == 0)
        if trial % 4 == 0:  # read-only, as a memory map gives them
            for arr in (indptr, cols, vals):
                arr.flags.writeable = False
        op = overlap.Overlapped(indptr, cols, vals, (n_rows, width), _Axis(col_cut),
                                None if row_cut is None else _Axis(row_cut))
        rows = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(indptr))
        want = {"fwd": reference_parts(rows, cols, vals, (n_rows, width), row_cut, col_cut),
                "bwd": reference_parts(cols, rows, vals, (width, n_rows), col_cut,
                                       row_cut or overlap.Cut(0, n_rows, n_rows))}
        for side, parts in (("fwd", op.fwd), ("bwd", op.bwd)):
            assert parts.blocks.keys() == want[side].keys()
            for key, (ptr, c, v, shape) in want[side].items():
                got = parts.blocks[key]
                where = (trial, side, key)
                assert tuple(got.shape) == shape, where
                assert np.array_equal(got.crow_indices().numpy(), ptr), where
                assert got.col_indices().dtype == torch.int32, where  # CPU: MKL's type
                assert got.crow_indices().dtype == torch.int32, where
                assert np.array_equal(got.col_indices().numpy(), c), where
                assert got.values().numpy().tobytes() == v.tobytes(), where


def test_operator_refuses_a_column_out_of_range():
    indptr, cols = np.array([0, 2], np.int64), np.array([0, 5], np.int64)
    with pytest.raises(ValueError, match="outside"):
        overlap.Overlapped(indptr, cols, np.ones(2, np.float32), (1, 4),
                           _Axis(overlap.Cut(0, 2, 2)))


def test_index_dtype_is_int32_on_the_cpu_only_where_it_fits():
    assert overlap.index_dtype(10, (5, 7), None) == np.int32
    assert overlap.index_dtype(10, (5, 7), "cpu") == np.int32
    assert overlap.index_dtype(2 ** 31, (5, 7), "cpu") == np.int64
    assert overlap.index_dtype(10, (2 ** 31 - 1, 7), "cpu") == np.int64
    assert overlap.index_dtype(10, (5, 7), "cuda") == np.int64


@pytest.mark.parametrize("mode", ["torch", "numba"])
def test_int32_parts_multiply_as_int64_ones_bit_for_bit(monkeypatch, mode):
    """torch's CPU product converts int64 indices to int32 for MKL on every call; the
    compiled kernel only indexes with them: the same sums either way."""
    from gnnpar.kernels.cpu_spmm import csr_mm
    from gnnpar.kernels.local import csr_tensor

    monkeypatch.setenv("GNNPAR_SPMM", mode)
    rng = np.random.default_rng(2)
    indptr, cols, vals = random_csr(rng, 300, 200, sort=True, dups=False)
    for dtype in (torch.float32, torch.bfloat16):
        h = torch.randn(200, 24).to(dtype)
        wide = csr_mm(csr_tensor(indptr, cols, vals, (300, 200)), h)
        narrow = csr_mm(csr_tensor(indptr, cols, vals, (300, 200), index_dtype=np.int32), h)
        assert wide.dtype == narrow.dtype == dtype
        assert torch.equal(wide, narrow)
