"""No output lands inside a gnnpar folder, whoever's it is: every output path of every tool
(gnnpar-train's --log-json, --save-model, --profile-dir, --cache-dir, --checkpoint-dir and an
empty --partition-dir; gnnpar-partition's --out and --cache-dir; gnnpar-plan --calibrate's
--calibration; gnnpar-report's -o) inside a shard folder, a checkpoint folder or a dataset
cache is refused with exit 2 before any work, and that folder is left byte for byte."""
import os
import subprocess
import sys

import pytest

from gnnpar.datasets import InputError, load_dataset
from gnnpar.datasets.owned import MARKER, claim, claiming_folder
from gnnpar.datasets.spec import cache_entry
from gnnpar.cli.options import build_parser, check_args
from gnnpar.partitioners import partition_graph, write_shards
from gnnpar.partitioners.shards import dataset_source

from .cli_util import ROOT, run_main
from .test_shard_safety import tree

SPEC = "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A shard folder, another run's checkpoint folder, a dataset cache entry and an older
    gnnpar's shard folder (no marker), as (name -> path)."""
    base = tmp_path_factory.mktemp("owned")
    graph = load_dataset(SPEC, cache_dir=str(base / "cache"))
    (entry,) = os.listdir(base / "cache")
    shards = base / "shards"
    write_shards(graph, partition_graph(graph, 2, "block"), shards, source=dataset_source(SPEC))
    legacy = base / "legacy"
    write_shards(graph, partition_graph(graph, 2, "block"), legacy)
    os.remove(legacy / MARKER)
    ckpt = base / "ckpt"
    claim(str(ckpt), "checkpoints", {"seed": 7})
    (ckpt / "rank-00000").mkdir()
    (ckpt / "rank-00000" / "ckpt-000000003.pt").write_bytes(b"GNNPARCKPT 1\n{}\n")
    return {"shards": shards, "legacy": legacy, "ckpt": ckpt, "cache": base / "cache" / entry,
            "base": base}


def _check(argv):
    check_args(build_parser().parse_args(["--dataset", SPEC, *argv]))


TRAIN_REFUSED = [
    (["--log-json", "{shards}/meta.json"], "--log-json"),
    (["--log-json", "{shards}/new.jsonl"], "--log-json"),
    (["--save-model", "{shards}/part-00000/x.npy"], "--save-model"),
    (["--save-model", "{ckpt}/rank-00000/ckpt-000000003.pt"], "--save-model"),
    (["--log-json", "{ckpt}/log.jsonl"], "--log-json"),
    (["--log-json", "{cache}/meta.json"], "--log-json"),
    (["--save-model", "{legacy}/part-00001/y.npy"], "--save-model"),
    (["--epochs", "2", "--profile", "0", "--profile-dir", "{shards}"], "--profile-dir"),
    (["--epochs", "2", "--profile", "0", "--profile-dir", "{shards}/traces"], "--profile-dir"),
    (["--cache-dir", "{shards}"], "--cache-dir"),
    (["--cache-dir", "{shards}/cache"], "--cache-dir"),
    (["--cache-dir", "{cache}"], "--cache-dir"),
    (["--checkpoint-dir", "{shards}/ckpt"], "--checkpoint-dir"),
    (["--checkpoint-dir", "{ckpt}/rank-00000/mine"], "--checkpoint-dir"),
    (["--algo", "1d", "--nprocs", "2", "--partition-dir", "{ckpt}/shards"], "--partition-dir"),
    (["--algo", "1d", "--nprocs", "2", "--partition-dir", "{cache}/shards"], "--partition-dir"),
    (["--algo", "1d", "--nprocs", "2", "--partition-dir", "{base}/p",
      "--cache-dir", "{base}/p/cache"], "--cache-dir"),
]


@pytest.mark.parametrize("argv,flag", TRAIN_REFUSED)
def test_train_output_inside_a_gnnpar_folder_is_refused(folders, argv, flag):
    argv = [a.format(**folders) for a in argv]
    before = {k: tree(v) for k, v in folders.items() if k != "base"}
    with pytest.raises(InputError, match=flag):
        _check(argv)
    assert {k: tree(v) for k, v in folders.items() if k != "base"} == before


def test_outputs_beside_gnnpar_folders_are_accepted(folders, tmp_path):
    base = folders["base"]
    _check(["--log-json", str(tmp_path / "log.jsonl"), "--save-model", str(base / "m.pt"),
            "--cache-dir", str(base / "cache"), "--checkpoint-dir", str(tmp_path / "ck")])
    # the run's own folders of their own kind are fine: reading shards, resuming checkpoints
    _check(["--algo", "1d", "--nprocs", "2", "--partition-dir", str(folders["shards"])])
    _check(["--checkpoint-dir", str(folders["ckpt"]), "--resume", "--seed", "7"])


def test_the_cache_folder_is_the_users_its_entries_gnnpars(folders, tmp_path):
    """Outputs beside a --cache-dir's entries are accepted (the folder itself is the user's);
    inside an entry, built or the one this run would build, they are refused."""
    cache = str(folders["base"] / "cache")
    _check(["--cache-dir", cache, "--log-json", os.path.join(cache, "log.jsonl"),
            "--save-model", os.path.join(cache, "m.pt"),
            "--checkpoint-dir", os.path.join(cache, "ck")])
    fresh = str(tmp_path / "fresh")
    entry = cache_entry(fresh, SPEC)
    for argv, flag in [(["--log-json", os.path.join(entry, "log.jsonl")], "--log-json"),
                       (["--checkpoint-dir", entry], "--checkpoint-dir"),
                       (["--checkpoint-dir", fresh], "--checkpoint-dir"),
                       (["--save-model", os.path.join(str(folders["cache"]), "m.pt")],
                        "--save-model")]:
        with pytest.raises(InputError, match=flag):
            _check(["--cache-dir", fresh, *argv])
    assert not os.path.exists(fresh)


def test_claiming_folder_names_the_nearest_gnnpar_folder(folders, tmp_path):
    shards = str(folders["shards"])
    assert claiming_folder(os.path.join(shards, "part-00000", "x.npy")) == (shards, "shards")
    assert claiming_folder(os.path.join(shards, "a", "b", "c")) == (shards, "shards")
    assert claiming_folder(shards) is None  # its own path: the folder's parent is no one's
    assert claiming_folder(shards, include_self=True) == (shards, "shards")
    assert claiming_folder(str(folders["cache"] / "meta.json"))[1] == "dataset cache"
    assert claiming_folder(str(folders["ckpt"] / "rank-00000" / "x"))[1] == "checkpoints"
    assert claiming_folder(str(folders["legacy"] / "meta.json"))[1] == "shards"
    assert claiming_folder(str(tmp_path / "log.jsonl")) is None
    link = tmp_path / "link.json"
    link.symlink_to(folders["shards"] / "meta.json")  # a link into a shard folder is inside
    assert claiming_folder(str(link)) == (shards, "shards")


def _cli(module, *argv):
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _main(tool, *argv):
    """``tool``'s main in this process (:func:`tests.cli_util.run_main`), from the checkout."""
    return run_main(tool, *argv, cwd=ROOT)


def _one_error(res, prog):
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith(f"{prog}: error:")]
    assert len(lines) == 1 and "gnnpar" in lines[0], res.stderr[-2000:]


def test_every_tool_refuses_with_exit_2_and_touches_nothing(folders, tmp_path):
    shards, ckpt = folders["shards"], folders["ckpt"]
    before = (tree(shards), tree(ckpt))
    res = _cli("gnnpar.train", "--dataset", SPEC, "--epochs", "1", "--log-json",
               str(shards / "meta.json"))
    _one_error(res, "gnnpar-train")
    # the other tools' mains in this process (the first ran as a new one)
    res = _main("gnnpar-partition", "--dataset", SPEC, "--parts", "2", "--method", "block",
                "--out", str(ckpt / "rank-00000" / "shards"))
    _one_error(res, "gnnpar-partition")
    res = _main("gnnpar-plan", "--calibrate", "--calibration", str(shards / "calib.json"))
    _one_error(res, "gnnpar-plan")
    log = tmp_path / "run.jsonl"
    log.write_text('{"epoch": 0, "loss": 1.0}\n')
    res = _main("gnnpar-report", str(log), "-o", str(shards / "part-00000" / "r.png"))
    _one_error(res, "gnnpar-report")
    res = _main("gnnpar-report", str(log), "-o", str(log))
    assert res.returncode == 2 and "overwrite the log" in res.stderr, res.stderr[-2000:]
    assert (tree(shards), tree(ckpt)) == before
    assert not os.path.exists(ckpt / "rank-00000" / "shards")
