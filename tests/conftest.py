"""Suite-wide settings, inherited by every rank and command the tests start.

``GNNPAR_SPMM=fixed`` (unless set): every CPU product follows the fixed size rule, never the
machine's probe (``kernels/cpu_spmm_probe.py``), so which product runs does not depend on how
busy the machine was when a probe ran; the probe's own tests set what they need.
``GNNPAR_COMM_STRICT=1``: a gnnpar module that calls a ``torch.distributed`` collective itself
(instead of going through ``gnnpar.kernels.comm``) fails the test that reaches it. And no
test may leave a SIGTERM handler behind in the test process. ``no_work``: a fixture under which
loading a dataset, spawning or training fails the test (for refusals that must come first).
"""
import os
import signal

import pytest

os.environ["GNNPAR_COMM_STRICT"] = "1"
os.environ.setdefault("GNNPAR_SPMM", "fixed")

import gnnpar.launcher.launch  # noqa: E402 (after the setting, which modules may read)
import gnnpar.cli.partition_cli  # noqa: E402
import gnnpar.training.shard_source  # noqa: E402


@pytest.fixture(autouse=True)
def _no_leaked_sigterm_handler():
    """gnnpar code run in the test process (CLI mains, trainers) leaves SIGTERM as it found it."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    after = signal.getsignal(signal.SIGTERM)
    if after is not before:
        signal.signal(signal.SIGTERM, before)
        pytest.fail(f"the test left a SIGTERM handler installed: {after!r}", pytrace=False)


@pytest.fixture
def no_work(monkeypatch):
    """Any dataset load, spawn or training fails the test: refusals come first."""
    def forbidden(*a, **k):
        raise AssertionError("work started before the flags were checked")
    monkeypatch.setattr(gnnpar.launcher.launch, "run_rank", forbidden)
    monkeypatch.setattr(gnnpar.launcher.launch, "run_distributed", forbidden)
    monkeypatch.setattr(gnnpar.training.shard_source, "load_dataset", forbidden)
    monkeypatch.setattr(gnnpar.cli.partition_cli, "load_dataset", forbidden)
