"""A rank that fails or dies mid-epoch: the others are stopped and the error names it."""
import time

import pytest

from gnnpar.launcher.spawn import SpawnError, spawn

from .dist_cases import fail_mid_epoch


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_failed_rank_is_named_and_nothing_hangs(how):
    t = time.monotonic()
    with pytest.raises(SpawnError) as info:
        spawn(fail_mid_epoch, 3, args=(1, how), timeout_s=30)
    assert info.value.rank == 1
    assert info.value.failure.kind == ("error" if how == "raise" else "died")
    assert ("injected failure" in str(info.value)) == (how == "raise")
    assert time.monotonic() - t < 60
