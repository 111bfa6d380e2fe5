"""Rank bodies and references of the inference tests (module level, so spawned ranks can
import them).

Every rank builds the same small graph, renumbered by degree (a non-identity ``--reorder``),
cuts its METIS shard of it, and runs :func:`gnnpar.infer.prediction.predict_rows` — the code
``gnnpar-predict`` and ``--save-predictions`` run — for every model and algorithm, each into
its own output folder. The parent then compares the files with the serial ``model(x)`` of
the graph in its own order.
"""
import os

import numpy as np
import torch

from gnnpar.datasets.reorder import reorder
from gnnpar.training.distributed import DistRuntime
from gnnpar.interfaces import LayerOps
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.algorithms import make_grid
from gnnpar.nn.models import GNN
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.infer.prediction import LayerwiseRows, PredictJob, predict_rows
from gnnpar.cli.spec import RunSpec

from .dist_cases import readme_block
from .graphs import random_graph

N, F, HIDDEN, CLASSES, LAYERS = 43, 6, 8, 3, 3
KINDS = ("gcn", "sage", "gat", "gin")
#: layer-wise inference runs gnnpar's own models (a user's model is one forward pass)
LAYERWISE_KINDS = ("gcn", "sage", "gat")
LAYERWISE_BATCH = 7


def graph():
    """The dataset (its own order) and the graph the ranks load (renumbered by degree)."""
    g = random_graph(n=N, f=F, classes=CLASSES, seed=21)
    return g, reorder(g, "degree")


def model(kind: str) -> torch.nn.Module:
    """The same weights in every process: seeded; dropout 0.5 (inference must drop none)."""
    torch.manual_seed(5)
    if kind == "gin":
        space = {}
        exec(readme_block("class GIN"), space)
        return space["gin"](F, HIDDEN, CLASSES, LAYERS, 0.5)
    return GNN(kind, F, HIDDEN, CLASSES, layers=LAYERS, dropout=0.5,
               heads=2 if kind == "gat" else None)


def cases(world: int):
    """(label, algo, grid dims, replication, builder options) of every full-batch algorithm
    at ``world`` ranks: 1d, 1d-halo, 1.5d, 2d both variants, 3d, 4d."""
    two = {2: (1, 2), 3: (3, 1), 4: (2, 2)}[world]
    three = {2: (1, 1, 2), 3: (1, 3, 1), 4: (2, 1, 2)}[world]
    return [("1d", "1d", None, 1, {}), ("1d-halo", "1d-halo", None, 1, {}),
            ("1.5d", "1.5d", None, world if world < 4 else 2, {}),
            ("2d-halo", "2d", two, 1, {"variant": "halo"}),
            ("2d-bcast", "2d", two, 1, {"variant": "bcast"}),
            ("3d", "3d", three, 1, {"layers": LAYERS}),
            ("4d", "4d", (1, *three), 1, {"layers": LAYERS})]


def predict_all(rank: int, world: int, out_root: str) -> list:
    """Every (algorithm, model) and every layer-wise model into ``out_root/LABEL-KIND``;
    returns the labels written."""
    _, g = graph()
    shard = build_shard(g, partition_graph(g, world, "metis", seed=3), rank,
                        norms=("gcn", "mean"))
    shard.meta["vertex_order"] = g.meta["vertex_order"]  # as a shard folder keeps it
    spec = RunSpec.of(quiet=True)
    done = []
    for label, algo, dims, replication, kw in cases(world):
        grid = make_grid(algo, world, dims, replication)
        for kind in KINDS:
            m = model(kind)
            rt = DistRuntime(grid, shard, algorithm(algo), m.norm, **kw)
            name = f"{label}-{kind}"
            job = PredictJob(None, os.path.join(out_root, name), embeddings=True)
            predict_rows(m, rt, shard, spec.evolve(algo=algo), job, rank, world, {})
            done.append(name)
    for kind in LAYERWISE_KINDS:
        m = model(kind)
        name = f"layerwise-{kind}"
        job = PredictJob(None, os.path.join(out_root, name), embeddings=True,
                         batch_size=LAYERWISE_BATCH)
        predict_rows(m, LayerwiseRows(shard, m.norm, "cpu", world), shard, spec, job, rank,
                     world, {})
        done.append(name)
    return done


def reference(kind: str):
    """The serial ``model(x)`` on the dataset in its own order, and the rows entering the
    model's last layer (the default embeddings)."""
    from gnnpar.training.serial import SerialRuntime
    g, _ = graph()
    m = model(kind).eval()
    rt = SerialRuntime(g, m.norm)
    seen = {}
    hook = m.layers[len(m.layers) - 1].register_forward_pre_hook(
        lambda mod, args: seen.__setitem__("h", args[1]))
    with torch.no_grad():
        out = m(LayerOps(rt.op), rt.x)
    hook.remove()
    return out.numpy(), seen["h"].numpy()


def max_error(a: np.ndarray, ref: np.ndarray) -> float:
    """Largest difference relative to the reference's largest entry (at least 1)."""
    return float(np.abs(a.astype(np.float64) - ref).max() / max(1.0, np.abs(ref).max()))
