"""Issue 40's promises of the data tools, through the installed console scripts run from a
temporary working directory (no ``PYTHONPATH``):

- every tool that refuses for memory takes ``--max-memory SIZE`` (and ``GNNPAR_MAX_BYTES``),
  the flag each memory refusal names;
- ``gnnpar-partition`` checks every flag before it loads anything, and refuses a flag the
  chosen method would ignore (``--imbalance`` with block/random, ``--threads`` without
  kaminpar, ``--balance`` with random);
- a ``--cache-dir`` is the user's folder: gnnpar owns only the ``KIND-HASH`` entries it writes
  there, so outputs beside them (``--cache-dir .``, ``--checkpoint-dir cache/ck``) are
  accepted, and an output inside an entry, existing or still to be built, is refused."""
import os
import subprocess
import sys

import pytest

from gnnpar.datasets.spec import cache_entry

from .cli_util import run_main

SPEC = "sbm:n=60,blocks=3,p_in=0.2,p_out=0.02"
BLOCK = ["--dataset", SPEC, "--parts", "2", "--method", "block", "--quiet"]


def tool(name: str) -> str:
    path = os.path.join(os.path.dirname(sys.executable), name)
    assert os.path.exists(path), f"{name} is not installed beside {sys.executable}"
    return path


def run(cwd, name, *argv, env=None, timeout=300):
    """The installed ``name`` with ``argv`` in ``cwd``; no PYTHONPATH, no memory limit set
    unless ``env`` sets one."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GNNPAR_MAX_BYTES")}
    return subprocess.run([tool(name), *map(str, argv)], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def in_process(cwd, name, *argv):
    """:func:`run`'s case as ``name``'s main in this process (:func:`tests.cli_util.run_main`;
    the test process sets no memory limit)."""
    assert "GNNPAR_MAX_BYTES" not in os.environ
    return run_main(name, *argv, cwd=cwd)


def refused(res, prog, *words):
    """Exit 2, one line on stderr: ``PROG: error: ...`` holding every word."""
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), res.stderr[-2000:]
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# ---------------------------------------------------------------- 3: --max-memory everywhere
def test_partition_takes_the_max_memory_its_refusals_name(tmp_path):
    assert "--max-memory" in run(tmp_path, "gnnpar-partition", "--help").stdout
    tiny = {"GNNPAR_MAX_BYTES": "1KiB"}
    line = refused(run(tmp_path, "gnnpar-partition", *BLOCK, "--report", env=tiny),
                   "gnnpar-partition", "over the limit of 1.0 KiB")
    assert "--max-memory SIZE" in line
    # the flag it names raises the limit; and it sets one of its own
    res = run(tmp_path, "gnnpar-partition", *BLOCK, "--report", "--max-memory", "1GiB", env=tiny)
    assert res.returncode == 0, res.stderr[-2000:]
    refused(run(tmp_path, "gnnpar-partition", *BLOCK, "--report", "--max-memory", "3KiB"),
            "gnnpar-partition", "over the limit of 3.0 KiB", "set by --max-memory")
    for bad in ("0", "lots"):
        refused(run(tmp_path, "gnnpar-partition", *BLOCK, "--report", "--max-memory", bad),
                "gnnpar-partition", "--max-memory")


@pytest.mark.parametrize("argv", [
    ["gnnpar-train", "--dataset", SPEC, "--epochs", "1", "--quiet"],
    ["gnnpar-plan", "--dataset", SPEC, "--world", "2", "--top", "1"],
], ids=["train", "plan"])
def test_train_and_plan_take_it_the_same_way(tmp_path, argv):
    tiny = {"GNNPAR_MAX_BYTES": "1KiB"}
    refused(run(tmp_path, *argv, env=tiny), argv[0], "--max-memory SIZE")
    res = run(tmp_path, *argv, "--max-memory", "1GiB", env=tiny)
    assert res.returncode == 0, res.stderr[-2000:]


def test_plan_calibrate_checks_max_memory_before_probing(tmp_path):
    res = run(tmp_path, "gnnpar-plan", "--calibrate", "--calibration", "rates.json",
              "--max-memory", "0", timeout=120)
    refused(res, "gnnpar-plan", "--max-memory")
    assert not (tmp_path / "rates.json").exists()


# ---------------------------------------------------------------- 4: every flag before work
@pytest.mark.parametrize("argv,flag", [
    (["--norms", "gcn,bogus", "--report"], "--norms"),
    (["--norms", "gcn,gcn", "--out", "shards"], "--norms"),
    (["--method", "metis", "--imbalance", "7", "--report"], "--imbalance"),
    (["--method", "metis", "--imbalance", "nan", "--report"], "--imbalance"),
    (["--method", "block", "--imbalance", "-1", "--report"], "--imbalance"),
    (["--method", "block", "--imbalance", "0.1", "--report"], "--imbalance"),
    (["--method", "random", "--imbalance", "0.1", "--out", "shards"], "--imbalance"),
    (["--method", "metis", "--threads", "2", "--report"], "--threads"),
    (["--method", "random", "--balance", "edges", "--report"], "--balance"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_partition_checks_every_flag_before_loading(tmp_path, argv, flag):
    """One line naming the flag and nothing else: no progress line (nothing was loaded),
    no cache entry built, no shard folder made."""
    res = run(tmp_path, "gnnpar-partition", "--dataset", SPEC, "--parts", "2",
              "--cache-dir", "cache", *argv)
    refused(res, "gnnpar-partition", flag)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "shards").exists()


def test_partition_checks_the_dataset_spec_before_loading(tmp_path):
    res = run(tmp_path, "gnnpar-partition", "--dataset", "sbm:n=60,bogus=1", "--parts", "2",
              "--report")
    refused(res, "gnnpar-partition", "bogus")


def test_partition_flags_the_method_reads_still_run(tmp_path):
    res = run(tmp_path, "gnnpar-partition", "--dataset", SPEC, "--parts", "2", "--method",
              "metis", "--imbalance", "0.05", "--balance", "nodes", "--report", "--quiet")
    assert res.returncode == 0, res.stderr[-2000:]
    res = run(tmp_path, "gnnpar-partition", "--dataset", SPEC, "--parts", "2", "--method",
              "block", "--balance", "edges", "--report", "--quiet")
    assert res.returncode == 0, res.stderr[-2000:]
    help_text = " ".join(run(tmp_path, "gnnpar-partition", "--help").stdout.split())
    assert "refused with block and random" in help_text


# ---------------------------------------------------------------- 6: the cache folder is yours
def test_train_writes_beside_the_cache_entries(tmp_path):
    res = run(tmp_path, "gnnpar-train", "--dataset", SPEC, "--epochs", "1", "--quiet",
              "--cache-dir", ".", "--log-json", "log.jsonl", "--save-model", "model.pt")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "log.jsonl").stat().st_size > 0 and (tmp_path / "model.pt").exists()
    assert os.path.isdir(cache_entry(str(tmp_path), SPEC))
    res = run(tmp_path, "gnnpar-train", "--dataset", SPEC, "--epochs", "1", "--quiet",
              "--cache-dir", "cache", "--checkpoint-dir", "cache/ck", "--checkpoint-every", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    assert os.listdir(tmp_path / "cache" / "ck")


def test_partition_writes_beside_the_cache_entries(tmp_path):
    res = run(tmp_path, "gnnpar-partition", *BLOCK, "--cache-dir", ".", "--out", "shards")
    assert res.returncode == 0, res.stderr[-2000:]
    res = run(tmp_path, "gnnpar-partition", *BLOCK, "--cache-dir", "cache", "--out",
              "cache/shards")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "shards" / "meta.json").exists()
    assert (tmp_path / "cache" / "shards" / "meta.json").exists()


def _tree(folder):
    return sorted((os.path.relpath(os.path.join(d, f), folder), os.path.getsize(os.path.join(d, f)))
                  for d, _, files in os.walk(folder) for f in files)


def test_outputs_inside_a_cache_entry_are_refused(tmp_path):
    """An entry built (another spec's) and one this run would build: both gnnpar's."""
    other = "sbm:n=50,blocks=2,p_in=0.2,p_out=0.02"
    assert run(tmp_path, "gnnpar-partition", "--dataset", other, "--parts", "2", "--method",
               "block", "--report", "--cache-dir", "cache", "--quiet").returncode == 0
    built = os.path.relpath(cache_entry("cache", other))
    mine = os.path.relpath(cache_entry("cache", SPEC))
    before = _tree(tmp_path / "cache")
    train = ["--dataset", SPEC, "--epochs", "1", "--quiet", "--cache-dir", "cache"]
    for entry in (built, mine):  # the installed scripts for the first entry, mains for the other
        runner = run if entry == built else in_process
        refused(runner(tmp_path, "gnnpar-train", *train, "--log-json", f"{entry}/log.jsonl"),
                "gnnpar-train", "--log-json")
        refused(runner(tmp_path, "gnnpar-train", *train, "--checkpoint-dir", f"{entry}/ck"),
                "gnnpar-train", "--checkpoint-dir")
        refused(runner(tmp_path, "gnnpar-partition", *BLOCK, "--cache-dir", "cache",
                       "--out", f"{entry}/shards"), "gnnpar-partition", "--out")
        refused(runner(tmp_path, "gnnpar-partition", *BLOCK, "--cache-dir", "cache",
                       "--out", entry), "gnnpar-partition", "--out")
    refused(in_process(tmp_path, "gnnpar-train", *train, "--cache-dir", built), "gnnpar-train",
            "--cache-dir")
    assert _tree(tmp_path / "cache") == before
