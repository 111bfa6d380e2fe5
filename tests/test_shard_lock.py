"""One writer at a time in a shard folder: two ``gnnpar-partition --out`` of one folder, or two
trainers filling one empty ``--partition-dir``, started a few milliseconds apart, never delete
each other's part folders nor take gnnpar's own temporary files for a stranger's. The second
partitioner exits 2 naming the holder; the second trainer waits and uses the shards the first
wrote. Raced in two long-lived worker processes, 24 rounds with random delays."""
import contextlib
import io
import multiprocessing as mp
import os
import random
import subprocess
import sys
import threading
import time

import pytest

from gnnpar.datasets import InputError
from gnnpar.datasets.owned import LOCK_NAME
from gnnpar.partitioners import load_shard, read_meta
from gnnpar.partitioners.shard_folder import shard_writer
from gnnpar.cli.spec import RunSpec

from .cli_util import ROOT

SPEC = "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02"
PARTITION = ["--dataset", SPEC, "--parts", "2", "--method", "block", "--quiet"]
ROUNDS = 24


def _args(out):
    return RunSpec.of(dataset=SPEC, partition_dir=out, quiet=True, partitioner="block", seed=0,
                   reorder="none")


def _worker(jobs, results):
    """Run jobs (kind, out, delay) until None: ``partition`` is gnnpar-partition in-process
    (exit code and last stderr line back); ``train`` is a trainer's prepare_shards (the run id
    of the shards it ended up with back)."""
    from gnnpar.cli import partition_cli
    from gnnpar.training import shard_source
    from gnnpar.partitioners import read_meta as meta_of
    for kind, out, delay in iter(jobs.get, None):
        time.sleep(delay)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            if kind == "partition":
                rc = partition_cli.main([*PARTITION, "--out", out])
                results.put((rc, (err.getvalue().strip().splitlines() or [""])[-1]))
                continue
            try:
                source, _ = shard_source.prepare_shards(_args(out), 2)
                results.put((0, meta_of(source.folder)["run_id"]))
            except BaseException as e:  # noqa: BLE001 - reported to the test
                results.put((1, f"{type(e).__name__}: {e}"))


@pytest.fixture(scope="module")
def workers():
    ctx = mp.get_context("spawn")  # a fresh interpreter: no forked thread pools
    jobs, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(jobs, results), daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    yield jobs, results
    for _ in procs:
        jobs.put(None)
    for p in procs:
        p.join(30)


def _race(workers, kind, out, spread):
    jobs, results = workers
    for _ in range(2):
        jobs.put((kind, out, random.uniform(0, spread)))
    return [results.get(timeout=120) for _ in range(2)]


def _assert_complete(out):
    meta = read_meta(out)
    for rank in range(2):
        load_shard(out, rank, world_size=2)
    debris = [e for e in os.listdir(out) if ".tmp-" in e or ".old-" in e]
    assert not debris, debris
    return meta["run_id"]


def test_two_partitioners_on_one_folder_never_collide(workers, tmp_path):
    random.seed(23)
    busy = 0
    for i in range(ROUNDS):
        out = str(tmp_path / f"s{i}")
        if i % 2:  # half the rounds rewrite a folder that already holds shards
            _race(workers, "partition", out, 0.0)
        outcomes = _race(workers, "partition", out, 0.03)
        for rc, line in outcomes:
            assert rc == 0 or (rc == 2 and "in use by another run (pid" in line), (i, outcomes)
        assert any(rc == 0 for rc, _ in outcomes), (i, outcomes)
        busy += sum(rc == 2 for rc, _ in outcomes)
        _assert_complete(out)
    assert busy, "no round overlapped: the race was not exercised"


def test_two_trainers_filling_one_partition_dir_write_it_once(workers, tmp_path):
    random.seed(5)
    for i in range(ROUNDS):
        out = str(tmp_path / f"p{i}")
        outcomes = _race(workers, "train", out, 0.03)
        assert all(rc == 0 for rc, _ in outcomes), (i, outcomes)
        run_id = _assert_complete(out)
        assert {r for _, r in outcomes} == {run_id}, (i, outcomes)  # written once, used twice


def test_a_trainer_waits_for_the_writer_and_uses_its_shards(tmp_path):
    from gnnpar.training import shard_source
    from gnnpar.datasets import load_dataset
    from gnnpar.partitioners import partition_graph, write_shards
    out = str(tmp_path / "p")
    got = {}
    with shard_writer(out, "--partition-dir"):
        waiter = threading.Thread(target=lambda: got.update(
            source=shard_source.prepare_shards(_args(out), 2)))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not os.path.exists(os.path.join(out, "meta.json"))
        graph = load_dataset(SPEC)
        run_id = write_shards(graph, partition_graph(graph, 2, "block"), out)["run_id"]
    waiter.join(60)
    assert got["source"][0].folder == out and read_meta(out)["run_id"] == run_id


def test_partition_cli_names_the_holder_and_exits_2(tmp_path):
    out = tmp_path / "s"
    with shard_writer(str(out), "--out"):
        res = subprocess.run([sys.executable, "-m", "gnnpar.cli.partition_cli", *PARTITION,
                              "--out", str(out)], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                             capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("gnnpar-partition: error:")]
    assert len(lines) == 1 and f"in use by another run (pid {os.getpid()})" in lines[0]
    assert os.listdir(out) == [LOCK_NAME]  # nothing written, nothing removed


def test_no_lock_file_in_a_user_folder_and_none_left_by_a_failed_write(tmp_path):
    user = tmp_path / "u"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="did not write"):
        with shard_writer(str(user)):
            pass
    assert os.listdir(user) == ["notes.txt"]
    new = tmp_path / "new"
    with pytest.raises(RuntimeError):
        with shard_writer(str(new)):
            raise RuntimeError("the dataset did not load")
    assert not new.exists()  # made for the write, removed with its lock when it failed
