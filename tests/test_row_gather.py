"""The output pool of :mod:`gnnpar.sampling.row_gather`: a buffer is lent again only once
nothing outside the pool can reach its memory, whatever holds it."""
import ctypes
import gc
import threading
import warnings

import numpy as np
import pytest
import torch

from gnnpar.sampling import row_gather


def _typed_storage(t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated, and still reachable
        return t.storage()


#: ways a user keeps a lent output's memory reachable after dropping the tensor itself
HOLDERS = {
    "untyped storage": lambda t: t.untyped_storage(),
    "typed storage": _typed_storage,
    "base": lambda t: t._base,
    "view": lambda t: t[3:9],
    "numpy": lambda t: t.numpy(),
    "memoryview": lambda t: memoryview(t.numpy()),
    "dlpack": lambda t: torch.utils.dlpack.to_dlpack(t),
    "storage slice": lambda t: t.untyped_storage()[64:128],
    "set_ onto the storage": lambda t: torch.empty(0).set_(t.untyped_storage()),
}


def _reaches(t: torch.Tensor):
    """The byte range of a tensor's storage."""
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_buffer_is_not_lent_while_anything_reaches_it(holder):
    x = torch.randn(64, 16)
    pool = row_gather.OutputPool(limit=1)
    first = pool.take(x, [40])[0]
    first.fill_(1.0)
    span = _reaches(first)
    held = HOLDERS[holder](first)
    del first
    gc.collect()
    again = pool.take(x, [40])[0]  # the pool's only buffer is held: a fresh output
    assert not _overlap(_reaches(again), span), holder
    again.fill_(2.0)
    # read through the address, not through a tensor (which would hold the memory itself)
    seen = np.ctypeslib.as_array((ctypes.c_float * (40 * 16)).from_address(span[0]))
    assert bool((seen == 1.0).all()), holder  # not written through the second loan
    del held, again
    gc.collect()
    reused = pool.take(x, [40])[0]  # nothing reaches it now: the buffer is lent again
    assert _reaches(reused)[0] == span[0]


def test_holders_of_gathered_rows_keep_them():
    """The service's path (:func:`row_gather.gather_groups`, this thread's pool): rows whose
    storage a caller keeps are not overwritten by later gathers."""
    x = torch.randn(500, 16)
    rng = np.random.default_rng(0)
    kept = []
    for _ in range(4):
        lists = [rng.integers(0, 500, k) for k in (60, 90)]
        got = row_gather.gather_groups(x, lists)
        storage = got[0].untyped_storage()
        kept.append((storage, got[0].shape, lists[0]))
        del got
        gc.collect()
    for storage, shape, ids in kept:
        rows = torch.empty(0).set_(storage, 0, shape)
        assert torch.equal(rows, x[torch.from_numpy(ids)])


def test_a_buffer_let_go_on_another_thread_is_free_again():
    x = torch.randn(64, 8)
    pool = row_gather.OutputPool(limit=1)
    out = [pool.take(x, [50])[0]]
    start = out[0].data_ptr()
    box = [out.pop()]
    worker = threading.Thread(target=box.clear)
    worker.start()
    worker.join()
    assert pool.take(x, [50])[0].data_ptr() == start


def test_a_buffer_serves_any_dtype_that_fits_its_bytes():
    pool = row_gather.OutputPool(limit=1)
    a = pool.take(torch.zeros(1, 16), [100])[0]
    start = a.data_ptr()
    del a
    b = pool.take(torch.zeros(1, 8, dtype=torch.float64), [100])[0]  # the same bytes
    assert b.data_ptr() == start and b.dtype == torch.float64 and b.shape == (100, 8)
    c = pool.take(torch.zeros(1, 16, dtype=torch.bfloat16), [150])[0]  # b holds it
    assert c.data_ptr() != start and c.dtype == torch.bfloat16 and c.shape == (150, 16)
    assert pool.take(torch.zeros(1, 4), [0])[0].shape == (0, 4)
