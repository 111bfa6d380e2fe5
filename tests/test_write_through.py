"""partitioners/write_through.py: the files are the bytes np.save writes, across chunk edges."""
import os

import numpy as np
import pytest

from gnnpar.partitioners import write_through


@pytest.mark.parametrize("arr", [
    np.arange(1000, dtype=np.int64), np.zeros(0, np.float32),
    np.array([True, False, True]), np.random.default_rng(0).random((37, 5)).astype(np.float32),
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),
])
def test_save_npy_writes_what_np_save_writes(tmp_path, monkeypatch, arr):
    monkeypatch.setattr(write_through, "CHUNK", 7)  # many chunks, none aligned to an item
    write_through.save_npy(str(tmp_path / "a.npy"), arr)
    np.save(str(tmp_path / "b.npy"), np.ascontiguousarray(arr))
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()


def test_pwrite_through_at_an_offset(tmp_path, monkeypatch):
    monkeypatch.setattr(write_through, "CHUNK", 5)
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"." * 30)
    fd = os.open(path, os.O_WRONLY)
    try:
        write_through.pwrite_through(fd, np.frombuffer(b"abcdefghijklm", np.uint8), 4)
    finally:
        os.close(fd)
    assert open(path, "rb").read() == b"...." + b"abcdefghijklm" + b"." * 13


def test_background_runs_one_job_at_a_time_and_raises_its_error_in_the_caller():
    done = []
    writer = write_through.Background()
    writer.submit(done.append, 1)
    writer.submit(done.append, 2)  # waits for the first
    writer.flush()
    assert done == [1, 2]

    def fail():
        raise OSError("disk full")
    writer.submit(fail)
    with pytest.raises(OSError, match="disk full"):
        writer.submit(done.append, 3)
    assert done == [1, 2]
    writer.flush()  # the error was handed over once


def _task(owner, rank):
    write_through.background().submit(_slow_mark, owner, rank)
    return rank


def _slow_mark(folder, rank):
    import time
    time.sleep(0.05)
    open(os.path.join(folder, str(rank)), "w").close()


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_map_parts_finish_waits_for_every_workers_last_write(tmp_path, jobs):
    from gnnpar.partitioners.part_pool import map_parts
    assert map_parts(str(tmp_path), _task, range(7), jobs,
                     finish=lambda: write_through.background().flush()) == list(range(7))
    assert sorted(os.listdir(tmp_path)) == [str(r) for r in range(7)]
