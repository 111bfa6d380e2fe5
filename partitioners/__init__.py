"""Vertex partitioners, grid layouts, partition quality and per-rank shards on disk.

Imported as ``gnnpar.partitioners``. Only numpy/scipy (and the optional METIS/KaMinPar
bindings): nothing here imports torch.distributed.

- :func:`partition_graph` -> :class:`Partition` (``block``, ``random``, ``metis``, ``kaminpar``);
- :mod:`grid`: 2D/3D block layouts of Â, optionally randomly permuted;
- :func:`report`: edge cut, balance, halo sizes, bytes per SpMM;
- :func:`write_shards` / :func:`load_shard` / :func:`build_shard` / :func:`reassemble`.
"""
from .dispatch import METHODS, partition_graph
from .partition import Partition

__all__ = ["METHODS", "Partition", "partition_graph"]
