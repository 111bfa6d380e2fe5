"""Every distributed SpMM algorithm equals the serial trainer (forward, gradients, 3-epoch
loss within 1e-5 relative) on graphs whose size p does not divide, and moves exactly the bytes
(and messages) the cost model predicts.

Spawning ranks is the slow part, so each world size is spawned once and runs all of its
algorithms (``tests.dist_cases.equivalence_many``); the spawn results are cached per module.
"""
import numpy as np
import pytest

from gnnpar.kernels.cost_model import Structure, epoch_traffic
from gnnpar.kernels.blocks import Ownership
from gnnpar.partitioners import partition_graph
from gnnpar.spawn import spawn

from .dist_cases import equivalence_many
from .graphs import random_graph

TOL = 1e-5
N = 47
KINDS = ("gcn", "sage")
WIDTHS = [6, 7, 7, 3]

H, B = {"variant": "halo"}, {"variant": "bcast"}
# world -> (directed, [(label, algo, dims, replication, kwargs)])
WORLDS = {
    1: (True, [("1d", "1d", None, 1, {}), ("1d-halo", "1d-halo", None, 1, {}),
               ("2d-1x1", "2d", (1, 1), 1, H), ("1.5d-c1", "1.5d", None, 1, B),
               ("3d-1x1x1", "3d", (1, 1, 1), 1, {"layers": 3})]),
    2: (False, [("1d", "1d", None, 1, {}), ("1d-halo", "1d-halo", None, 1, {}),
                ("2d-1x2-halo", "2d", (1, 2), 1, H), ("1.5d-c2-bcast", "1.5d", None, 2, B)]),
    3: (True, [("1d", "1d", None, 1, {}), ("1d-halo", "1d-halo", None, 1, {}),
               ("2d-3x1-bcast", "2d", (3, 1), 1, B)]),
    4: (True, [("1d-halo", "1d-halo", None, 1, {}),
               ("2d-2x2-bcast", "2d", (2, 2), 1, B), ("2d-2x2-halo", "2d", (2, 2), 1, H),
               ("1.5d-c2-bcast", "1.5d", None, 2, B), ("1.5d-c2-halo", "1.5d", None, 2, H)]),
    6: (True, [("1d", "1d", None, 1, {}), ("1d-halo", "1d-halo", None, 1, {}),
               ("2d-2x3-bcast", "2d", (2, 3), 1, B), ("2d-2x3-halo", "2d", (2, 3), 1, H),
               ("3d-1x2x3", "3d", (1, 2, 3), 1, {"layers": 3}),
               ("4d-1x1x2x3", "4d", (1, 1, 2, 3), 1, {"layers": 3})]),
    8: (False, [("1d-halo", "1d-halo", None, 1, {}),
                ("1.5d-c2-bcast", "1.5d", None, 2, B), ("1.5d-c2-halo", "1.5d", None, 2, H),
                ("2d-2x4-halo-perm", "2d", (2, 4), 1, {"variant": "halo", "permute": True}),
                ("3d-2x2x2", "3d", (2, 2, 2), 1, {"layers": 3}),
                ("3d-2x2x2-perm", "3d", (2, 2, 2), 1, {"layers": 3, "permute": True, "seed": 4}),
                ("4d-2x2x2", "4d", (2, 2, 2), 1, {"layers": 3})]),
}

_RESULTS = {}


def results(world):
    if world not in _RESULTS:
        directed, cases = WORLDS[world]
        _RESULTS[world] = spawn(equivalence_many, world,
                                args=(cases, N, directed, "random", KINDS), timeout_s=240)
    return _RESULTS[world]


PAIRS = [(w, c[0]) for w, (_, cases) in WORLDS.items() for c in cases]


@pytest.mark.parametrize("world,label", PAIRS, ids=[f"p{w}-{l}" for w, l in PAIRS])
def test_equivalence(world, label):
    for rank, out in enumerate(results(world)):
        for what, err in out[label]["errs"].items():
            assert err <= TOL, f"rank {rank} {what}: relative error {err:.3g}"


@pytest.mark.parametrize("world,label", PAIRS, ids=[f"p{w}-{l}" for w, l in PAIRS])
def test_bytes_match_cost_model(world, label):
    directed, cases = WORLDS[world]
    _, algo, dims, replication, kw = next(c for c in cases if c[0] == label)
    g = random_graph(n=N, f=6, classes=3, seed=11, directed=directed)
    part = partition_graph(g, world, "random", seed=3)
    owner = (Ownership.permuted_over(N, world, kw.get("seed", 0)).owner if kw.get("permute")
             else part.owner)
    model_dims = replication if algo == "1.5d" else (dims[-3:] if algo in ("3d", "4d") else dims)
    measured = results(world)
    for kind in KINDS:
        want = epoch_traffic(Structure.from_graph(g, owner, world), algo, kind, WIDTHS,
                             model_dims, kw.get("variant", "halo"), kw.get("layers", 0))
        got_bytes = np.array([out[label]["bytes"][kind][0] for out in measured])
        got_msgs = np.array([out[label]["bytes"][kind][1] for out in measured])
        assert got_bytes.tolist() == want["bytes"].tolist(), f"{kind} bytes per rank"
        assert got_msgs.tolist() == want["messages"].tolist(), f"{kind} messages per rank"
        if world > 1:
            assert got_bytes.sum() > 0
