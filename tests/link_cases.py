"""Rank bodies and references of the distributed link-prediction tests (module level, so
spawned ranks can import them).

Every rank splits the same small graph (the split is seeded), cuts its METIS shard of the
training graph and runs :func:`gnnpar.link.loop.fit_link` for a few epochs with dropout 0 on
every full-batch algorithm, each encoder with a dot or an MLP decoder; the parent compares
the losses, the metrics and the trained parameters with the serial loop's.
"""
import numpy as np
import torch

from gnnpar.training.distributed import DistRuntime
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.algorithms import make_grid
from gnnpar.link.decoders import build_decoder
from gnnpar.link.exchange import PairExchange
from gnnpar.link.loop import fit_link
from gnnpar.link.split import split_edges
from gnnpar.nn.models import GNN
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.training.serial import SerialRuntime
from gnnpar.training.trainer import TrainConfig

from .graphs import random_graph
from .predict_cases import cases

N, F, WIDTH, EPOCHS = 60, 6, 8, 3
#: (encoder, decoder) pairs every algorithm runs
MODELS = (("gcn", "dot"), ("sage", "mlp"), ("gat", "dot"))
METRICS = ("val_auc", "test_auc", "val_mrr", "test_mrr", "test_hits@20", "test_hits@50",
           "test_hits@100")


def data():
    g = random_graph(n=N, avg_deg=4, f=F, seed=8)
    return split_edges(g, (0.7, 0.1, 0.2), seed=2)


def models(kind: str, decoder: str):
    torch.manual_seed(4)
    enc = GNN(kind, F, WIDTH, WIDTH, layers=3, dropout=0.0, heads=2 if kind == "gat" else None)
    return enc, build_decoder(decoder, WIDTH)


def flat_params(enc, dec) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for m in (enc, dec) for p in m.parameters()]).numpy()


def run(runtime, kind, decoder, pairs=None):
    train_g, split = data()
    enc, dec = models(kind, decoder)
    hist = fit_link(enc, dec, runtime, split, TrainConfig(epochs=EPOCHS, lr=0.02), N,
                    neg_ratio=2, seed=5, pairs_source=pairs)
    return [h["loss"] for h in hist], {k: hist[-1][k] for k in METRICS}, flat_params(enc, dec)


def link_all(rank: int, world: int) -> dict:
    train_g, _ = data()
    shard = build_shard(train_g, partition_graph(train_g, world, "metis", seed=3), rank,
                        norms=("gcn", "mean"))
    out = {}
    for label, algo, dims, replication, kw in cases(world):
        grid = make_grid(algo, world, dims, replication)
        for kind, decoder in MODELS:
            rt = DistRuntime(grid, shard, algorithm(algo), models(kind, decoder)[0].norm, **kw)
            out[f"{label}-{kind}-{decoder}"] = run(rt, kind, decoder, PairExchange.of_runtime(rt, N))
    return out


def reference(kind: str, decoder: str):
    train_g, _ = data()
    return run(SerialRuntime(train_g, models(kind, decoder)[0].norm), kind, decoder)


def exchange_bytes(rank: int, world: int):
    """One scoring call and its backward on a 1d-halo runtime: (what ``Comm`` counted on this
    rank, what :func:`gnnpar.link.exchange.scoring_bytes` predicts for every rank)."""
    from gnnpar.link.exchange import scoring_bytes
    train_g, split = data()
    shard = build_shard(train_g, partition_graph(train_g, world, "metis", seed=3), rank,
                        norms=("gcn",))
    rt = DistRuntime(make_grid("1d-halo", world, None, 1), shard, algorithm("1d-halo"), "gcn")
    ex = PairExchange.of_runtime(rt, N)
    pairs = np.concatenate([split.train_pos, split.test_neg], axis=1)
    by_rank = [pairs[:, ex.owner[pairs[0]] == r] for r in range(world)]
    z = torch.randn(rt.x.shape[0], WIDTH, requires_grad=True)
    rt.comm.reset()
    zu, zv = ex.rows(z, by_rank[rank])
    (zu * zv).sum().backward()
    return rt.comm.total_bytes(), scoring_bytes(ex.owner, by_rank, WIDTH).tolist()
