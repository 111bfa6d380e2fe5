"""gnnpar.training.checkpoint: round trip, keep-K, damaged files skipped, wrong runs refused, safe
loading, RNG capture/restore, and agreement on a common step across ranks."""
import os
import random
import warnings

import numpy as np
import pytest
import torch

from gnnpar.training.checkpoint import (MAGIC, CheckpointWarning, CorruptCheckpoint, agree_on_step,
                                        capture_rng, file_name, good_steps, list_steps, load_latest,
                                        load_step, rank_dir, restore_rng, save_checkpoint)
from gnnpar.datasets import InputError
from gnnpar.launcher.spawn import spawn

META = {"world_size": 4, "grid": [2, 2], "partition": "sha256:abc", "algo": "2d"}


def trained_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(7, 5)).sum().backward()
        opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3,
            "position": {"batch": 5, "order": torch.randperm(10)}, "lr": 0.01,
            "note": "x", "history": [1.5, 1.25, None], "rng": capture_rng()}


def assert_same(a, b, path="state"):
    assert type(a) is type(b) or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))), \
        path
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_round_trip_is_exact(tmp_path):
    state = trained_state()
    path = save_checkpoint(str(tmp_path), state, step=3, meta=META)
    assert os.path.basename(path) == file_name(3)
    ck = load_latest(str(tmp_path), expect=META)
    assert ck.step == 3 and ck.meta == META and ck.path == path
    assert_same(state, ck.state)
    # the loaded optimizer state drives an identical next step
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    model.load_state_dict(ck.state["model"])
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    opt.load_state_dict(ck.state["optim"])
    assert opt.state_dict()["state"][0]["step"] == state["optim"]["state"][0]["step"]


def test_empty_folder_gives_none(tmp_path):
    assert load_latest(str(tmp_path / "missing")) is None
    assert load_latest(str(tmp_path)) is None


def test_keep_last_k(tmp_path):
    for step in range(1, 8):
        save_checkpoint(str(tmp_path), {"step": step}, step, keep=3)
    assert list_steps(str(tmp_path)) == [7, 6, 5]
    assert sorted(os.listdir(tmp_path)) == [file_name(s) for s in (5, 6, 7)]
    assert load_latest(str(tmp_path)).state == {"step": 7}
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(str(tmp_path), {}, 8, keep=0)


def write_three(d):
    for step in (10, 20, 30):
        save_checkpoint(d, {"w": torch.full((64,), float(step)), "step": step}, step, meta=META)
    return os.path.join(d, file_name(30))


def flip_byte(path, where):
    with open(path, "r+b") as fh:
        fh.seek(where)
        b = fh.read(1)
        fh.seek(where)
        fh.write(bytes([b[0] ^ 0x5A]))


@pytest.mark.parametrize("damage", ["flip_payload", "truncate", "truncate_header", "zeroed",
                                    "appended", "bad_magic"])
def test_damaged_newest_is_skipped_for_the_previous(tmp_path, damage):
    newest = write_three(str(tmp_path))
    size = os.path.getsize(newest)
    if damage == "flip_payload":
        flip_byte(newest, size - 100)
    elif damage == "truncate":
        os.truncate(newest, size // 2)
    elif damage == "truncate_header":
        os.truncate(newest, len(MAGIC) + 10)
    elif damage == "zeroed":
        with open(newest, "wb") as fh:
            fh.write(b"\0" * size)
    elif damage == "appended":
        with open(newest, "ab") as fh:
            fh.write(b"junk")
    else:
        flip_byte(newest, 0)
    with pytest.raises(CorruptCheckpoint):
        load_step(str(tmp_path), 30)
    with pytest.warns(CheckpointWarning, match="ckpt-000000030"):
        ck = load_latest(str(tmp_path), expect=META)
    assert ck.step == 20 and torch.equal(ck.state["w"], torch.full((64,), 20.0))
    with pytest.warns(CheckpointWarning):
        assert good_steps(str(tmp_path)) == [20, 10]


def test_all_damaged_is_an_error_not_a_fresh_start(tmp_path):
    write_three(str(tmp_path))
    for step in (10, 20, 30):
        os.truncate(os.path.join(tmp_path, file_name(step)), 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        with pytest.raises(InputError, match="no readable checkpoint"):
            load_latest(str(tmp_path))


@pytest.mark.parametrize("key, value", [("world_size", 2), ("grid", [4, 1]),
                                        ("partition", "sha256:def"), ("algo", "1d-halo")])
def test_mismatched_run_is_refused(tmp_path, key, value):
    write_three(str(tmp_path))
    with pytest.raises(InputError, match=f"{key}="):
        load_latest(str(tmp_path), expect={**META, key: value})


def test_tuple_expectation_matches_saved_list_and_missing_key_refused(tmp_path):
    write_three(str(tmp_path))
    assert load_latest(str(tmp_path), expect={"grid": (2, 2)}).step == 30
    with pytest.raises(InputError, match="does not record seed"):
        load_latest(str(tmp_path), expect={"seed": 0})


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/gnnpar-evil-ran",))


def test_unsafe_state_is_refused_on_save_and_on_load(tmp_path):
    with pytest.raises(TypeError, match=r"state\['opt'\]\[1\] is a Evil"):
        save_checkpoint(str(tmp_path), {"opt": [1, Evil()]}, 1)
    with pytest.raises(TypeError, match="numpy"):
        save_checkpoint(str(tmp_path), {"a": np.zeros(3)}, 1)
    assert list_steps(str(tmp_path)) == []
    # a hand-made file with a valid checksum around a pickled callable: the safe loader
    # refuses it, nothing runs, the good older checkpoint is used
    import hashlib
    import io
    import json
    save_checkpoint(str(tmp_path), {"ok": 1}, 1)
    buf = io.BytesIO()
    torch.save({"x": Evil()}, buf)
    payload = buf.getvalue()
    header = {"step": 2, "nbytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
              "meta": {}}
    with open(os.path.join(tmp_path, file_name(2)), "wb") as fh:
        fh.write(MAGIC + json.dumps(header).encode() + b"\n" + payload)
    if os.path.exists("/tmp/gnnpar-evil-ran"):
        os.unlink("/tmp/gnnpar-evil-ran")
    with pytest.warns(CheckpointWarning, match="safe loader"):
        ck = load_latest(str(tmp_path))
    assert ck.state == {"ok": 1}
    assert not os.path.exists("/tmp/gnnpar-evil-ran")


def test_crash_debris_is_ignored_and_cleared(tmp_path):
    save_checkpoint(str(tmp_path), {"a": 1}, 1)
    dead = tmp_path / ".ckpt-2.999999999.tmp"  # a writer that died mid-write
    dead.write_bytes(MAGIC + b"half")
    assert load_latest(str(tmp_path)).state == {"a": 1}
    save_checkpoint(str(tmp_path), {"a": 2}, 2)
    assert not dead.exists()
    assert sorted(os.listdir(tmp_path)) == [file_name(1), file_name(2)]


def test_rng_capture_restore_continues_every_stream():
    torch_gen = torch.Generator().manual_seed(5)
    np_gen = np.random.default_rng(9)
    gens = {"sampler": torch_gen, "np_sampler": np_gen}
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    np.random.standard_normal()
    saved = capture_rng(gens)

    def draw():
        return (torch.rand(4).tolist(), np.random.rand(3).tolist(), np.random.standard_normal(),
                [random.random() for _ in range(3)], random.gauss(0, 1),
                torch.rand(2, generator=torch_gen).tolist(), np_gen.integers(0, 1 << 60, 3).tolist())

    first = draw()
    draw()
    # through a real save/load, as a resumed run would do it
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(d, {"rng": saved}, 0)
        loaded = load_latest(d).state["rng"]
    restore_rng(loaded, gens)
    assert draw() == first
    with pytest.raises(InputError, match="no state for generator 'other'"):
        restore_rng(loaded, {"other": torch.Generator()})


def test_rank_dir(tmp_path):
    assert rank_dir(str(tmp_path), 3).endswith("rank-00003")


def _agree_body(rank, world, cases):
    return [agree_on_step(steps_by_rank[rank]) for steps_by_rank in cases]


def test_agree_on_step_three_ranks():
    cases = [([[30, 20, 10], [30, 10], [20, 10]], 10),   # 30 missing on rank 2, 20 on rank 1
             ([[40, 30], [40, 30], [40, 30]], 40),
             ([[5], [6], [5, 6]], None),
             ([[], [1], [1]], None)]
    got = spawn(_agree_body, 3, args=([c for c, _ in cases],), timeout_s=60)
    assert got == [[want for _, want in cases]] * 3


def test_agree_without_process_group():
    assert agree_on_step([3, 9, 4]) == 9
    assert agree_on_step([]) is None
