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
