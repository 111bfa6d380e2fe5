"""Every distributed SpMM algorithm equals the serial trainer (forward, gradients, 3-epoch
loss within 1e-5 relative), at world sizes 1-8 on graphs whose size p does not divide."""
import pytest

from gnnpar.spawn import spawn

from .dist_cases import equivalence

TOL = 1e-5

CASES = [
    # (algo, world, grid shape, extra kwargs)
    ("1d", 1, {"row": 1}, {}), ("1d", 2, {"row": 2}, {}), ("1d", 3, {"row": 3}, {}),
    ("1d", 6, {"row": 6}, {}),
    ("1d-halo", 1, {"row": 1}, {}), ("1d-halo", 2, {"row": 2}, {}),
    ("1d-halo", 3, {"row": 3}, {}), ("1d-halo", 4, {"row": 4}, {}),
    ("1d-halo", 6, {"row": 6}, {}), ("1d-halo", 8, {"row": 8}, {}),
]


@pytest.mark.parametrize("algo,world,shape,kw", CASES,
                         ids=[f"{c[0]}-p{c[1]}" for c in CASES])
def test_equivalence(algo, world, shape, kw):
    results = spawn(equivalence, world, args=(algo, shape, 47, world % 2 == 1, "random",
                                              ("gcn", "sage"), kw), timeout_s=120)
    for rank, errs in enumerate(results):
        for what, err in errs.items():
            assert err <= TOL, f"rank {rank} {what}: relative error {err:.3g}"
