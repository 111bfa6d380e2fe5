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

Default balance (:data:`DEFAULT_BALANCE`): ``edges`` for METIS and KaMinPar, the training
partitioners, since the slowest rank sets the epoch and a rank's work grows with its rows'
non-zeros. Balancing nodes alone lets a part that holds the hubs carry several times the mean
non-zeros; ``edges`` weighs each vertex by its degree plus the mean degree, so both a part's
edges and its vertices (its features and dense-layer work) stay near their means, where degree
+ 1 alone would balance edges at the cost of very uneven vertex counts
(``tests/test_balance.py`` asserts the bounds). ``block`` keeps ``nodes``: its
edge balance is the ``edges`` option (row non-zeros of A' + I).
"""
from __future__ import annotations

from gnnpar.datasets import Graph, InputError

from .block import BALANCES, block_partition
from .kaminpar_part import kaminpar_partition
from .metis import metis_partition
from .partition import Partition, check_parts
from .random_part import random_partition

METHODS = ("block", "random", "metis", "kaminpar")
#: method -> the quantity balanced when ``balance`` is not given
DEFAULT_BALANCE = {"block": "nodes", "random": "nodes", "metis": "edges", "kaminpar": "edges"}
#: the tolerance of METIS and KaMinPar when ``imbalance`` is not given (3 % over the mean)
DEFAULT_IMBALANCE = 0.03
#: method -> the settings of :func:`partition_graph` besides ``parts`` and ``seed`` it reads
#: (it ignores the others: ``gnnpar-partition`` refuses them given with that method)
READS = {"block": ("balance",), "random": (), "metis": ("balance", "imbalance"),
         "kaminpar": ("balance", "imbalance", "threads")}


def partition_graph(graph: Graph, parts: int, method: str = "metis", seed: int = 0,
                    balance: str = None, imbalance: float = DEFAULT_IMBALANCE,
                    threads: int = 1) -> Partition:
    """Partition ``graph``'s vertices into ``parts`` parts with ``method``; validated result.
    ``balance=None``: the method's default (:data:`DEFAULT_BALANCE`). ``threads``: KaMinPar's
    (one keeps it deterministic per seed; the other methods run on one core)."""
    parts = check_parts(parts)
    if balance is None:
        balance = DEFAULT_BALANCE.get(method, "nodes")
    if balance not in BALANCES:
        raise InputError(f"unknown balance {balance!r}; choose one of {', '.join(BALANCES)}")
    if method == "block":
        part = block_partition(graph, parts, balance)
    elif method == "random":
        part = random_partition(graph, parts, seed)
    elif method == "metis":
        part = metis_partition(graph, parts, seed, balance, imbalance)
    elif method == "kaminpar":
        part = kaminpar_partition(graph, parts, seed, balance, imbalance, threads)
    else:
        raise InputError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    return part.validate(graph.num_nodes)
