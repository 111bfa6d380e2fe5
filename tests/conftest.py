"""Suite-wide settings, inherited by every rank and command the tests start.

``GNNPAR_COMM_STRICT=1``: a gnnpar module that calls a ``torch.distributed`` collective itself
(instead of going through ``gnnpar.kernels.comm``) fails the test that reaches it. And no
test may leave a SIGTERM handler behind in the test process.
"""
import os
import signal

import pytest

os.environ["GNNPAR_COMM_STRICT"] = "1"


@pytest.fixture(autouse=True)
def _no_leaked_sigterm_handler():
    """gnnpar code run in the test process (CLI mains, trainers) leaves SIGTERM as it found it."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    after = signal.getsignal(signal.SIGTERM)
    if after is not before:
        signal.signal(signal.SIGTERM, before)
        pytest.fail(f"the test left a SIGTERM handler installed: {after!r}", pytrace=False)
