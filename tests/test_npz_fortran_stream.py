"""A Fortran-ordered feature array of an ``.npz`` is read a block of rows at a time
(datasets/file_stream.iter_npz_rows), never loaded whole: from the zip file itself when the
member is stored, through a scratch copy of the member when it is deflated; and a cache built
from such a file holds what the in-memory build holds."""
import zipfile

import numpy as np
import pytest

from gnnpar.datasets import InputError, load_dataset
from gnnpar.datasets import file_stream
from gnnpar.datasets.file_stream import iter_npz_rows


def _forbid_whole_loads(monkeypatch):
    def whole(*a, **k):
        raise AssertionError("the array was loaded whole (np.load)")
    monkeypatch.setattr(file_stream.np, "load", whole)


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("shape", [(1000, 7), (301, 2, 3), (5, 1)])
def test_fortran_rows_are_read_in_blocks(tmp_path, monkeypatch, compressed, shape):
    rng = np.random.default_rng(0)
    x = np.asfortranarray(rng.standard_normal(shape))
    path = str(tmp_path / "g.npz")
    (np.savez_compressed if compressed else np.savez)(path, x=x, other=np.arange(5))
    scratch = tmp_path / "scratch-x"
    _forbid_whole_loads(monkeypatch)
    block = 8 * 7 * 64  # 64 rows of the widest case a block
    blocks = list(iter_npz_rows(path, "x", block=block, scratch=str(scratch)))
    assert len(blocks) == -(-shape[0] // max(1, block // (8 * int(np.prod(shape[1:])))))
    assert [first for first, _ in blocks] == list(np.cumsum([0] + [len(b) for _, b in blocks])[:-1])
    got = np.concatenate([b for _, b in blocks])
    assert got.shape == shape and np.array_equal(got, x)
    assert all(b.flags.c_contiguous and b.nbytes <= block for _, b in blocks)
    assert not scratch.exists()  # the deflated member's copy is gone once read


def test_a_deflated_fortran_member_without_a_scratch_file_is_still_read(tmp_path):
    """No scratch file (an in-memory build, which holds every array anyway): loaded whole."""
    x = np.asfortranarray(np.arange(60.0).reshape(20, 3))
    path = str(tmp_path / "g.npz")
    np.savez_compressed(path, x=x)
    got = np.concatenate([b for _, b in iter_npz_rows(path, "x", block=48)])
    assert np.array_equal(got, x)


@pytest.mark.parametrize("compressed", [False, True])
def test_a_truncated_fortran_member_is_bad_input(tmp_path, compressed):
    x = np.asfortranarray(np.random.default_rng(1).standard_normal((4000, 4)))
    path = str(tmp_path / "g.npz")
    (np.savez_compressed if compressed else np.savez)(path, x=x)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("x.npy")
    data = open(path, "rb").read()
    cut = info.header_offset + 200 + info.compress_size // 2  # inside the member's data
    with open(path, "wb") as f:
        f.write(data[:cut])
    with pytest.raises(InputError, match="cannot read"):
        list(iter_npz_rows(path, "x", block=4096, scratch=str(tmp_path / "s")))


@pytest.mark.parametrize("compressed", [False, True])
def test_a_cache_from_fortran_features_equals_the_c_order_one(tmp_path, compressed):
    rng = np.random.default_rng(2)
    n = 300
    edges = rng.integers(0, n, (2, 2000))
    x = rng.standard_normal((n, 6)).astype(np.float32)
    y = rng.integers(0, 3, n)
    masks = [rng.random(n) < p for p in (0.5, 0.2, 0.3)]
    graphs = []
    for order in ("C", "F"):
        path = str(tmp_path / f"g{order}.npz")
        (np.savez_compressed if compressed else np.savez)(
            path, edge_index=edges, x=np.asarray(x, order=order), y=y, train_mask=masks[0],
            val_mask=masks[1], test_mask=masks[2])
        graphs.append(load_dataset(f"npz:{path}", cache_dir=str(tmp_path / f"cache{order}")))
    assert graphs[0].fingerprint() == graphs[1].fingerprint()
    assert not list(tmp_path.glob("cacheF/**/scratch-*"))
