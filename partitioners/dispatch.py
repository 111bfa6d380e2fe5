"""``partition_graph``: one entry point over every vertex partitioner.

=========  =====================================================  =========================
method     what it does                                           balance promise
=========  =====================================================  =========================
block      contiguous id ranges                                   nodes: sizes differ <= 1;
                                                                  edges: <= W/P + max weight
random     seeded hash of the id                                  in expectation only
metis      METIS k-way on A + Aᵀ (pymetis, ``recursive=False``)   (1 + imbalance) of mean
kaminpar   KaMinPar on A + Aᵀ (optional extra)                    (1 + imbalance) of mean
=========  =====================================================  =========================

``balance`` picks the balanced quantity ('nodes' or 'edges'; see each module), ``imbalance``
the tolerance of the graph partitioners, ``seed`` their randomness (``block`` has none).
"""
from __future__ import annotations

from gnnpar.datasets import Graph, InputError

from .block import BALANCES, block_partition
from .kaminpar_part import kaminpar_partition
from .metis import metis_partition
from .partition import Partition, check_parts
from .random_part import random_partition

METHODS = ("block", "random", "metis", "kaminpar")


def partition_graph(graph: Graph, parts: int, method: str = "metis", seed: int = 0,
                    balance: str = "nodes", imbalance: float = 0.03) -> Partition:
    """Partition ``graph``'s vertices into ``parts`` parts with ``method``; validated result."""
    parts = check_parts(parts)
    if balance not in BALANCES:
        raise InputError(f"unknown balance {balance!r}; choose one of {', '.join(BALANCES)}")
    if method == "block":
        part = block_partition(graph, parts, balance)
    elif method == "random":
        part = random_partition(graph, parts, seed)
    elif method == "metis":
        part = metis_partition(graph, parts, seed, balance, imbalance)
    elif method == "kaminpar":
        part = kaminpar_partition(graph, parts, seed, balance, imbalance)
    else:
        raise InputError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    return part.validate(graph.num_nodes)
