"""KaMinPar partitioner (optional extra: ``pip install gnnpar[kaminpar]``).

KaMinPar's Python ``Graph`` has no constructor; graphs come only from files. So we write the
symmetrised pattern (the same one METIS sees, :func:`metis.undirected_structure`) in the binary
ParHiP format to a temporary file and load it back:

- header: three little-endian uint64 ``version, n, m`` (``m`` counts both directions);
  ``version`` is a bit field, bit 0 = *no* edge weights, bit 1 = *no* vertex weights, higher bits
  select 32-bit ids/weights (unused here: all fields are 64-bit);
- ``n + 1`` uint64 offsets, each the *byte address in the file* of a vertex's first neighbour;
- ``m`` uint64 neighbour ids; then, when present, ``n`` int64 vertex weights.

Balance works as in :mod:`metis` (one vertex weight: unit, or degree + mean degree) with
KaMinPar's ``eps = imbalance``. KaMinPar runs single-threaded and is reseeded before every call,
which makes it deterministic per seed. More parts than vertices is refused, as for METIS.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from gnnpar.datasets import Graph, InputError

from .metis import checked_input
from .partition import Partition

_HEADER_BYTES = 24
_WRITE_CHUNK = 1 << 22


def _import_kaminpar():
    try:
        import kaminpar
    except ImportError:
        raise InputError("method 'kaminpar' needs the optional KaMinPar package: "
                         "pip install gnnpar[kaminpar]  (or: pip install kaminpar)") from None
    return kaminpar


def write_parhip(path: str, indptr: np.ndarray, indices: np.ndarray, vweights=None) -> None:
    """Write an undirected graph (both directions stored) as a 64-bit binary ParHiP file."""
    n = indptr.shape[0] - 1
    m = indices.shape[0]
    version = 1 | (0 if vweights is not None else 2)
    header = np.array([version, n, m], dtype="<u8")
    first_edge_byte = _HEADER_BYTES + 8 * (n + 1)
    offsets = (first_edge_byte + 8 * np.asarray(indptr, dtype=np.int64)).astype("<u8")
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(offsets.tobytes())
        for start in range(0, m, _WRITE_CHUNK):  # chunks: no full-size converted copy
            f.write(np.asarray(indices[start:start + _WRITE_CHUNK]).astype("<u8").tobytes())
        if vweights is not None:
            f.write(np.asarray(vweights).astype("<i8").tobytes())


def kaminpar_partition(graph: Graph, parts: int, seed: int = 0, balance: str = "edges",
                       imbalance: float = 0.03, threads: int = 1) -> Partition:
    """KaMinPar partition of the symmetrised graph (see module docstring)."""
    kaminpar = _import_kaminpar()
    n = graph.num_nodes
    parts, imbalance, indptr, indices, vw = checked_input("kaminpar", graph, parts, imbalance,
                                                          balance)
    if parts == 1:
        owner = np.zeros(n, np.int32)
    else:
        fd, path = tempfile.mkstemp(suffix=".parhip", prefix="gnnpar-")
        os.close(fd)
        try:
            write_parhip(path, indptr, indices, vw)
            kgraph = kaminpar.load_graph(path, kaminpar.GraphFileFormat.PARHIP)
        finally:
            os.unlink(path)
        kaminpar.reseed(int(seed) & 0x7FFFFFFF)
        solver = kaminpar.KaMinPar(int(threads), kaminpar.default_context())
        owner = np.asarray(solver.compute_partition(kgraph, parts, float(imbalance)), dtype=np.int32)
    return Partition.from_owner(owner, parts, method="kaminpar", seed=seed,
                                info={"balance": balance, "imbalance": imbalance})
