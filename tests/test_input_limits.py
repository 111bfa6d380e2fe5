"""Never lose a user's data: every input is checked before work starts.

- sizes: a dataset, a flag or an npz header whose memory estimate is over the limit (env
  ``GNNPAR_MAX_BYTES`` or ``--max-memory``; default a share of this machine's memory) is
  refused with exit 2 and one line naming the size, before anything is generated or loaded;
  a label far beyond the node count, and a world size no ranking can enumerate, likewise;
- values: a NaN/infinite --lr, --timeout, a negative --weight-decay; damaged, non-zip or
  zero-feature npz files; uint64 labels; negative edge weights under a degree normalisation;
- output paths (--log-json, --save-model, --profile-dir) are checked before training and may
  not be (or lie inside) an input;
- the JSON log is strict JSON (null for a non-finite float) and a resumed run cuts it back to
  the epochs before the one it resumes at;
- a run whose loss becomes NaN/inf stops there (serial, distributed full batch, mini batch),
  writes no checkpoint or model of it, and exits EXIT_DIVERGED with one line.
"""
import io
import json
import os
import zipfile

import numpy as np
import pytest

from gnnpar.cli.cli_common import EXIT_DIVERGED, JsonLog, cut_log
from gnnpar.datasets import InputError
from gnnpar.datasets.limits import (DEFAULT_MEMORY_SHARE, MAX_BYTES_ENV, machine_memory,
                                    memory_limit)
from gnnpar.datasets.normalize import union_structure, values_for
from gnnpar.datasets.readers import read_npz
from gnnpar.cli.options import build_parser
from gnnpar.cli.plan_cli import main as plan_main
from gnnpar.cli.spec import RunSpec
from gnnpar.train import main

SMALL = "sbm:n=300,blocks=3,p_in=0.05,p_out=0.005,feat=8,seed=1"
TINY = "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02"


@pytest.fixture(autouse=True)
def limit(monkeypatch):
    """A fixed limit (64 GiB) whatever this machine has; --max-memory in a test overrides it
    and the fixture restores the environment afterwards."""
    monkeypatch.setenv(MAX_BYTES_ENV, str(64 * 2 ** 30))


def npz_arrays(n=6, **change):
    arrays = dict(edge_index=np.array([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]]),
                  x=np.arange(n * 3, dtype=np.float32).reshape(n, 3) / 10,
                  y=np.array([0, 1, 0, 1, 0, 1]),
                  train_mask=np.array([1, 1, 0, 0, 0, 0], bool),
                  val_mask=np.array([0, 0, 1, 1, 0, 0], bool),
                  test_mask=np.array([0, 0, 0, 0, 1, 1], bool))
    arrays.update(change)
    return arrays


def write_npz(path, **change):
    np.savez(path, **npz_arrays(**change))
    return str(path)


def npy_bytes(array, claim_shape=None):
    """An .npy member; with ``claim_shape`` its header claims that shape instead."""
    buf = io.BytesIO()
    if claim_shape is None:
        np.save(buf, array)
    else:
        np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(
            array.dtype), "fortran_order": False, "shape": claim_shape})
        buf.write(array.tobytes())
    return buf.getvalue()


def write_lying_npz(path, key="x", claim_shape=(10 ** 12, 3)):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in npz_arrays().items():
            z.writestr(f"{k}.npy", npy_bytes(v, claim_shape if k == key else None))
    return str(path)


def refused(capsys, argv, *needles, cli=main, code=2):
    """Run a CLI in-process; assert the exit code and one stderr line holding ``needles``."""
    assert cli(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "no message"
    for needle in needles:
        assert needle in err[-1], err
    return err[-1]


# ---------------------------------------------------------------- 6. sizes
@pytest.mark.parametrize("spec,needles", [
    ("rmat:scale=10,ef=100000000000", ["needs about", "PiB", "edge samples"]),
    ("rmat:scale=31,ef=16", ["needs about", "TiB", "2,147,483,648 nodes"]),
    ("rmat:scale=12,ef=4,feat=100000000", ["needs about", "TiB", "100,000,000 features"]),
    ("rmat:scale=4,ef=2,classes=100000", ["rmat classes 100,000", "node count (16)"]),
    ("sbm:n=10000000000,blocks=2,p_in=0.5,p_out=0.5", ["needs about", "sbm n="]),
], ids=["rmat-ef", "rmat-scale31", "rmat-feat", "rmat-classes", "sbm-n"])
def test_synthetic_sizes_are_refused_naming_the_size(capsys, spec, needles):
    line = refused(capsys, ["--dataset", spec, "--epochs", "1", "--quiet"], *needles)
    assert "--max-memory" in line or "classes" in line


@pytest.mark.parametrize("change,needle", [
    (dict(y=np.array([0, 1, 0, 1, 0, 10 ** 9])), "num_classes (largest label + 1) 1,000,000,001"),
    (dict(num_classes=np.array(10 ** 12)), "num_classes 1,000,000,000,000"),
], ids=["label", "num_classes-key"])
def test_label_of_a_billion_is_refused(tmp_path, capsys, change, needle):
    path = write_npz(tmp_path / "g.npz", **change)
    refused(capsys, ["--dataset", f"npz:{path}", "--epochs", "1", "--quiet"],
            needle, "node count (6)", "remap")


def test_npz_header_claiming_a_trillion_rows_is_refused_before_loading(tmp_path, capsys):
    path = write_lying_npz(tmp_path / "lie.npz")
    refused(capsys, ["--dataset", f"npz:{path}", "--epochs", "1", "--quiet"],
            "(1000000000000, 3)", "TiB", "damaged")


def test_npz_over_the_limit_is_refused_from_its_headers_unless_raised(tmp_path, capsys,
                                                                      monkeypatch):
    n = 2000
    rng = np.random.default_rng(0)
    path = write_npz(tmp_path / "big.npz", x=rng.standard_normal((n, 40)),  # float64, 640 KB
                     edge_index=rng.integers(0, n, (2, 4000)), y=np.arange(n) % 3,
                     train_mask=np.arange(n) % 3 == 0, val_mask=np.arange(n) % 3 == 1,
                     test_mask=np.arange(n) % 3 == 2)
    monkeypatch.setenv(MAX_BYTES_ENV, "500KB")
    loads = []
    monkeypatch.setattr(np, "load", lambda *a, **k: loads.append(a) or pytest.fail("loaded"))
    with pytest.raises(InputError, match=r"big.npz \(2,000 nodes, 4,000 edges, 40 features\) "
                                         r"needs about 1\.[0-9] MiB.*over the limit of 488\.3 KiB"):
        read_npz(path)
    assert loads == []
    monkeypatch.undo()
    monkeypatch.setenv(MAX_BYTES_ENV, "500KB")
    assert main(["--dataset", f"npz:{path}", "--epochs", "1", "--quiet", "--hidden", "8",
                 "--max-memory", "1GiB"]) == 0


@pytest.mark.parametrize("argv,needles", [
    (["--hidden", "1000000", "--layers", "3"], ["--hidden 1000000", "TiB"]),
    (["--algo", "1d", "--nprocs", "100000"], ["--nprocs 100000", "TiB"]),
    (["--max-memory", "0"], ["--max-memory must be > 0"]),
    (["--max-memory", "lots"], ["byte size"]),
])
def test_flag_sizes_are_refused(capsys, argv, needles):
    refused(capsys, ["--dataset", TINY, "--epochs", "1", "--quiet", *argv], *needles)


def test_max_memory_raises_and_lowers_the_limit(capsys):
    spec = "rmat:scale=8,ef=4,feat=16"
    refused(capsys, ["--dataset", spec, "--epochs", "1", "--quiet", "--hidden", "4",
                     "--max-memory", "50KB"], "rmat scale=8", "KiB", "--max-memory")
    assert main(["--dataset", spec, "--epochs", "1", "--quiet", "--hidden", "4",
                 "--max-memory", "1GiB"]) == 0


def test_checking_max_memory_writes_nothing(monkeypatch):
    """Checking the flags judges sizes by --max-memory without putting it in the environment;
    the run puts it there when its work starts (where its ranks read it)."""
    monkeypatch.delenv(MAX_BYTES_ENV)
    flags = ["--dataset", TINY, "--epochs", "1", "--quiet", "--hidden", "64"]
    RunSpec.from_args(build_parser().parse_args([*flags, "--max-memory", "1GiB"]))
    assert MAX_BYTES_ENV not in os.environ
    with pytest.raises(InputError, match=r"--hidden 64 .*over the limit of 1000 B "
                                         r"\(set by --max-memory\)"):
        RunSpec.from_args(build_parser().parse_args([*flags, "--max-memory", "1000"]))
    assert MAX_BYTES_ENV not in os.environ
    assert main([*flags, "--max-memory", "1GiB"]) == 0
    assert float(os.environ[MAX_BYTES_ENV]) == 2 ** 30


def test_default_limit_is_a_share_of_this_machine(monkeypatch):
    monkeypatch.delenv(MAX_BYTES_ENV)
    limit, source = memory_limit()
    assert machine_memory() > 0
    assert limit == DEFAULT_MEMORY_SHARE * machine_memory() and "this machine" in source
    monkeypatch.setenv(MAX_BYTES_ENV, "nonsense")
    with pytest.raises(InputError, match=MAX_BYTES_ENV):
        memory_limit()


@pytest.mark.parametrize("argv,needle", [
    (["--world", "100000000"], "--world must be at most 1,048,576"),
    (["--world", "0"], "--world must be >= 1"),
    (["--world", "4", "--bandwidth", "0"], "--bandwidth must be a finite number > 0"),
    (["--world", "4", "--latency", "nan"], "--latency"),
    (["--world", "4", "--cut-fraction", "nan"], "--cut-fraction"),
    (["--world", "4", "--mem-cap", "1e999"], "byte size"),
])
def test_plan_refuses_sizes_it_cannot_rank(capsys, argv, needle):
    refused(capsys, ["--nodes", "1000", "--edges", "10000", *argv], needle, cli=plan_main)


def test_plan_dataset_size_is_checked_before_generating(capsys):
    refused(capsys, ["--world", "4", "--dataset", "rmat:scale=31,ef=64"], "needs about",
            cli=plan_main)


# ---------------------------------------------------------------- 8. values and paths
@pytest.mark.parametrize("argv,needle", [
    (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
    (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    (["--weight-decay", "-5"], "--weight-decay must be a finite number >= 0"),
    (["--weight-decay", "nan"], "--weight-decay"),
    (["--timeout", "nan"], "--timeout must be a finite number > 0"),
    (["--timeout", "inf"], "--timeout"),
])
def test_non_finite_and_negative_values_are_refused(capsys, argv, needle):
    refused(capsys, ["--dataset", TINY, "--epochs", "1", "--quiet", *argv], needle)


@pytest.mark.parametrize("content,needle", [
    ("truncated", "damaged or truncated"),
    ("npy", "single .npy array (np.save)"),
    ("text", "not a zip archive"),
])
def test_damaged_and_non_zip_npz(tmp_path, capsys, content, needle):
    good = open(write_npz(tmp_path / "good.npz"), "rb").read()
    path = tmp_path / "bad.npz"
    if content == "truncated":
        path.write_bytes(good[:len(good) // 2])
    elif content == "npy":
        np.save(open(path, "wb"), np.ones(3))
    else:
        path.write_text("edge_index,x\n1,2\n")
    refused(capsys, ["--dataset", f"npz:{path}", "--epochs", "1", "--quiet"],
            f"cannot read {path} as .npz", needle)


@pytest.mark.parametrize("change,needle", [
    (dict(x=np.ones((6, 0), np.float32)), "x has no feature columns"),
    (dict(y=np.array([0, 1, 0, 1, 0, 2 ** 64 - 1], np.uint64)),
     "label 18446744073709551615 (uint64)"),
])
def test_zero_features_and_uint64_labels(tmp_path, capsys, change, needle):
    path = write_npz(tmp_path / "g.npz", **change)
    refused(capsys, ["--dataset", f"npz:{path}", "--epochs", "1", "--quiet"], needle)


def test_uint64_labels_that_fit_still_load(tmp_path):
    path = write_npz(tmp_path / "g.npz", y=np.array([0, 1, 0, 1, 0, 2], np.uint64))
    g = read_npz(path)
    assert g.num_classes == 3 and g.y.dtype == np.int64


@pytest.mark.parametrize("model,kind", [("gcn", "gcn"), ("sage", "mean")])
def test_negative_edge_weights_are_refused_by_degree_normalisations(tmp_path, capsys, model,
                                                                    kind):
    path = write_npz(tmp_path / "w.npz", edge_weight=np.array([1, -2, 1, 1, 1, 1], np.float32))
    refused(capsys, ["--dataset", f"npz:{path}", "--epochs", "1", "--quiet", "--model", model],
            f"the {kind} normalisation needs edge weights >= 0", "negative weight")
    indptr, indices, raw = union_structure(read_npz(path))
    assert (values_for("sum", indptr, indices, raw) < 0).any()  # sum takes them as they are


@pytest.mark.parametrize("flag,make,needle", [
    ("--log-json", lambda d: d.mkdir() or d, "is a folder"),
    ("--save-model", lambda d: d.mkdir() or d, "is a folder"),
    ("--log-json", lambda d: (d.write_text("x"), d / "log.jsonl")[1], "is a file, not a folder"),
    ("--save-model", lambda d: (d.write_text("x"), d / "sub" / "m.pt")[1],
     "is a file, not a folder"),
])
def test_output_paths_are_checked_before_training(tmp_path, capsys, flag, make, needle):
    out = make(tmp_path / "out")
    other = tmp_path / ("m.pt" if flag == "--log-json" else "log.jsonl")
    other_flag = "--save-model" if flag == "--log-json" else "--log-json"
    refused(capsys, ["--dataset", TINY, "--epochs", "2", "--quiet", flag, str(out),
                     other_flag, str(other)], flag, needle)
    assert not other.exists()  # refused before training: nothing was written


def test_profile_dir_is_checked_before_training(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    log = tmp_path / "log.jsonl"
    refused(capsys, ["--dataset", TINY, "--epochs", "2", "--quiet", "--profile", "1",
                     "--profile-dir", str(tmp_path / "file" / "traces"), "--log-json", str(log)],
            "--profile-dir", "is a file, not a folder")
    assert not log.exists()


@pytest.mark.parametrize("flag", ["--log-json", "--save-model"])
def test_outputs_may_not_overwrite_the_dataset(tmp_path, capsys, flag):
    path = write_npz(tmp_path / "g.npz")
    before = open(path, "rb").read()
    os.symlink(path, tmp_path / "link.npz")
    for target in (path, str(tmp_path / "." / "g.npz"), str(tmp_path / "link.npz")):
        refused(capsys, ["--dataset", f"npz:{tmp_path / 'link.npz'}", "--epochs", "1",
                         "--quiet", flag, target], flag, "would overwrite the dataset")
    assert open(path, "rb").read() == before


def test_outputs_may_not_go_into_a_folder_gnnpar_owns(tmp_path, capsys):
    ck = tmp_path / "ck"  # not made yet: the log inside would make the folder foreign later
    refused(capsys, ["--dataset", TINY, "--epochs", "1", "--quiet", "--checkpoint-dir", str(ck),
                     "--log-json", str(ck / "log.jsonl")], "--log-json",
            f"would write into --checkpoint-dir {ck}")
    assert not ck.exists()


def test_log_and_model_may_not_be_one_file(tmp_path, capsys):
    same = str(tmp_path / "out")
    refused(capsys, ["--dataset", TINY, "--epochs", "1", "--quiet", "--log-json", same,
                     "--save-model", same], "same file")


def test_outputs_to_a_device_still_work(capsys):
    assert main(["--dataset", TINY, "--epochs", "1", "--quiet", "--log-json", "/dev/null",
                 "--save-model", "/dev/null"]) == 0
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


# ---------------------------------------------------------------- 9. the JSON log
def strict_lines(path):
    def no_constant(name):
        raise AssertionError(f"{name} is not JSON")
    with open(path) as f:
        return [json.loads(line, parse_constant=no_constant) for line in f]


def test_resumed_run_cuts_its_log_back_to_the_checkpoint(tmp_path):
    log, ck = tmp_path / "log.jsonl", tmp_path / "ck"
    common = ["--dataset", TINY, "--quiet", "--hidden", "8", "--checkpoint-dir", str(ck),
              "--checkpoint-every", "2", "--log-json", str(log)]
    assert main([*common, "--epochs", "3"]) == 0  # epochs 0, 1, 2 logged; checkpoint at 1
    assert [r.get("epoch") for r in strict_lines(log)] == [0, 1, 2, None]
    assert main([*common, "--epochs", "5", "--resume"]) == 0  # resumes at epoch 2
    recs = strict_lines(log)
    assert [r.get("epoch") for r in recs] == [0, 1, 2, 3, 4, None]
    # the final record covers the whole run, not only the resumed segment
    assert [r.get("final") for r in recs].count(True) == 1 and recs[-1]["epochs"] == 5


def test_cut_log_drops_later_epochs_finals_and_half_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"epoch": 0, "loss": 1}\n{"epoch": 1, "loss": 1}\n{"final": true}\n'
                    '{"epoch": 2, "loss": 1}\n{"epoch": 3, "lo')
    assert cut_log(str(path), 2) == 2
    assert path.read_text() == '{"epoch": 0, "loss": 1}\n{"epoch": 1, "loss": 1}\n'
    log = JsonLog(str(path), resume_epoch=1)
    log.write({"epoch": 1, "loss": float("nan"), "acc": [float("inf"), 0.5]})
    log.close()
    assert strict_lines(path) == [{"epoch": 0, "loss": 1},
                                  {"epoch": 1, "loss": None, "acc": [None, 0.5]}]


# ---------------------------------------------------------------- 9. divergence
def test_diverged_serial_run_stops_and_says_so(tmp_path, capsys):
    log, model, ck = tmp_path / "log.jsonl", tmp_path / "m.pt", tmp_path / "ck"
    line = refused(capsys, ["--dataset", SMALL, "--epochs", "6", "--quiet", "--lr", "1e30",
                            "--log-json", str(log), "--save-model", str(model),
                            "--checkpoint-dir", str(ck)],
                   "gnnpar-train: training diverged at epoch 1 (loss nan)", "--save-model",
                   code=EXIT_DIVERGED)
    assert line.startswith("gnnpar-train: training diverged")
    recs = strict_lines(log)  # strict JSON: the NaN loss is null
    assert [r.get("epoch") for r in recs] == [0, 1, None]
    assert recs[1]["loss"] is None and recs[-1]["loss"] is None
    assert recs[-1]["final"] is True and recs[-1]["diverged_epoch"] == 1
    assert not model.exists()  # NaN weights are not saved
    files = sorted(f for f in os.listdir(ck / "rank-00000") if f.startswith("ckpt-"))
    assert files == ["ckpt-000000000.pt"]  # nor checkpointed: epoch 0 only


def test_features_near_the_float32_limit_diverge(tmp_path, capsys):
    # 3e38 is finite, so the file is accepted; the input dropout's 1/(1-p) = 2 scaling makes
    # it inf whatever the weights (1e38 overflowed only under a wider initialisation)
    path = write_npz(tmp_path / "g.npz", x=np.full((6, 3), 3e38, np.float32))
    refused(capsys, ["--dataset", f"npz:{path}", "--epochs", "3", "--quiet"],
            "training diverged at epoch", code=EXIT_DIVERGED)  # which one: the masks'


@pytest.mark.parametrize("mode", [
    ["--algo", "1d", "--nprocs", "2", "--partitioner", "block"],
    ["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "32", "--nprocs", "2",
     "--partitioner", "block"],
], ids=["fullbatch-1d-p2", "minibatch-p2"])
def test_diverged_distributed_run_stops_on_every_rank(tmp_path, capsys, mode):
    log = tmp_path / "log.jsonl"
    refused(capsys, ["--dataset", SMALL, "--epochs", "6", "--quiet", "--lr", "1e30",
                     "--hidden", "8", "--log-json", str(log), *mode],
            "training diverged at epoch", code=EXIT_DIVERGED)
    recs = strict_lines(log)
    assert recs[-1]["final"] and recs[-1]["diverged_epoch"] == recs[-2]["epoch"] < 5
    assert recs[-2]["loss"] is None
