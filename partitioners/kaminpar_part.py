"""KaMinPar partitioner (optional extra: ``pip install gnnpar[kaminpar]``).

KaMinPar's Python ``Graph`` has no constructor; graphs come only from files. So we write the
symmetrised pattern (the same one METIS sees, :func:`metis.undirected_structure`) in the binary
ParHiP format to a temporary file, in chunks straight from the graph's (possibly memory-mapped)
CSR, and KaMinPar loads it back:

- header: three little-endian uint64 ``version, n, m`` (``m`` counts both directions);
  ``version`` is a bit field, from bit 0: *no* edge weights, *no* vertex weights, 32-bit edge
  offsets, 32-bit vertex ids, 32-bit vertex weights, 32-bit edge weights;
- ``n + 1`` uint64 offsets, each the *byte address in the file* of a vertex's first neighbour;
- ``m`` uint32 neighbour ids (4 bytes a non-zero: a graph of up to 2^32 vertices); then, when
  present, ``n`` vertex weights (int32 when they fit, else int64).

Balance works as in :mod:`metis` (one vertex weight: unit, or degree + mean degree) with
KaMinPar's ``eps = imbalance``. KaMinPar runs on ``threads`` threads and is reseeded before
every call. With one thread (the default) it is deterministic per seed, which a training run
that partitions at launch and again on resume relies on; with several its parallel label
propagation gives another, equally balanced partition from run to run (``gnnpar-partition``
uses every core by default: its partition is stored with the shards). More parts than
vertices is refused, as for METIS.
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from gnnpar.datasets import Graph, InputError

from .metis import checked_input
from .node_stream import release
from .partition import Partition

_HEADER_BYTES = 24
_WRITE_CHUNK = 1 << 22
_NO_EDGE_WEIGHTS, _NO_VERTEX_WEIGHTS, _ID32, _VWGT32 = 1, 2, 8, 16  # ParHiP version bits


def _import_kaminpar():
    try:
        import kaminpar
    except ImportError:
        raise InputError("method 'kaminpar' needs the optional KaMinPar package: "
                         "pip install gnnpar[kaminpar]  (or: pip install kaminpar)") from None
    return kaminpar


def write_parhip(path: str, indptr: np.ndarray, indices: np.ndarray, vweights=None) -> None:
    """Write an undirected graph (both directions stored, no self loops) as a binary ParHiP
    file with 32-bit vertex ids, converting ``indices`` a chunk at a time."""
    n = indptr.shape[0] - 1
    m = int(indices.shape[0])
    if n >= 1 << 32:
        raise InputError(f"KaMinPar's file format takes at most 2^32 vertices, got {n:,}")
    version = _NO_EDGE_WEIGHTS | _ID32
    if vweights is None:
        version |= _NO_VERTEX_WEIGHTS
    else:
        vweights = np.asarray(vweights)
        if vweights.size and int(vweights.max()) < 1 << 31:
            version |= _VWGT32
    first_edge_byte = _HEADER_BYTES + 8 * (n + 1)
    with open(path, "wb") as f:
        f.write(np.array([version, n, m], dtype="<u8").tobytes())
        for start in range(0, n + 1, _WRITE_CHUNK):
            part = np.asarray(indptr[start:start + _WRITE_CHUNK], dtype=np.int64)
            f.write((first_edge_byte + 4 * part).astype("<u8").tobytes())
        for start in range(0, m, _WRITE_CHUNK):  # chunks: no full-size converted copy
            f.write(np.asarray(indices[start:start + _WRITE_CHUNK]).astype("<u4").tobytes())
        if vweights is not None:
            f.write(vweights.astype("<i4" if version & _VWGT32 else "<i8").tobytes())


def kaminpar_partition(graph: Graph, parts: int, seed: int = 0, balance: str = "edges",
                       imbalance: float = 0.03, threads: int = 1) -> Partition:
    """KaMinPar partition of the symmetrised graph (see module docstring); ``info["call_s"]``
    holds the seconds KaMinPar's own load and partitioning took."""
    kaminpar = _import_kaminpar()
    n = graph.num_nodes
    threads = int(threads)
    if threads < 1:
        raise InputError(f"KaMinPar needs at least one thread, got {threads}")
    parts, imbalance, indptr, indices, vw = checked_input("kaminpar", graph, parts, imbalance,
                                                          balance)
    call_s = 0.0
    if parts == 1:
        owner = np.zeros(n, np.int32)
    else:
        fd, path = tempfile.mkstemp(suffix=".parhip", prefix="gnnpar-")
        os.close(fd)
        try:
            write_parhip(path, indptr, indices, vw)
            release(indices)
            del indptr, indices, vw
            t0 = time.perf_counter()
            kgraph = kaminpar.load_graph(path, kaminpar.GraphFileFormat.PARHIP)
        finally:
            os.unlink(path)
        kaminpar.reseed(int(seed) & 0x7FFFFFFF)
        solver = kaminpar.KaMinPar(threads, kaminpar.default_context())
        owner = np.asarray(solver.compute_partition(kgraph, parts, float(imbalance)),
                           dtype=np.int32)
        call_s = time.perf_counter() - t0
        del kgraph, solver
    return Partition.from_owner(owner, parts, method="kaminpar", seed=seed,
                                info={"balance": balance, "imbalance": imbalance,
                                      "threads": threads, "call_s": call_s})
