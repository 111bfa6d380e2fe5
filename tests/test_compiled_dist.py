"""The compiled CPU SpMM (:mod:`gnnpar.kernels.cpu_spmm`) inside distributed runs.

The multi-rank equivalence tests use small graphs, which the kernel's size rule sends to
``torch.sparse.mm``; here the ranks lift the rule, count the compiled kernel's calls (float32
and bf16) and compare 1d-halo, 2d and 3d at 3 ranks (47 vertices: blocks of unequal size)
with the serial trainer on ``torch.sparse.mm``, in fp32 and under ``--precision bf16``.
The two products sum in different orders, and torch's MKL product may fuse multiply-adds
where the kernel does not, so the comparison is within a tolerance, never bit for bit.
"""
import pytest

from gnnpar.kernels import cpu_spmm
from gnnpar.launcher.spawn import spawn

from .dist_cases import compiled_equivalence

WORLD, N = 3, 47  # 47 = 16 + 16 + 15: every layout's blocks differ in size
KINDS = ("gcn", "sage")
PRECISIONS = ("fp32", "bf16")
# fp32: sums in another order (and with or without FMA) differ by a few float32 ulps
# per sum; the multi-rank tests' bound (tests/test_fullbatch_dist.py)
# bf16: 8 significant bits; a sum rounded in another order may land one bf16 step away and
# three layers carry that on: a few steps (tests/test_precision.py), far below a wrong sum
TOL = {"fp32": 1e-5, "bf16": 0.03}
H, B = {"variant": "halo"}, {"variant": "bcast"}
# (label, algo, grid dims, builder options)
CASES = [("1d-halo", "1d-halo", None, {}),
         ("2d-3x1-halo", "2d", (3, 1), H), ("2d-1x3-bcast", "2d", (1, 3), B),
         # 3 layers rotate the roles: the 3-rank axis splits features, then Â's columns,
         # then its rows; permuted rows, as gnnpar-train runs 3d
         ("3d-1x1x3", "3d", (1, 1, 3), {"layers": 3, "permute": True, "seed": 4})]

pytestmark = pytest.mark.skipif(not cpu_spmm.available(), reason="the compiled kernel is off")


@pytest.fixture(scope="module")
def results():
    return spawn(compiled_equivalence, WORLD, args=(CASES, N, KINDS, PRECISIONS),
                 timeout_s=240)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("label", [c[0] for c in CASES])
def test_compiled_kernel_runs_in_the_ranks_and_matches_serial(results, label, precision):
    kernel_dtype = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}[precision]
    for rank, out in enumerate(results):
        r = out[label, precision]
        # every rank multiplied with the compiled kernel of its precision's dtype
        assert r["calls"].get(kernel_dtype, 0) > 0, (rank, r["calls"])
        assert set(r["dtypes"].values()) == {kernel_dtype}, (rank, r["dtypes"])
        for what, err in r["errs"].items():
            assert err <= TOL[precision], f"rank {rank} {what}: relative error {err:.3g}"
