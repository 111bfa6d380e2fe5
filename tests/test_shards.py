"""Per-rank shards: halo/send plans against scipy, exact round trip, refusals, atomicity, CLI."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from gnnpar.datasets import Graph, InputError, split_masks
from gnnpar.datasets.normalize import union_structure, values_for
from gnnpar.partitioners import (build_shards, load_grid_rows, load_shard, partition_graph,
                                 read_meta, reassemble, write_shards)
from gnnpar.partitioners.shards import part_dir

from .graphs import random_graph

from .cli_util import ROOT
SHARD_ARRAYS = ("global_ids", "indptr", "indices", "raw_weight", "orig_edge", "halo_ids",
                "recv_counts", "send_counts", "send_local", "x", "y", "train_mask", "val_mask",
                "test_mask")


def looped_weighted_graph(n=83, seed=4):
    """Directed, weighted, some self loops (one of weight 0), some isolated vertices."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n - 10, 300), rng.integers(0, n - 10, 300)
    loops = rng.choice(n, 12, replace=False)
    src, dst = np.r_[src, loops], np.r_[dst, loops]
    w = rng.uniform(0.1, 3.0, src.size).astype(np.float32)
    w[-1] = 0.0
    indptr, indices, w = Graph.csr_from_edges(src, dst, n, w)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = rng.integers(0, 4, n).astype(np.int64)
    y[:4] = np.arange(4)
    return Graph(indptr, indices, x, y, *split_masks(n, rng), num_classes=4, edge_weight=w).validate()


GRAPHS = {
    "undirected": lambda: random_graph(n=97, avg_deg=4, seed=1),
    "directed": lambda: random_graph(n=89, avg_deg=3, seed=2, directed=True),
    "loops-weighted": looped_weighted_graph,
}


# ------------------------------------------------------------------ plans against scipy
@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("method,parts", [("metis", 4), ("random", 3), ("block", 5)])
def test_halo_rows_and_values_match_scipy(name, method, parts):
    g = GRAPHS[name]()
    part = partition_graph(g, parts, method, seed=1)
    shards = build_shards(g, part, norms=("gcn", "mean", "sum"))
    indptr, indices, raw = union_structure(g)
    n = g.num_nodes
    full = {k: sp.csr_matrix((values_for(k, indptr, indices, raw), indices, indptr), shape=(n, n))
            for k in ("gcn", "mean", "sum")}
    for r, s in enumerate(shards):
        rows = np.nonzero(part.owner == r)[0]
        assert np.array_equal(s.global_ids, rows)
        sub = full["gcn"][rows]
        cols = np.unique(sub.indices)
        remote = cols[part.owner[cols] != r]
        expect_halo = remote[np.lexsort((remote, part.owner[remote]))]   # by owner, then id
        assert np.array_equal(s.halo_ids, expect_halo)
        assert list(s.recv_counts) == list(np.bincount(part.owner[remote], minlength=parts))
        # the local matrix, columns mapped back to global ids, is exactly these rows of Â
        col_ids = s.column_ids()
        for k in ("gcn", "mean", "sum"):
            local = sp.csr_matrix((s.values[k], s.indices, s.indptr), shape=(s.n_local, col_ids.size))
            back = sp.csr_matrix((local.data, col_ids[local.indices], local.indptr), shape=(s.n_local, n))
            ref = full[k][rows]
            back.sort_indices()
            ref.sort_indices()
            assert np.array_equal(back.indptr, ref.indptr) and np.array_equal(back.indices, ref.indices)
            assert np.array_equal(back.data, ref.data)                      # bit-identical values
        for r_row in range(s.n_local):                                     # sorted local columns
            assert np.all(np.diff(s.indices[s.indptr[r_row]:s.indptr[r_row + 1]]) > 0)
        assert np.array_equal(s.x, g.x[rows]) and np.array_equal(s.y, g.y[rows])


@pytest.mark.parametrize("name", list(GRAPHS))
def test_send_and_receive_lists_agree_across_ranks(name):
    g = GRAPHS[name]()
    P = 5
    part = partition_graph(g, P, "random", seed=3)
    shards = build_shards(g, part)
    for q, recv in enumerate(shards):
        assert recv.recv_counts[q] == 0
        for r, send in enumerate(shards):
            assert send.send_counts[q] == recv.recv_counts[r]
            group = send.send_local[send.send_offsets[q]:send.send_offsets[q + 1]]
            halo = recv.halo_ids[recv.recv_offsets[r]:recv.recv_offsets[r + 1]]
            assert np.array_equal(send.global_ids[group], halo)


def test_more_parts_than_vertices_gives_empty_shards(tmp_path):
    g = random_graph(n=6, avg_deg=2, seed=0)
    part = partition_graph(g, 9, "block")
    write_shards(g, part, tmp_path)
    empty = [load_shard(tmp_path, r) for r in range(9) if part.sizes[r] == 0]
    assert empty and all(s.n_local == 0 and s.nnz == 0 and s.x.shape == (0, g.num_features) for s in empty)
    assert reassemble(tmp_path).fingerprint() == g.fingerprint()


# ------------------------------------------------------------------ round trip
@pytest.mark.parametrize("name", list(GRAPHS))
def test_round_trip_is_exact(tmp_path, name):
    g = GRAPHS[name]()
    part = partition_graph(g, 4, "metis", seed=0)
    meta = write_shards(g, part, tmp_path, norms=("gcn", "mean"))
    assert meta["fingerprint"] == g.fingerprint() and meta["parts"] == 4 and meta["canonical_csr"]
    back = reassemble(tmp_path)
    assert np.array_equal(back.indptr, g.indptr) and np.array_equal(back.indices, g.indices)
    if g.edge_weight is None:
        assert back.edge_weight is None
    else:
        assert back.edge_weight.dtype == g.edge_weight.dtype
        assert np.array_equal(back.edge_weight, g.edge_weight)
    for arr in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(back, arr), getattr(g, arr)) and getattr(back, arr).dtype == getattr(g, arr).dtype
    assert back.num_classes == g.num_classes and back.fingerprint() == g.fingerprint()


def test_loaded_shard_equals_built_shard_and_is_memory_mapped(tmp_path):
    g = looped_weighted_graph()
    part = partition_graph(g, 4, "metis", seed=0)
    write_shards(g, part, tmp_path)
    built = build_shards(g, part)
    for r in range(4):
        s = load_shard(tmp_path, r, world_size=4, fingerprint=g.fingerprint())
        assert isinstance(s.indices, np.memmap)
        for a in SHARD_ARRAYS:
            assert np.array_equal(getattr(s, a), getattr(built[r], a)), a
        for k in ("gcn", "mean"):
            assert np.array_equal(s.values[k], built[r].values[k])
    assert not os.path.exists(os.path.join(tmp_path, "grid"))         # no grid blocks any more
    with pytest.raises(InputError, match="no longer written"):
        load_grid_rows(tmp_path)


# ------------------------------------------------------------------ refusals, atomicity
@pytest.fixture
def written(tmp_path):
    g = random_graph(n=50, seed=3)
    part = partition_graph(g, 3, "random", seed=0)
    write_shards(g, part, tmp_path)
    return g, part, tmp_path


def test_refuses_world_size_fingerprint_rank_and_version(written):
    g, _, d = written
    with pytest.raises(InputError, match="for 3 ranks but the world size is 4"):
        load_shard(d, 0, world_size=4)
    with pytest.raises(InputError, match="another graph"):
        load_shard(d, 0, fingerprint=random_graph(n=51, seed=3).fingerprint())
    with pytest.raises(InputError, match="outside"):
        load_shard(d, 3)
    meta = read_meta(d)
    meta["format_version"] = 99
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match="format version 99"):
        load_shard(d, 0)


def test_missing_meta_is_refused(written):
    _, _, d = written
    os.remove(d / "meta.json")
    with pytest.raises(InputError, match="no meta.json"):
        load_shard(d, 0)


def test_leftover_tmp_folder_is_refused(written):
    g, part, d = written
    # a crash between writing part 1's temporary folder and renaming it
    os.rename(part_dir(d, 1), f"{part_dir(d, 1)}.tmp-12345")
    with pytest.raises(InputError, match="missing"):
        load_shard(d, 1)
    load_shard(d, 0)                                                     # others still load
    write_shards(g, part, d)                                             # a rewrite clears the debris
    assert sorted(os.listdir(d)) == [".gnnpar-lock", ".gnnpar-owner.json", "meta.json",
                                     "part-00000", "part-00001", "part-00002"]  # + lock, marker
    load_shard(d, 1)


def test_crash_mid_rewrite_leaves_a_directory_that_does_not_load(written, monkeypatch):
    from gnnpar.partitioners.shard_build import ShardBuilder
    g, part, d = written
    real = ShardBuilder._rows  # every part's rows go through it, whoever made its halo

    def failing(self, rank, *args):
        if rank == 2:
            raise RuntimeError("simulated crash")
        return real(self, rank, *args)

    monkeypatch.setattr(ShardBuilder, "_rows", failing)
    with pytest.raises(RuntimeError):
        write_shards(g, part, d)
    for rank in range(3):                     # parts 0-1 are new, part 2 old: none may load
        with pytest.raises(InputError, match="no meta.json"):
            load_shard(d, rank)


def test_incomplete_or_truncated_folder_is_refused(written):
    _, _, d = written
    os.remove(os.path.join(part_dir(d, 2), "part.json"))
    with pytest.raises(InputError, match="incomplete"):
        load_shard(d, 2)
    path = os.path.join(part_dir(d, 0), "indices.npy")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)
    with pytest.raises(InputError, match="truncated"):
        load_shard(d, 0)


def test_folder_from_another_write_is_refused(written, tmp_path_factory):
    g, part, d = written
    other = tmp_path_factory.mktemp("other")
    write_shards(g, part, other)                                         # same graph, new run id
    shutil.rmtree(part_dir(d, 1))
    shutil.copytree(part_dir(other, 1), part_dir(d, 1))
    with pytest.raises(InputError, match="different write"):
        load_shard(d, 1)


def test_rewrite_with_fewer_parts_replaces_everything(written):
    g, _, d = written
    write_shards(g, partition_graph(g, 2, "block"), d)
    assert sorted(e for e in os.listdir(d) if e.startswith("part-")) == ["part-00000", "part-00001"]
    assert read_meta(d)["method"] == "block"
    assert reassemble(d).fingerprint() == g.fingerprint()


def test_bad_arguments_leave_existing_shards_valid(written):
    g, part, d = written
    with pytest.raises(InputError, match="unknown normalisation"):
        write_shards(g, part, d, norms=("gcn", "lap"))
    assert load_shard(d, 2, world_size=3).n_local == part.sizes[2]


def test_bad_norm_and_partition_mismatch(tmp_path):
    g = random_graph(n=30, seed=0)
    with pytest.raises(InputError, match="unknown normalisation"):
        write_shards(g, partition_graph(g, 2, "block"), tmp_path, norms=("gcn", "lap"))
    with pytest.raises(InputError, match="covers 31 vertices"):
        write_shards(g, partition_graph(random_graph(n=31, seed=0), 2, "block"), tmp_path)
    assert not os.path.exists(tmp_path / "meta.json")


# ------------------------------------------------------------------ CLI
def cli(*args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "gnnpar.cli.partition_cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def save_npz(g: Graph, path):
    np.savez(path, indptr=g.indptr, indices=g.indices, x=g.x, y=g.y, train_mask=g.train_mask,
             val_mask=g.val_mask, test_mask=g.test_mask, num_classes=g.num_classes)


def test_cli_writes_shards_and_reports(tmp_path):
    out = tmp_path / "shards"
    r = cli("--dataset", "sbm:n=300,blocks=3,p_in=0.05,p_out=0.002", "--parts", "4",
            "--method", "metis", "--out", str(out), "--grid", "2x2", "--report", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["parts"] == 4 and rep["method"] == "metis" and len(rep["halo"]) == 4
    meta = read_meta(out)
    assert meta["parts"] == 4 and "grid" not in meta and not (out / "grid").exists()
    assert load_shard(out, 3, world_size=4).n_local == meta["sizes"][3]
    g = rep["grid_nnz"]                        # --grid adds the kernels' non-zeros per rank
    assert rep["grid"] == "2x2" and g["balanced"]["max_over_mean"] >= 1.0
    assert g["parts"]["mean"] == pytest.approx(g["balanced"]["mean"])


@pytest.mark.parametrize("args,needle", [
    (["--parts", "0"], "--parts must be >= 1"),
    (["--parts", "4", "--grid", "3x3"], "has 9 ranks but --parts is 4"),
    (["--parts", "4", "--grid", "banana"], "--grid must look like"),
    (["--parts", "4", "--method", "metis", "--imbalance", "-1"], "imbalance"),
    (["--parts", "400"], "cannot split 300 vertices"),
    (["--parts", "2", "--norms", "gcn,lap"], "unknown normalisation"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, args, needle):
    r = cli("--dataset", "sbm:n=300,blocks=3,p_in=0.05,p_out=0.002", "--out", str(tmp_path / "o"), *args)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("[gnnpar-partition]")]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_cli_debug_shows_traceback_and_nothing_to_do_is_refused(tmp_path):
    r = cli("--dataset", "sbm:n=300,blocks=3,p_in=0.05,p_out=0.002", "--parts", "0",
            "--out", str(tmp_path), "--debug")
    assert r.returncode == 2 and "Traceback" in r.stderr
    r = cli("--dataset", "sbm:n=300,blocks=3,p_in=0.05,p_out=0.002", "--parts", "2")
    assert r.returncode == 2 and "nothing to do" in r.stderr


def test_cli_refuses_a_bad_dataset_spec(tmp_path):
    r = cli("--dataset", "nosuch:abc", "--parts", "2", "--out", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
