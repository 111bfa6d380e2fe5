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
from gnnpar.launcher.spawn import spawn

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

# METIS-partitioned shards (uneven, clustered blocks: the partitioner users run by default),
# 1.5D with c = 4, and non-cubic 3D grids
METIS_WORLDS = {
    4: (False, [("1d-halo", "1d-halo", None, 1, {}), ("2d-2x2-halo", "2d", (2, 2), 1, H),
                ("1.5d-c4-bcast", "1.5d", None, 4, B), ("1.5d-c4-halo", "1.5d", None, 4, H),
                ("3d-1x4x1", "3d", (1, 4, 1), 1, {"layers": 3})]),
    6: (True, [("1d", "1d", None, 1, {}), ("3d-3x2x1", "3d", (3, 2, 1), 1, {"layers": 3}),
               ("3d-2x1x3", "3d", (2, 1, 3), 1, {"layers": 3}),
               ("4d-1x3x1x2", "4d", (1, 3, 1, 2), 1, {"layers": 3})]),
}
SETUPS = {**{(w, "random"): v for w, v in WORLDS.items()},
          **{(w, "metis"): v for w, v in METIS_WORLDS.items()}}
_RESULTS = {}


def results(world, method="random"):
    if (world, method) not in _RESULTS:
        directed, cases = SETUPS[world, method]
        _RESULTS[world, method] = spawn(equivalence_many, world,
                                        args=(cases, N, directed, method, KINDS), timeout_s=240)
    return _RESULTS[world, method]


PAIRS = [(w, m, c[0]) for (w, m), (_, cases) in SETUPS.items() for c in cases]
IDS = [f"p{w}-{l}" + ("-metis" if m == "metis" else "") for w, m, l in PAIRS]


@pytest.mark.parametrize("world,method,label", PAIRS, ids=IDS)
def test_equivalence(world, method, label):
    for rank, out in enumerate(results(world, method)):
        for what, err in out[label]["errs"].items():
            assert err <= TOL, f"rank {rank} {what}: relative error {err:.3g}"


def test_metis_cases_have_clustered_blocks():
    """The METIS cases exercise what random ones do not: blocks that follow the graph's
    clusters (a smaller edge cut than the random partition of the same graph)."""
    for world, (directed, _) in METIS_WORLDS.items():
        g = random_graph(n=N, f=6, classes=3, seed=11, directed=directed)
        src, dst = g.edges()[:2]
        owners = {m: partition_graph(g, world, m, seed=3).owner for m in ("metis", "random")}
        cut = {m: int((o[src] != o[dst]).sum()) for m, o in owners.items()}
        assert cut["metis"] < cut["random"], cut


@pytest.mark.parametrize("world,method,label", PAIRS, ids=IDS)
def test_bytes_match_cost_model(world, method, label):
    directed, cases = SETUPS[world, method]
    _, algo, dims, replication, kw = next(c for c in cases if c[0] == label)
    g = random_graph(n=N, f=6, classes=3, seed=11, directed=directed)
    part = partition_graph(g, world, method, seed=3)
    owner = (Ownership.permuted_over(N, world, kw.get("seed", 0)).owner if kw.get("permute")
             else part.owner)
    model_dims = replication if algo == "1.5d" else (dims[-3:] if algo in ("3d", "4d") else dims)
    measured = results(world, method)
    for kind in KINDS:
        want = epoch_traffic(Structure.from_graph(g, owner, world), algo, kind, WIDTHS,
                             model_dims, kw.get("variant", "halo"), kw.get("layers", 0))
        got_bytes = np.array([out[label]["bytes"][kind][0] for out in measured])
        got_msgs = np.array([out[label]["bytes"][kind][1] for out in measured])
        assert got_bytes.tolist() == want["bytes"].tolist(), f"{kind} bytes per rank"
        assert got_msgs.tolist() == want["messages"].tolist(), f"{kind} messages per rank"
        if world > 1:
            assert got_bytes.sum() > 0
