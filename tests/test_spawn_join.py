"""A world of local ranks starts its work only once every rank has joined the process group
(``gnnpar.launcher.rank_join``): a rank that could not join leaves every rank failing with kind
``"join"`` before any work ran, and ``spawn`` starts such a world once more."""
import os

import pytest
import torch.distributed as dist

from gnnpar.launcher import rank_join
from gnnpar.launcher.rank_watch import RankFailure, SpawnError
from gnnpar.launcher.spawn import JOIN_TRIES, retry_unjoined, spawn


# ---------------------------------------------------------------- rank bodies (spawned)
def joins_a_second_world(rank, world, folder):
    """Leave the spawned world, then join a second one in which rank 1's join fails after
    its process group was made (as when gloo's connections broke while the world connected,
    which cannot be provoked at will): say what each rank's ``join`` raised, and whether the
    rank went on to its work. Rank 1 breaks only once rank 0 has said it joined (its key in
    the agreement store), so rank 0's own connect cannot fail on rank 1 leaving first: the
    report is then always rank 1's."""
    dist.destroy_process_group()
    store = os.path.join(folder, "second")
    if rank == 1:
        real = rank_join.init_process_group

        def breaks_after_joining(*a, **kw):
            real(*a, **kw)
            dist.FileStore(store + ".joined", -1).wait(["rank0"])
            raise RuntimeError("Connection closed by peer [127.0.0.1]:1")
        rank_join.init_process_group = breaks_after_joining
    try:
        rank_join.join("gloo", store, rank, world, 30.0)
    except rank_join.JoinFailure as e:
        return f"JoinFailure: {e}"
    return "worked"


def never_runs(rank, world, folder):
    open(os.path.join(folder, f"ran{rank}"), "w").close()
    return rank


# ---------------------------------------------------------------- tests
def test_no_rank_works_unless_every_rank_joined(tmp_path):
    out = spawn(joins_a_second_world, 2, args=(str(tmp_path),), timeout_s=30)
    assert out[0] == "JoinFailure: rank 1 could not join the process group"
    assert out[1].startswith("JoinFailure: rank 1 could not join: RuntimeError: Connection closed")


def test_a_world_that_cannot_join_is_started_again_then_reported(tmp_path, capfd):
    with pytest.raises(SpawnError) as err:  # this torch has no NCCL: no rank can join
        spawn(never_runs, 2, args=(str(tmp_path),), backend="nccl", timeout_s=30)
    assert err.value.failure.kind == "join"
    assert "could not join" in err.value.failure.message
    assert os.listdir(tmp_path) == []  # no rank ran its work, in either world
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "starting the ranks" in ln]
    assert len(lines) == JOIN_TRIES - 1 and lines[0].endswith(f"(try 2 of {JOIN_TRIES})")


def test_only_a_join_failure_is_retried():
    said, calls = [], []

    def world(failures):
        def start():
            calls.append(1)
            if failures:
                raise SpawnError(0, failures.pop(0))
            return ["done"]
        return start

    join = RankFailure("join", "rank 0 could not join: RuntimeError: Connection closed by peer")
    assert retry_unjoined(world([join]), 2, said.append) == ["done"] and len(calls) == 2
    assert said == ["gnnpar: rank 0 could not join: RuntimeError: Connection closed by peer; "
                    "starting the ranks again (try 2 of 2)"]
    calls.clear()
    with pytest.raises(SpawnError) as err:
        retry_unjoined(world([join, join, join]), 2, said.append)
    assert err.value.failure.kind == "join" and len(calls) == 2
    for kind in ("error", "input", "died", "hung", "preempted", "exit"):
        calls.clear()
        with pytest.raises(SpawnError):
            retry_unjoined(world([RankFailure(kind, "x")]), 2, said.append)
        assert len(calls) == 1, kind
