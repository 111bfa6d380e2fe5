"""Shard folders never cost a user data: gnnpar writes only into folders it can prove are its
own shards (else exit 2, every file in place), loads only what a valid graph can hold, follows
no symbolic link out of a shard folder, unpickles nothing, matches --partition-dir against
--dataset, and leaves no temporary shard folder behind."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gnnpar.datasets import InputError, load_dataset
from gnnpar.datasets.owned import LOCK_NAME, MARKER, FolderBusy, FolderLock, read_claim
from gnnpar.partitioners import load_shard, partition_graph, read_meta, write_shards
from gnnpar.partitioners.shards import check_shard_folder, dataset_source, part_dir

from .cli_util import ROOT


SPEC = "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02"
OTHER = "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02,seed=1"


def partition_cli(*args, env=None):
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-m", "gnnpar.cli.partition_cli", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def train(*args, tmpdir=None):
    env = {**os.environ, "PYTHONPATH": ROOT}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run([sys.executable, "-m", "gnnpar.train", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def error_lines(stderr: str, prog: str) -> list:
    return [ln for ln in stderr.splitlines() if ln.startswith(f"{prog}: ")]


def tree(folder) -> dict:
    """relative path -> file bytes (links: their target) of everything under ``folder``."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                out[rel] = "-> " + os.readlink(path)
            elif name in files:
                with open(path, "rb") as f:
                    out[rel] = f.read()
            else:
                out[rel] = "dir"
    return out


@pytest.fixture(scope="module")
def graph():
    return load_dataset(SPEC)


@pytest.fixture
def shards(graph, tmp_path):
    d = tmp_path / "shards"
    write_shards(graph, partition_graph(graph, 2, "block"), d,
                 source=dataset_source(SPEC))
    return d


# ------------------------------------------------------------------ item 1: writing
def test_partition_cli_refuses_a_folder_with_user_files(tmp_path):
    u = tmp_path / "u"
    (u / "grid").mkdir(parents=True)
    (u / "part-00007").mkdir()
    (u / "grid" / "a.tex").write_text("x")
    before = tree(u)
    r = partition_cli("--dataset", SPEC, "--parts", "2", "--method", "block", "--out", str(u))
    assert r.returncode == 2, r.stderr
    lines = error_lines(r.stderr, "gnnpar-partition")
    assert len(lines) == 1 and "did not write" in lines[0] and "Traceback" not in r.stderr
    assert tree(u) == before


def _user_file(d):
    (d / "notes.txt").write_text("mine")


def _user_part_folder(d):
    (d / "part-00007").mkdir()
    (d / "part-00007" / "data.csv").write_text("1,2")


def _user_file_in_gnnpar_part(d):
    (d / "part-00001" / "mine.txt").write_text("mine")


def _other_marker(d):
    (d / MARKER).write_text(json.dumps({"tool": "gnnpar", "kind": "checkpoints",
                                        "identity": None}))


def _user_meta_only(d):
    for entry in os.listdir(d):
        if entry != "meta.json":
            p = d / entry
            if p.is_dir():
                import shutil
                shutil.rmtree(p)
            else:
                p.unlink()
    (d / "meta.json").write_text(json.dumps({"format_version": 1, "note": "not gnnpar's"}))


@pytest.mark.parametrize("spoil,needle", [
    (_user_file, "notes.txt"),
    (_user_part_folder, "part-00007"),
    (_user_file_in_gnnpar_part, "part-00001"),
    (_other_marker, "holds gnnpar checkpoints"),
    (_user_meta_only, "meta.json"),
])
def test_write_refuses_anything_gnnpar_did_not_write(graph, shards, spoil, needle):
    spoil(shards)
    before = tree(shards)
    with pytest.raises(InputError, match=needle):
        write_shards(graph, partition_graph(graph, 3, "block"), shards)
    assert tree(shards) == before                      # nothing removed, nothing added


def test_write_refuses_a_symlink_and_leaves_its_target(graph, shards, tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "thesis.tex").write_text("years of work")
    os.symlink(target, shards / "part-00005")          # would be removed as a part >= P
    with pytest.raises(InputError, match="part-00005"):
        write_shards(graph, partition_graph(graph, 2, "block"), shards)
    assert (target / "thesis.tex").read_text() == "years of work"
    assert os.path.islink(shards / "part-00005")


def test_rewrite_of_gnnpar_shards_removes_only_gnnpar_files(graph, tmp_path):
    d = tmp_path / "s"
    write_shards(graph, partition_graph(graph, 3, "block"), d)
    assert read_claim(str(d))["kind"] == "shards"
    os.rename(part_dir(d, 1), f"{part_dir(d, 1)}.tmp-4242")   # debris of a crash
    write_shards(graph, partition_graph(graph, 2, "block"), d)
    # the lock file stays, as in a folder the command-line tools write
    assert sorted(os.listdir(d)) == [LOCK_NAME, MARKER, "meta.json", "part-00000", "part-00001"]
    assert read_meta(d)["parts"] == 2


def test_library_write_takes_the_folder_lock(graph, tmp_path):
    """``write_shards`` called from a user's code holds the folder's write lock as
    ``gnnpar-partition`` does: a second writer is refused, naming the holder, and the folder
    it would have written is left as it was."""
    d = tmp_path / "s"
    write_shards(graph, partition_graph(graph, 2, "block"), d)
    before = sorted(os.listdir(d)), read_meta(d)["run_id"]
    held = FolderLock(str(d), "shard folder")  # another writer (a lock of its own file)
    try:
        with pytest.raises(FolderBusy, match="pid"):
            write_shards(graph, partition_graph(graph, 3, "block"), d)
    finally:
        held.release()
    assert (sorted(os.listdir(d)), read_meta(d)["run_id"]) == before
    write_shards(graph, partition_graph(graph, 3, "block"), d)  # once it is free
    assert read_meta(d)["parts"] == 3


def test_older_gnnpar_shards_are_accepted_and_marked(graph, shards):
    os.remove(shards / MARKER)                          # written before markers existed
    meta = read_meta(shards)
    meta.pop("source")
    (shards / "meta.json").write_text(json.dumps(meta))
    assert check_shard_folder(str(shards)) == "legacy"
    write_shards(graph, partition_graph(graph, 2, "random"), shards)
    assert read_claim(str(shards))["kind"] == "shards"
    assert read_meta(shards)["method"] == "random"


def test_unmarked_debris_without_meta_is_refused(graph, shards):
    os.remove(shards / MARKER)
    os.remove(shards / "meta.json")
    with pytest.raises(InputError, match="no meta.json and no gnnpar marker"):
        write_shards(graph, partition_graph(graph, 2, "block"), shards)
    assert sorted(os.listdir(shards)) == [LOCK_NAME, "part-00000", "part-00001"]


def test_train_partition_dir_with_user_files_exits_2(tmp_path):
    u = tmp_path / "u"
    (u / "grid").mkdir(parents=True)
    (u / "grid" / "a.tex").write_text("x")
    before = tree(u)
    r = train("--algo", "1d", "--nprocs", "2", "--dataset", SPEC, "--partition-dir", str(u),
              "--epochs", "1", "--quiet")
    assert r.returncode == 2, r.stderr
    lines = error_lines(r.stderr, "gnnpar-train")
    assert len(lines) == 1 and "--partition-dir" in lines[0] and "did not write" in lines[0]
    assert tree(u) == before


# ------------------------------------------------------------------ item 4: --dataset vs shards
def _args(**kw):
    from gnnpar.cli.spec import RunSpec
    return RunSpec.of(**kw)


def test_partition_dir_must_hold_the_given_dataset(shards, monkeypatch):
    from gnnpar.training import shard_source
    meta = read_meta(shards)
    assert meta["source"]["spec"] == SPEC
    loads = []
    real = shard_source.load_graph
    monkeypatch.setattr(shard_source, "load_graph", lambda a: loads.append(a.data.dataset) or real(a))
    shard_source.check_shards_dataset(_args(), str(shards))                  # no --dataset: as is
    shard_source.check_shards_dataset(_args(dataset=SPEC), str(shards))      # same: cheap
    # the same graph written differently: keys in another order, defaults spelt out
    shard_source.check_shards_dataset(_args(dataset="sbm:blocks=3,n=60,p_out=0.02,p_in=0.2,seed=0"),
                                    str(shards))
    assert loads == []                                                     # nothing loaded
    with pytest.raises(InputError, match="holds shards of sbm:n=60"):
        shard_source.check_shards_dataset(_args(dataset=OTHER), str(shards))
    with pytest.raises(InputError, match="another graph|holds shards of"):
        shard_source.check_shards_dataset(_args(dataset=SPEC, directed=True), str(shards))
    meta.pop("source")                                   # shards of an older gnnpar
    (shards / "meta.json").write_text(json.dumps(meta))
    shard_source.check_shards_dataset(_args(dataset=SPEC), str(shards))      # by fingerprint
    with pytest.raises(InputError, match="fingerprint"):
        shard_source.check_shards_dataset(_args(dataset=OTHER), str(shards))


def test_train_refuses_shards_of_another_dataset(tmp_path):
    d = tmp_path / "s"
    r = partition_cli("--dataset", SPEC, "--parts", "2", "--method", "block", "--out", str(d),
                      "--quiet")
    assert r.returncode == 0, r.stderr
    r = train("--algo", "1d", "--nprocs", "2", "--dataset", OTHER, "--partition-dir", str(d),
              "--epochs", "1", "--quiet")
    assert r.returncode == 2, r.stderr
    lines = error_lines(r.stderr, "gnnpar-train")
    assert len(lines) == 1 and "not of --dataset" in lines[0]


# ------------------------------------------------------------------ item 5: contents
def _poke(path, fn):
    arr = np.load(path, mmap_mode="r+")
    fn(arr)
    arr.flush()
    del arr


@pytest.mark.parametrize("rel,fn,needle", [
    ("x.npy", lambda a: a.__setitem__((3, 1), np.nan), "feature NaN or inf at row 3"),
    ("x.npy", lambda a: a.__setitem__((0, 0), np.inf), "feature NaN or inf at row 0"),
    ("y.npy", lambda a: a.__setitem__(2, 3), r"label 3 is outside \[0, 3\)"),
    ("y.npy", lambda a: a.__setitem__(2, -1), r"label -1 is outside"),
    ("indices.npy", lambda a: a.__setitem__(0, 10 ** 6), "column 1000000"),
    ("values_gcn.npy", lambda a: a.__setitem__(0, np.nan), "NaN or inf"),
    ("global_ids.npy", lambda a: a.__setitem__(0, -5), "vertex id -5"),
])
def test_load_refuses_corrupt_contents_naming_the_file(shards, rel, fn, needle):
    path = os.path.join(part_dir(shards, 1), rel)
    _poke(path, fn)
    with pytest.raises(InputError, match=needle) as err:
        load_shard(shards, 1, world_size=2)
    assert path in str(err.value)
    load_shard(shards, 0, world_size=2)                 # the intact rank still loads


def test_load_validates_in_chunks(shards, monkeypatch):
    import gnnpar.partitioners.shard_check as shard_check
    monkeypatch.setattr(shard_check, "CHECK_ELEMS", 7)  # a NaN far from the first chunk
    path = os.path.join(part_dir(shards, 0), "x.npy")
    n_local = np.load(path).shape[0]
    _poke(path, lambda a: a.__setitem__((n_local - 1, 0), np.nan))
    with pytest.raises(InputError, match=f"row {n_local - 1}"):
        load_shard(shards, 0)


def test_train_with_a_nan_shard_exits_2(tmp_path):
    d = tmp_path / "s"
    r = partition_cli("--dataset", SPEC, "--parts", "2", "--method", "block", "--out", str(d),
                      "--quiet")
    assert r.returncode == 0, r.stderr
    _poke(os.path.join(part_dir(d, 0), "x.npy"), lambda a: a.__setitem__((0, 0), np.nan))
    r = train("--algo", "1d", "--nprocs", "2", "--partition-dir", str(d), "--epochs", "1",
              "--quiet")
    assert r.returncode == 2, r.stderr + r.stdout
    lines = error_lines(r.stderr, "gnnpar-train")
    assert len(lines) == 1 and "x.npy" in lines[0] and "NaN" in lines[0], r.stderr


# ------------------------------------------------------------------ item 13: links, pickles
def test_symlink_inside_a_shard_folder_is_refused(shards, tmp_path):
    outside = tmp_path / "outside.npy"
    inside = os.path.join(part_dir(shards, 0), "x.npy")
    os.replace(inside, outside)                         # same bytes, same size, now elsewhere
    os.symlink(outside, inside)
    with pytest.raises(InputError, match="symbolic link"):
        load_shard(shards, 0)
    moved = tmp_path / "part1"
    os.replace(part_dir(shards, 1), moved)              # a whole part folder linked in
    os.symlink(moved, part_dir(shards, 1))
    with pytest.raises(InputError, match="symbolic link"):
        load_shard(shards, 1)


def test_manifest_naming_a_file_outside_is_refused(shards, tmp_path):
    np.save(tmp_path / "evil.npy", np.zeros(3))
    man = os.path.join(part_dir(shards, 0), "part.json")
    with open(man) as f:
        m = json.load(f)
    m["files"]["../../evil.npy"] = os.path.getsize(tmp_path / "evil.npy")
    with open(man, "w") as f:
        json.dump(m, f)
    with pytest.raises(InputError, match="not a file inside"):
        load_shard(shards, 0)


@pytest.mark.parametrize("mmap", [True, False])
def test_a_pickled_array_is_not_loaded(shards, mmap):
    folder = part_dir(shards, 0)
    path = os.path.join(folder, "halo_ids.npy")
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    man = os.path.join(folder, "part.json")
    with open(man) as f:
        m = json.load(f)
    m["files"]["halo_ids.npy"] = os.path.getsize(path)   # sizes agree: only np.load can refuse
    with open(man, "w") as f:
        json.dump(m, f)
    with pytest.raises(InputError, match="cannot read .*halo_ids.npy"):
        load_shard(shards, 0, mmap=mmap)


def test_every_np_load_in_shards_refuses_pickles():
    import ast
    import gnnpar.partitioners.shards as shards_mod
    with open(shards_mod.__file__) as f:
        tree_ = ast.parse(f.read())
    calls = [n for n in ast.walk(tree_) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "load"
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "np"]
    assert calls
    for call in calls:
        kw = {k.arg: k.value for k in call.keywords}
        assert "allow_pickle" in kw and isinstance(kw["allow_pickle"], ast.Constant) \
            and kw["allow_pickle"].value is False, ast.dump(call)


# ------------------------------------------------------------------ item 10: $TMPDIR
def _bad_label_npz(path):
    g = load_dataset(SPEC)
    y = np.array(g.y)
    y[0] = g.num_classes + 5
    src, dst = g.edges()
    np.savez(path, edge_index=np.stack([src, dst]), x=g.x, y=y, train_mask=g.train_mask,
             val_mask=g.val_mask, test_mask=g.test_mask, num_classes=g.num_classes)


@pytest.mark.parametrize("bad,needle", [("partitioner", "unknown partition method"),
                                        ("labels", "label 8 is outside")])
def test_bad_input_nprocs_run_leaves_nothing_in_tmpdir(tmp_path, bad, needle):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    if bad == "partitioner":
        extra = ["--dataset", SPEC, "--partitioner", "nosuch"]
    else:
        _bad_label_npz(tmp_path / "g.npz")
        extra = ["--dataset", f"npz:{tmp_path / 'g.npz'}"]
    r = train("--algo", "1d", "--nprocs", "2", *extra, "--epochs", "1", "--quiet",
              tmpdir=tmpdir)
    assert r.returncode == 2, r.stderr
    lines = error_lines(r.stderr, "gnnpar-train")
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert os.listdir(tmpdir) == []


def test_prepare_shards_removes_its_temporary_folder_on_any_failure(tmp_path, monkeypatch):
    import tempfile
    from gnnpar.training import shard_source
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("gnnpar.training.shard_source.write_shards", interrupted)
    args = _args(dataset=SPEC, quiet=True, partitioner="block", seed=0)
    with pytest.raises(KeyboardInterrupt):
        shard_source.prepare_shards(args, 2)
    assert os.listdir(tmp_path) == []


def test_temporary_shards_of_a_killed_run_are_removed_by_the_next(tmp_path, monkeypatch):
    """A SIGKILLed --nprocs parent cannot remove its temporary shards; the next run does (its
    owner file names a process that is gone), and keeps a live process's folder."""
    import tempfile
    from gnnpar.training import shard_source
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = ("import os, signal\nfrom gnnpar.launcher.scratch import make_scratch_dir\n"
            "os.makedirs(os.path.join(make_scratch_dir('gnnpar-shards-'), 'shards', 'part-00000'))\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=ROOT)
    subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    [dead] = os.listdir(tmp_path)
    from gnnpar.launcher.scratch import make_scratch_dir
    live = os.path.basename(make_scratch_dir("gnnpar-shards-"))
    args = _args(dataset=SPEC, quiet=True, partitioner="block", seed=0)
    source, temporary = shard_source.prepare_shards(args, 2)
    out = source.folder
    assert temporary and os.path.basename(out) == "shards"
    names = set(os.listdir(tmp_path))
    assert dead not in names and live in names and os.path.basename(os.path.dirname(out)) in names


# ------------------------------------------------------------------ issue 23: value dtypes, send lists
def _replace_array(folder, rel, arr):
    """Write ``arr`` as ``rel`` and update the manifest's byte size, as a careful edit would."""
    path = os.path.join(folder, rel)
    np.save(path, arr)
    with open(os.path.join(folder, "part.json")) as f:
        manifest = json.load(f)
    manifest["files"][rel] = os.path.getsize(path)
    with open(os.path.join(folder, "part.json"), "w") as f:
        json.dump(manifest, f)
    return path


@pytest.mark.parametrize("rel", ["values_gcn.npy", "values_mean.npy", "raw_weight.npy"])
def test_float16_values_are_refused(shards, rel):
    folder = part_dir(shards, 1)
    path = _replace_array(folder, rel, np.load(os.path.join(folder, rel)).astype(np.float16))
    with pytest.raises(InputError, match="dtype float16") as err:
        load_shard(shards, 1, world_size=2)
    assert path in str(err.value)
    load_shard(shards, 0, world_size=2)


def test_an_in_range_edit_of_the_send_list_is_refused(shards):
    folder = part_dir(shards, 0)
    send = np.load(os.path.join(folder, "send_local.npy"))
    n_local = np.load(os.path.join(folder, "global_ids.npy")).shape[0]
    assert send.size and n_local > 1
    edited = send.copy()
    edited[0] = (edited[0] + 1) % n_local                # still a valid local id
    path = _replace_array(folder, "send_local.npy", edited)
    with pytest.raises(InputError, match="not the halo rows rank 1 expects") as err:
        load_shard(shards, 0, world_size=2)
    assert path in str(err.value)
    load_shard(shards, 1, world_size=2)                  # rank 1's own lists are intact


def test_send_counts_moved_between_ranks_are_refused(shards):
    folder = part_dir(shards, 0)
    counts = np.load(os.path.join(folder, "send_counts.npy"))
    assert counts[0] == 0 and counts[1] > 0
    _replace_array(folder, "send_counts.npy", np.array([1, counts[1] - 1], counts.dtype))
    with pytest.raises(InputError, match="send_counts.npy"):
        load_shard(shards, 0, world_size=2)
