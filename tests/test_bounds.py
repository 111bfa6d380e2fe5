"""Every count and size has a bound, checked before any work, and bad input is exit 2.

- count flags (``--threads``, ``--seed``, ``--hidden``, ``--layers``, ``--parts``,
  ``--replication``, ``--sampler-workers``, ``--prefetch``) outside their range: exit 2 and
  one line naming the flag, in gnnpar-train, -plan and -partition alike, before a dataset is
  loaded (they used to reach OpenMP, torch's seeding or an allocation: exit 1, a SIGSEGV, a
  hang);
- a shard folder's ``num_classes`` far beyond its node count: exit 2 before any rank starts;
- sizes: an OGB ``.csv.gz`` that inflates past the memory limit is refused while it is read;
  a shard folder whose parts² count arrays cannot fit on the disk is refused before anything
  is written; ``ulimit -v`` lowers the memory limit;
- a full disk (ENOSPC, and EFBIG under ``ulimit -f``) while shards are written: exit 2 naming
  the path, and no unfinished part left on the disk;
- a peer that dies or never starts before a launched world is joined: a lost rank, exit 3.
"""
import errno
import gzip
import json
import os
import resource
import subprocess
import sys

import pytest

from gnnpar.datasets import InputError
from gnnpar.datasets.limits import MAX_BYTES_ENV, machine_memory
from gnnpar.datasets.readers import read_ogb
from gnnpar.cli.partition_cli import main as partition_main
from gnnpar.cli.plan_cli import main as plan_main
from gnnpar.train import main as train_main

from .cli_util import ROOT, installed

TINY = "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02"
MB = ["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "8"]
HUGE = "99999999999"


def refused(capsys, cli, argv, *needles, code=2):
    """Run ``cli(argv)`` in-process: exit ``code`` and one stderr line holding ``needles``."""
    assert cli(argv) == code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- count flags
TRAIN_REFUSED = [
    (["--threads", HUGE], "--threads"),
    (["--threads", "100000"], "--threads"),
    (["--threads", "0"], "--threads"),
    (["--seed", str(2 ** 64)], "--seed"),
    (["--seed", str(-2 ** 63 - 1)], "--seed"),
    (["--seed", "-1"], "--seed"),
    (["--hidden", HUGE], "--hidden"),
    (["--layers", HUGE], "--layers"),
    (["--algo", "1.5d", "--nprocs", "2", "--replication", "0"], "--replication"),
    ([*MB, "--sampler-workers", HUGE], "--sampler-workers"),
    ([*MB, "--prefetch", HUGE], "--prefetch"),
]


@pytest.mark.parametrize("argv,flag", TRAIN_REFUSED, ids=[" ".join(a) for a, _ in TRAIN_REFUSED])
def test_train_count_flags_are_bounded(argv, flag, no_work, capsys):
    refused(capsys, train_main, ["--dataset", TINY, "--epochs", "1", "--quiet", *argv], flag)


PLAN_REFUSED = [
    (["--hidden", HUGE], "--hidden"),
    (["--layers", HUGE], "--layers"),
    (["--seed", "-1"], "--seed"),
    (["--calibrate", "--threads", "100000"], "--threads"),
]


@pytest.mark.parametrize("argv,flag", PLAN_REFUSED, ids=[" ".join(a) for a, _ in PLAN_REFUSED])
def test_plan_count_flags_are_bounded(argv, flag, capsys, monkeypatch):
    import gnnpar.cli.plan_cli
    monkeypatch.setattr(gnnpar.cli.plan_cli, "calibrate", lambda **k: pytest.fail("probed"))
    refused(capsys, plan_main, ["--nodes", "1000", "--edges", "10000", "--world", "4", *argv],
            flag)


PARTITION_REFUSED = [
    (["--parts", HUGE, "--method", "block", "--report"], "--parts"),
    (["--parts", "2", "--seed", "-1", "--report"], "--seed"),
    (["--parts", "2", "--feat-width", HUGE, "--report"], "--feat-width"),
]


@pytest.mark.parametrize("argv,flag", PARTITION_REFUSED,
                         ids=[" ".join(a) for a, _ in PARTITION_REFUSED])
def test_partition_count_flags_are_bounded(argv, flag, no_work, capsys):
    refused(capsys, partition_main, ["--dataset", TINY, "--quiet", *argv], flag)


def test_bounds_in_range_still_run(capsys):
    assert train_main(["--dataset", TINY, "--epochs", "1", "--quiet", "--threads", "2",
                       "--seed", str(2 ** 32 - 1)]) == 0
    assert plan_main(["--nodes", "1000", "--edges", "10000", "--world", "4", "--hidden",
                      str(1 << 24), "--layers", "4096", "--top", "1"]) == 0


def test_every_bounded_flag_exists_where_it_is_checked():
    """A renamed flag would silently lose its bound: each tool has the flags it bounds."""
    from gnnpar.cli.cli_common import BOUNDS
    from gnnpar.cli.options import build_parser as train_parser
    from gnnpar.cli.partition_cli import build_parser as partition_parser
    from gnnpar.cli.plan_cli import build_parser as plan_parser
    dests = set()
    for parser in (train_parser(), partition_parser(), plan_parser()):
        dests |= {a.dest for a in parser._actions}
    assert set(BOUNDS) <= dests


# ---------------------------------------------------------------- shard num_classes
def test_shard_num_classes_is_bounded_before_any_rank_starts(tmp_path, no_work, capsys):
    from gnnpar.datasets import load_dataset
    from gnnpar.partitioners import partition_graph, write_shards
    g = load_dataset(TINY)
    out = tmp_path / "shards"
    write_shards(g, partition_graph(g, 2, "block"), str(out))
    meta = json.loads((out / "meta.json").read_text())
    meta["num_classes"] = 10 ** 12
    (out / "meta.json").write_text(json.dumps(meta))
    refused(capsys, train_main, ["--partition-dir", str(out), "--algo", "1d", "--nprocs", "2",
                                 "--partitioner", "block", "--epochs", "1", "--quiet"],
            "meta.json: num_classes 1,000,000,000,000", "rewrite")


# ---------------------------------------------------------------- memory: OGB, ulimit -v
def _inflating_ogb(root, text_bytes: int):
    """An OGB folder whose ``edge.csv.gz`` is small but inflates to ``text_bytes`` of "0,1"
    lines (written a block at a time: never held whole)."""
    def gz(path, lines):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.write("".join(f"{ln}\n" for ln in lines))
    gz(f"{root}/raw/node-feat.csv.gz", ["0.5,1.0", "1.5,-2.0"])
    gz(f"{root}/raw/node-label.csv.gz", ["0", "1"])
    for part, ids in (("train", ["0"]), ("valid", ["1"]), ("test", ["1"])):
        gz(f"{root}/split/s/{part}.csv.gz", ids)
    block = b"0,1\n" * (1 << 18)  # 1 MiB
    with gzip.open(f"{root}/raw/edge.csv.gz", "wb", compresslevel=1) as f:
        for _ in range(text_bytes // len(block)):
            f.write(block)
    return str(root)


def test_ogb_edge_file_that_inflates_past_the_limit_is_refused_while_read(tmp_path,
                                                                          monkeypatch, capsys):
    root = _inflating_ogb(tmp_path / "ogbn_bomb", 160 << 20)  # 160 MiB of text, ~1 MB on disk
    assert os.path.getsize(f"{root}/raw/edge.csv.gz") < 2 << 20
    monkeypatch.setenv(MAX_BYTES_ENV, "64MiB")
    with pytest.raises(InputError, match=r"edge\.csv\.gz \(inflated to [0-9.]+ MiB so far") as e:
        read_ogb(root)
    assert "160.0 MiB" not in str(e.value)  # refused before the whole file was inflated
    line = refused(capsys, train_main, ["--dataset", f"ogb:{root}", "--epochs", "1",
                                        "--quiet"], "edge.csv.gz", "over the limit of 64.0 MiB")
    assert "--max-memory" in line


def test_ogb_reader_still_reads_within_the_limit(tmp_path, monkeypatch):
    root = _inflating_ogb(tmp_path / "ogbn_ok", 1 << 20)
    monkeypatch.setenv(MAX_BYTES_ENV, "1GiB")
    assert read_ogb(root).num_nodes == 2


def test_machine_memory_respects_ulimit_v():
    """``ulimit -v 3 GiB`` (RLIMIT_AS): the machine's memory is at most that."""
    limit = 3 << 30
    code = "from gnnpar.datasets.limits import machine_memory; print(machine_memory())"
    env = {**os.environ, "PYTHONPATH": ROOT, "OPENBLAS_NUM_THREADS": "1"}  # small buffers
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=60,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS,
                                                               (limit, limit)))
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) == min(limit, machine_memory()) and int(res.stdout) <= limit


# ---------------------------------------------------------------- disk
def test_shard_folder_of_a_million_parts_is_refused_before_any_work(tmp_path, no_work, capsys):
    """Each part holds two P-long count arrays: the folder grows as P²; 2^20 parts need about
    16 TiB, refused from the flags alone — nothing loaded, nothing written."""
    out = tmp_path / "out"
    refused(capsys, partition_main, ["--dataset", TINY, "--parts", str(1 << 20), "--method",
                                     "block", "--out", str(out), "--quiet"],
            f"--out {out} (1,048,576 parts) needs about", "TiB of disk", "free on")
    assert not out.exists()


def test_shard_disk_estimate_grows_as_parts_squared():
    from gnnpar.partitioners.shard_folder import shard_disk_bytes
    small, large = shard_disk_bytes(10_000, 2), shard_disk_bytes(100_000, 2)
    assert large > 50 * small and large > 100e9  # what the 7.5 GB run was headed for


def _tmpfs(path, size="2m"):
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")


def test_shards_that_cannot_fit_a_small_disk_are_refused_before_writing(tmp_path, no_work,
                                                                       capsys):
    disk = tmp_path / "disk"
    _tmpfs(disk)
    try:
        refused(capsys, partition_main, ["--dataset", TINY, "--parts", "2000", "--method",
                                         "block", "--out", str(disk / "out"), "--quiet"],
                "(2,000 parts) needs about", "of disk")
        assert os.listdir(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_disk_full_while_writing_shards_is_exit_2_and_leaves_no_part(tmp_path, monkeypatch,
                                                                     capsys, jobs):
    """ENOSPC on the second part: exit 2 naming the folder, every part written removed (also
    when a forked job meets it)."""
    import gnnpar.partitioners.shards as shards
    saved = []
    real_save = shards.save_npy  # every structure file goes through it (on a writer thread)

    def save(path, arr, *a, **k):
        if "part-00001" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        saved.append(path)
        return real_save(path, arr, *a, **k)
    monkeypatch.setattr(shards, "save_npy", save)
    out = tmp_path / "out"
    refused(capsys, partition_main, ["--dataset", TINY, "--parts", "3", "--method", "block",
                                     "--out", str(out), "--quiet", "--jobs", jobs],
            f"--out {out}: the disk is full", "removed")
    assert not out.exists()  # part-00000 was written, then removed with the folder
    assert saved or jobs != "1"  # a forked job's saves are in its own memory


def test_disk_full_in_a_folder_gnnpar_wrote_before_keeps_no_unfinished_part(tmp_path,
                                                                           monkeypatch, capsys):
    import gnnpar.partitioners.shards as shards
    out = tmp_path / "out"
    argv = ["--dataset", TINY, "--parts", "3", "--method", "block", "--out", str(out), "--quiet"]
    assert partition_main(argv) == 0
    real_save = shards.save_npy

    def save(path, arr, *a, **k):
        if "part-00002" in str(path):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real_save(path, arr, *a, **k)
    monkeypatch.setattr(shards, "save_npy", save)
    refused(capsys, partition_main, argv, "the disk is full")
    left = sorted(os.listdir(out))
    assert not [e for e in left if e.startswith("part-")], left  # no half-rewritten parts
    monkeypatch.undo()
    assert partition_main(argv) == 0  # the folder is still gnnpar's: rewritten at once


def test_file_size_limit_efbig_is_a_full_disk(tmp_path):
    """``ulimit -f`` (RLIMIT_FSIZE): a real write fails with EFBIG; exit 2, nothing left."""
    out = tmp_path / "out"
    spec = "sbm:n=3000,blocks=3,p_in=0.01,p_out=0.001,feat=64"  # x.npy of a part: ~390 KB
    limit = 256 << 10

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    res = subprocess.run([sys.executable, "-m", "gnnpar.cli.partition_cli", "--dataset", spec,
                          "--parts", "2", "--method", "block", "--out", str(out), "--quiet"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT, "PYTHONDONTWRITEBYTECODE": "1"},
                         preexec_fn=small_files)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "the disk is full" in lines[0] and str(out) in lines[0], lines
    assert not out.exists()


def test_a_full_disk_inside_a_spawned_rank_exits_2_naming_the_path(tmp_path):
    """``ulimit -f`` (RLIMIT_FSIZE, inherited by the ranks) above the shards' files and below
    a checkpoint's (3 layers of 512: weights and Adam's moments, ~3 MB): a rank's checkpoint
    write fails with EFBIG inside the spawned world; the installed ``gnnpar-train`` exits 2
    with one line naming the checkpoint's path (it was 1, an internal error)."""
    limit = 256 << 10

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    res = subprocess.run([installed("gnnpar-train"), "--dataset",
                          "sbm:n=200,blocks=2,p_in=0.05,p_out=0.01,feat=8", "--algo", "1d",
                          "--nprocs", "2", "--hidden", "512", "--layers", "3", "--epochs", "2",
                          "--checkpoint-dir", "ck", "--quiet"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         preexec_fn=small_files)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("gnnpar-train")]
    assert len(lines) == 1 and "the disk is full" in lines[0], res.stderr
    assert any(os.path.join("ck", f"rank-0000{r}", "ckpt-000000000.pt") in lines[0]
               for r in (0, 1)), lines  # each rank writes its own; the first to fail is named
    assert "Traceback" not in res.stderr


# ---------------------------------------------------------------- a peer lost before joining
def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_peer_that_never_joins_a_launched_world_is_a_lost_rank_exit_3():
    """torchrun-style env, WORLD_SIZE=2, rank 1 never comes: exit 3, one line naming rank 0."""
    env = {**os.environ, "PYTHONPATH": ROOT, "RANK": "0", "WORLD_SIZE": "2",
           "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    res = subprocess.run([sys.executable, "-m", "gnnpar.train", "--dataset", TINY, "--algo",
                          "1d", "--epochs", "1", "--quiet", "--timeout", "2"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert res.returncode == 3, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "lost rank" in last and "rank 0 of 2" in last and "Traceback" not in res.stderr


def test_store_host_that_never_comes_is_a_lost_rank():
    """Rank 1 of a world whose rank 0 (the store's host) died before it listened."""
    from gnnpar.launcher.bootstrap import WorldInfo, init_distributed
    from gnnpar.cli.cli_common import LostRank
    info = WorldInfo(1, 2, 1, "127.0.0.1", _free_port(), "slurm", 2)
    with pytest.raises(LostRank, match="rank 1 of 2 could not join the slurm world"):
        init_distributed(info, "gloo", timeout=2)


def test_lost_rank_is_exit_3_one_line(capsys):
    from gnnpar.cli.cli_common import EXIT_LOST_RANK, LostRank, run_cli
    from gnnpar.launcher.watchdog import EXIT_PEER_LOST

    def body():
        raise LostRank("rank 0 of 2 could not join")
    assert run_cli(body, False, "gnnpar-train") == EXIT_LOST_RANK == EXIT_PEER_LOST == 3
    assert capsys.readouterr().err == "gnnpar-train: lost rank: rank 0 of 2 could not join\n"

