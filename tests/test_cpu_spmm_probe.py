"""The CPU SpMM size rule measured on the machine (kernels/cpu_spmm_probe.py, kernels/cpu_spmm.py):
probed once per machine key and dtype, kept in a cache file the next process reads instead of
probing; processes starting together probe once; ``GNNPAR_SPMM`` overrides it; a corrupt cache
is ignored and rewritten; where nothing can be kept, the fixed rule; small products never start
the probe; and whichever side the rule picks serves the product."""
import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest
import torch

from gnnpar.kernels import cpu_spmm, cpu_spmm_probe

pytestmark = pytest.mark.skipif(not cpu_spmm.available(), reason="numba kernel not available")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W = cpu_spmm_probe.PROBE_WIDTHS  #: the probed widths, narrowest first


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, the default mode, no rule looked up yet."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(cpu_spmm_probe.CACHE_ENV, str(folder))
    monkeypatch.setenv(cpu_spmm.ENV, "auto")
    monkeypatch.setattr(cpu_spmm, "_RULES", {})
    return folder


def fake_measure(monkeypatch, wins=W[-2:], log=None, pause=0.0):
    """Replace the probe's timing: the kernel twice as fast at the widths in ``wins``, as
    fast elsewhere. Returns the list of dtypes measured (and appends a line to ``log``)."""
    calls = []

    def measure(dtype, kernel_mm, torch_mm, rounds=cpu_spmm_probe.PROBE_ROUNDS):
        calls.append(dtype)
        if log is not None:
            with open(log, "a") as fh:
                fh.write(f"{os.getpid()}\n")
        time.sleep(pause)
        return {w: (0.5, 1.0) if w in wins else (1.0, 1.0) for w in cpu_spmm_probe.PROBE_WIDTHS}
    monkeypatch.setattr(cpu_spmm_probe, "measure", measure)
    return calls


def kernel_calls(monkeypatch):
    """Count the products the compiled kernel serves."""
    calls = []
    real = cpu_spmm.kernel_product

    def spy(A, h, out):
        calls.append(h.shape[1])
        return real(A, h, out)
    monkeypatch.setattr(cpu_spmm, "kernel_product", spy)
    return calls


def entries(folder):
    with open(folder / cpu_spmm_probe.FILE_NAME) as fh:
        return json.load(fh)["entries"]


def test_the_real_probe_keeps_its_rule_and_the_next_process_reuses_it(cache, monkeypatch):
    rule = cpu_spmm.machine_rule(torch.float32)
    key = cpu_spmm_probe.machine_key(torch.get_num_threads())
    entry = entries(cache)[key]["float32"]
    times = {int(w): tuple(v) for w, v in entry["times_s"].items()}
    assert sorted(times) == list(cpu_spmm_probe.PROBE_WIDTHS)
    assert all(k > 0 and t > 0 for k, t in times.values())
    assert cpu_spmm_probe.rule_of(times) == rule
    assert entry["rule"] == (None if rule is None else list(rule))
    # a later process (its own lookups forgotten) reads the file and measures nothing
    monkeypatch.setattr(cpu_spmm, "_RULES", {})
    calls = fake_measure(monkeypatch, wins=W)
    assert cpu_spmm.machine_rule(torch.float32) == rule and not calls
    # the entry is per dtype: bf16 is probed on its own, float32's entry kept
    assert cpu_spmm.machine_rule(torch.bfloat16) == (W[0], cpu_spmm_probe.probe_nnz() * W[0])
    assert calls == [torch.bfloat16]
    assert entries(cache)[key]["float32"] == entry


def test_the_measured_rule_decides_which_product_serves(monkeypatch):
    A = cpu_spmm_probe.probe_matrix()
    nnz = cpu_spmm_probe.probe_nnz()
    fake_measure(monkeypatch, wins=W[-2:])
    assert cpu_spmm.machine_rule(torch.float32) == (W[-2], nnz * W[-2])
    used = kernel_calls(monkeypatch)
    for width, kernel in ((W[0], False), (W[-2], True), (2 * W[-1], True)):
        used.clear()
        h = torch.randn(A.shape[1], width)
        z = cpu_spmm.csr_mm(A, h)
        assert bool(used) == kernel, width
        torch.testing.assert_close(z, torch.sparse.mm(A, h), rtol=1e-5, atol=1e-5)
    # as wide but half the rows, half the work: smaller than the probe's product, on torch
    half = A.shape[0] // 2
    cut = int(A.crow_indices()[half])
    A_half = torch.sparse_csr_tensor(A.crow_indices()[:half + 1], A.col_indices()[:cut],
                                     A.values()[:cut], (half, A.shape[1]))
    used.clear()
    cpu_spmm.csr_mm(A_half, torch.randn(A.shape[1], W[-2]))
    assert not used
    # where the kernel loses at the widest width, never the kernel
    monkeypatch.setattr(cpu_spmm, "_RULES", {})
    monkeypatch.setenv(cpu_spmm_probe.CACHE_ENV, os.environ[cpu_spmm_probe.CACHE_ENV] + "-2")
    fake_measure(monkeypatch, wins=W[:-1])
    cpu_spmm.csr_mm(A, torch.randn(A.shape[1], W[-1]))
    assert cpu_spmm.machine_rule(torch.float32) is None and not used


def test_rule_of_takes_the_narrowest_width_from_which_the_kernel_always_wins():
    n = cpu_spmm_probe.probe_nnz()
    win, lose, tie = (0.5, 1.0), (1.0, 0.5), (0.95, 1.0)  # a tie: under the margin
    assert cpu_spmm_probe.rule_of({32: win, 128: win, 256: win}) == (32, 32 * n)
    assert cpu_spmm_probe.rule_of({32: win, 128: lose, 256: win}) == (256, 256 * n)
    assert cpu_spmm_probe.rule_of({32: win, 128: win, 256: lose}) is None
    assert cpu_spmm_probe.rule_of({32: lose, 128: win, 256: tie}) is None


@pytest.mark.parametrize("mode,kernel", [("torch", False), ("numba", True), ("fixed", False)])
def test_the_environment_override_wins_and_never_probes(cache, monkeypatch, mode, kernel):
    calls = fake_measure(monkeypatch, wins=W)
    used = kernel_calls(monkeypatch)
    monkeypatch.setenv(cpu_spmm.ENV, mode)
    A = cpu_spmm_probe.probe_matrix()
    cpu_spmm.csr_mm(A, torch.randn(A.shape[1], W[-1]))
    assert bool(used) == kernel and not calls
    assert not (cache / cpu_spmm_probe.FILE_NAME).exists()


def test_small_products_never_start_the_probe(cache, monkeypatch):
    calls = fake_measure(monkeypatch, wins=W)
    A = torch.randn(60, 80).relu().to_sparse_csr()
    for width in (8, 64, 256):
        cpu_spmm.csr_mm(A, torch.randn(80, width))
        cpu_spmm.csr_mm(A, torch.randn(80, width).bfloat16())
    assert not calls and not cache.exists()


@pytest.mark.parametrize("content", ["{not json", json.dumps([1, 2]),
                                     json.dumps({"version": 0, "entries": {}}), "BROKEN"])
def test_a_corrupt_cache_file_is_ignored_and_rewritten(cache, monkeypatch, content):
    cache.mkdir()
    key = cpu_spmm_probe.machine_key(torch.get_num_threads())
    if content == "BROKEN":  # the right format, an entry of another shape
        content = json.dumps({"version": cpu_spmm_probe.VERSION,
                              "entries": {key: {"float32": {"rule": "fast"}}}})
    (cache / cpu_spmm_probe.FILE_NAME).write_text(content)
    calls = fake_measure(monkeypatch, wins=W[-1:])
    want = (W[-1], cpu_spmm_probe.probe_nnz() * W[-1])
    assert cpu_spmm.machine_rule(torch.float32) == want and calls == [torch.float32]
    assert entries(cache)[key]["float32"]["rule"] == list(want)


def test_where_nothing_can_be_kept_the_fixed_rule_serves(tmp_path, monkeypatch):
    calls = fake_measure(monkeypatch, wins=W)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(cpu_spmm_probe.CACHE_ENV, str(tmp_path / "a-file" / "cache"))
    assert cpu_spmm.machine_rule(torch.bfloat16) == cpu_spmm.SIZE_RULE[torch.bfloat16]
    assert cpu_spmm.machine_rule(torch.float32) is None  # SIZE_RULE: float32 on torch
    assert not calls


def test_a_failing_probe_gives_the_fixed_rule_and_keeps_nothing(cache, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("a product failed")
    monkeypatch.setattr(cpu_spmm_probe, "measure", broken)
    assert cpu_spmm.machine_rule(torch.bfloat16) == cpu_spmm.SIZE_RULE[torch.bfloat16]
    assert not (cache / cpu_spmm_probe.FILE_NAME).exists()


def _rule_in_child(queue):
    queue.put((os.getpid(), cpu_spmm.machine_rule(torch.float32)))


def test_processes_starting_together_probe_once(cache, monkeypatch, tmp_path):
    """Ranks that reach their first large product together: one measures (slowly here),
    the others wait for its entry instead of each probing."""
    log = tmp_path / "probes.log"
    fake_measure(monkeypatch, wins=W[-2:], log=log, pause=0.5)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    children = [ctx.Process(target=_rule_in_child, args=(queue,)) for _ in range(3)]
    for c in children:
        c.start()
    got = [queue.get(timeout=60) for _ in children]
    for c in children:
        c.join(60)
        assert c.exitcode == 0
    assert len(log.read_text().split()) == 1
    assert {rule for _, rule in got} == {(W[-2], cpu_spmm_probe.probe_nnz() * W[-2])}


def test_bench_cpu_spmm_probe_writes_the_cache(cache):
    env = dict(os.environ)
    env[cpu_spmm_probe.CACHE_ENV] = str(cache)
    res = subprocess.run([sys.executable, "scripts/bench_spmm.py", "--probe", "--write",
                          "--threads", "1", "--rule-dtypes", "fp32"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    line = json.loads(res.stdout.splitlines()[-1])
    assert line["what"] == "probe" and line["written"] and line["cached_before"] is None
    entry = entries(cache)[cpu_spmm_probe.machine_key(1)]["float32"]
    assert entry["rule"] == line["rule"]
    res = subprocess.run([sys.executable, "scripts/bench_spmm.py", "--write"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert res.returncode == 2 and "--probe" in res.stderr
