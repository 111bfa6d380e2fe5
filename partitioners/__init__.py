"""Vertex partitioners, grid layouts, partition quality and per-rank shards on disk.

Imported as ``gnnpar.partitioners``. Only numpy/scipy (and the optional METIS/KaMinPar
bindings): nothing here imports torch.distributed.

- :func:`partition_graph` -> :class:`Partition` (``block``, ``random``, ``metis``, ``kaminpar``);
- :mod:`grid`: non-zeros per rank of the 2D/3D kernels' blocks (parts or balanced layout);
- :func:`report`: edge cut, balance, halo sizes, bytes per SpMM;
- :func:`write_shards` / :func:`load_shard` / :func:`build_shard` / :func:`reassemble`.
"""
from .dispatch import DEFAULT_BALANCE, METHODS, partition_graph
from .grid import GridSpec, balanced_owner
from .partition import Partition
from .quality import format_report, halo_counts, report
from .shards import (FORMAT_VERSION, Shard, ShardBuilder, build_shard, build_shards, load_grid_rows,
                     load_shard, read_meta, reassemble, write_shards)

__all__ = ["DEFAULT_BALANCE", "METHODS", "Partition", "partition_graph", "GridSpec",
           "balanced_owner", "format_report", "halo_counts", "report", "FORMAT_VERSION", "Shard",
           "ShardBuilder", "build_shard", "build_shards", "load_grid_rows", "load_shard",
           "read_meta", "reassemble", "write_shards"]
