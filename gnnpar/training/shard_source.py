"""Where each rank's rows come from: shards written once, or cut from the dataset.

- ``--nprocs N`` (:func:`prepare_shards`, in the launching process): use ``--partition-dir``
  when it holds shards for N ranks of ``--dataset``; otherwise partition the dataset once and
  write the shards (to ``--partition-dir``, or a scratch folder of :mod:`gnnpar.launcher.scratch`
  the launcher removes afterwards). Each rank then memory-maps only its own shard.
- launched ranks (torchrun, srun, mpirun) with ``--partition-dir``: each rank maps its shard;
  rank 0 alone compares the shards with ``--dataset`` (:func:`load_rank_shard`) so a job loads
  the whole graph at most once. Without shards every rank cuts its own from the dataset in
  memory (fine for small graphs; partition large ones with ``gnnpar-partition`` first).
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from gnnpar.datasets import DEFAULT_SPEC, Graph, InputError, load_dataset
from gnnpar.datasets.reorder import reorder
from gnnpar.kernels.comm import control_all_reduce
from gnnpar.partitioners import partition_graph, write_shards
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.partitioners.shard_folder import shard_writer
from gnnpar.partitioners.shards import dataset_source, load_shard, read_meta

from gnnpar.interfaces import Shard
from gnnpar.link.options import DEFAULT_SPLIT
from gnnpar.link.split import (given_arrays, given_split, load_split, parse_fractions, save_split,
                               split_edges)
from gnnpar.launcher.scratch import make_scratch_dir, remove_stale_scratch_dirs

DEFAULT_PARTITIONER = "metis"
SHARDS_PREFIX = "gnnpar-shards-"  # temporary shards of a --nprocs run without --partition-dir
LINK_SPLIT = "link_split.npz"  #: beside the temporary shards of a --task link run


@dataclass(frozen=True)
class ShardSource:
    """The shard folder the ranks read (None: cut from the dataset in memory), whether it
    was already compared with ``--dataset`` (by the launching process), and a ``--task link``
    run's edge split (:mod:`gnnpar.link.split`), saved beside the shards."""

    folder: Optional[str] = None
    checked: bool = False
    link_split: Optional[str] = None  #: the edge split's file of a ``--task link`` run


def has_shards(spec) -> bool:
    folder = spec.parallel.partition_dir
    return bool(folder) and os.path.lexists(os.path.join(folder, "meta.json"))


def load_graph(spec) -> Graph:
    """The whole dataset of ``spec`` (``--dataset``, default a small SBM), in the vertex order
    of ``--reorder`` (:mod:`gnnpar.datasets.reorder`). A ``--task link`` run gets the training
    graph of its edge split instead (held-out edges removed), the split in
    ``meta["link_split"]``: an ``npz:`` dataset's or an OGB link-property folder's own
    (:func:`gnnpar.link.split.given_split`), else one drawn by
    :func:`gnnpar.link.split.split_edges`, seeded by ``--seed``. A node run on a
    link-property folder (``meta["task"]``) is refused."""
    graph = load_dataset(spec.data.dataset or DEFAULT_SPEC, directed=spec.data.directed,
                         cache_dir=spec.data.cache_dir)
    if spec.link.task != "link" and graph.meta.get("task") == "link":
        raise InputError(f"{spec.data.dataset} is a link-property dataset (an edge split, no node "
                         "labels): train it with --task link")
    if spec.link.task == "link":
        given = given_arrays(spec.data.dataset or DEFAULT_SPEC)
        if given and spec.link.link_split != DEFAULT_SPLIT:
            raise InputError(f"--link-split: {spec.data.dataset} carries its own split, "
                             "which the run uses")
        seed = spec.train.seed
        graph, split = (given_split(graph, given, seed, where=spec.data.dataset) if given
                        else split_edges(graph, parse_fractions(spec.link.link_split), seed))
        graph.meta = {**graph.meta, "link_split": split}
    return reorder(graph, vertex_order(spec))


def vertex_order(spec) -> str:
    """The order ``spec``'s graph is loaded in: ``--reorder``, with an ``auto`` that
    :func:`resolve_reorder` did not settle read as ``none``."""
    return "none" if spec.data.reorder == "auto" else spec.data.reorder


def resolve_reorder(spec, serial_fullbatch: bool):
    """``spec`` with ``--reorder auto`` settled: ``degree`` for a single-process full-batch run
    (hubs first: the sparse products read a small hot region; ``docs/performance.md`` has the
    step times), ``none`` otherwise — no gain is shown for mini batch and distributed runs,
    and the ``block`` partitioner would put every hub on one rank; a ``--task link`` run keeps
    the dataset's order, the order of its edge split."""
    if spec.data.reorder != "auto":
        return spec
    serial_fullbatch = serial_fullbatch and spec.link.task == "node"
    return spec.evolve(reorder="degree" if serial_fullbatch and not has_shards(spec) else "none")


def check_shard_flags(spec) -> None:
    """Flags that shape shards as they are written (``--reorder``, ``--partitioner``) are
    refused when ``--partition-dir`` already holds shards made otherwise: the run uses the
    shards as they are, and would silently ignore the flag."""
    if not has_shards(spec):
        return
    if vertex_order(spec) != "none":
        raise InputError(f"--reorder {spec.data.reorder} applies when the shards are written, "
                         f"but --partition-dir {spec.parallel.partition_dir} already holds shards "
                         "(in the order they were written); drop --reorder or use a new folder")
    check_partitioner(spec, spec.parallel.partition_dir)


def check_shards_dataset(spec, shard_dir: str, meta=None) -> None:
    """Refuse shards of another graph than ``--dataset`` (without ``--dataset`` the shards are
    used as they are). Cheap when the shards record the same dataset identity (spec params,
    directed flag, input files' size and mtime); otherwise the dataset is loaded and its
    fingerprint compared with the shards'."""
    if not spec.data.dataset:
        return
    meta = meta if meta is not None else read_meta(shard_dir)
    source = meta.get("source") or {}
    if source.get("key") == dataset_source(spec.data.dataset, spec.data.directed)["key"]:
        return
    if load_graph(spec).fingerprint() != meta["fingerprint"]:
        written = source.get("spec") or f"a graph of fingerprint {meta['fingerprint']}"
        written += " --directed" if source.get("directed") else ""
        given = spec.data.dataset + (" --directed" if spec.data.directed else "")
        raise InputError(f"--partition-dir {shard_dir} holds shards of {written}, not of "
                         f"--dataset {given}; give the dataset they were written for, drop "
                         "--dataset, or use another --partition-dir")


def _check_shards_on_rank_0(rank: int, spec, shard_dir: str) -> None:
    """Launched ranks (all together): rank 0 runs :func:`check_shards_dataset`, which may load
    the dataset; the others take its verdict."""
    failure = None
    if rank == 0:
        try:
            check_shards_dataset(spec, shard_dir)
        except InputError as e:
            failure = e
    verdict = control_all_reduce(torch.tensor([0 if failure is None else 1]), "max")
    if failure is not None:
        raise failure
    if int(verdict[0]):
        raise InputError(f"--partition-dir {shard_dir} does not hold shards of --dataset "
                         f"{spec.data.dataset} (rank 0 says which graph it holds)")


def run_partition(spec, graph: Graph, world: int):
    """The run's partition of ``graph`` into ``world`` parts (``--partitioner``, ``--seed``)."""
    return partition_graph(graph, world, spec.parallel.partitioner or DEFAULT_PARTITIONER,
                           seed=spec.train.seed)


def prepare_shards(spec, world: int, graph: Optional[Graph] = None, part=None
                   ) -> Tuple[ShardSource, bool]:
    """Write shards for ``world`` ranks unless ``--partition-dir`` already holds them; returns
    the source and whether its folder is a temporary one made here (``shards/`` inside a
    :mod:`~gnnpar.launcher.scratch` folder: the caller removes that folder, its parent). ``part``:
    the run's partition of ``graph`` when already made (:func:`run_partition`).

    Filling ``--partition-dir`` holds its write lock (:func:`shard_writer`): a run that finds
    another writer there waits for it, then uses the shards it wrote."""
    out = spec.parallel.partition_dir
    if out:
        if not has_shards(spec):
            def notice(holder: str) -> None:
                if not spec.output.quiet:
                    print(f"gnnpar-train: waiting for {holder}, which is writing shards into "
                          f"--partition-dir {out}", file=sys.stderr, flush=True)

            with shard_writer(out, "--partition-dir", wait=True, notice=notice):
                if not has_shards(spec):  # else written by the run we waited for
                    return _write_shards(spec, world, graph, part, out), False
        meta = read_meta(out)
        if int(meta["parts"]) != world:
            raise InputError(f"the shards in {out} are for {meta['parts']} ranks but --nprocs is "
                             f"{world}; rerun gnnpar-partition with --parts {world}")
        check_shards_dataset(spec, out, meta)
        check_partitioner(spec, out, meta)
        return ShardSource(out, checked=True), False
    remove_stale_scratch_dirs(SHARDS_PREFIX, allow_dirs=True)
    out = os.path.join(make_scratch_dir(SHARDS_PREFIX), "shards")
    try:  # shards/ inside a scratch folder that records its owner
        return _write_shards(spec, world, graph, part, out), True
    except BaseException:  # every way out: no gnnpar-shards-* is left in $TMPDIR
        shutil.rmtree(os.path.dirname(out), ignore_errors=True)
        raise


def _write_shards(spec, world: int, graph: Optional[Graph], part, out: str) -> ShardSource:
    """Load (unless given), partition (unless given) and write the shards into ``out``."""
    source = dataset_source(spec.data.dataset or DEFAULT_SPEC, spec.data.directed)
    graph = graph if graph is not None else load_graph(spec)
    if not spec.output.quiet:
        print(graph.summary(), file=sys.stderr)
    part = part if part is not None else run_partition(spec, graph, world)
    write_shards(graph, part, out, norms=("gcn", "mean"), source=source,
                 what="--partition-dir" if spec.parallel.partition_dir else "shard folder")
    split = graph.meta.get("link_split")
    if split is None:
        return ShardSource(out, checked=True)
    path = os.path.join(os.path.dirname(out), LINK_SPLIT)  # the scratch folder: --task link
    save_split(path, split)                                # refuses --partition-dir
    return ShardSource(out, checked=True, link_split=path)


def check_partitioner(spec, shard_dir: str, meta=None) -> None:
    """Refuse a ``--partitioner`` other than the method the shards in ``--partition-dir`` were
    cut with: the run would use those shards, and the flag would be silently ignored."""
    if not spec.parallel.partitioner:
        return
    meta = meta if meta is not None else read_meta(shard_dir)
    if meta.get("method") != spec.parallel.partitioner:
        raise InputError(f"--partitioner {spec.parallel.partitioner}: --partition-dir "
                         f"{shard_dir} already holds shards cut with {meta.get('method')}, "
                         "which the run would use; drop --partitioner, give --partitioner "
                         f"{meta.get('method')}, or use another --partition-dir")


def load_rank_shard(rank: int, world: int, spec, source: ShardSource) -> Shard:
    """This rank's shard: memory-mapped from ``source.folder``, or (no shards written) cut
    from the dataset in memory — every rank loads the whole graph then."""
    if source.folder is not None:
        if not source.checked:  # launched: the dataset not compared yet
            _check_shards_on_rank_0(rank, spec, source.folder)
        shard = load_shard(source.folder, rank, world_size=world)
        if source.link_split is not None:
            shard.meta["link_split"] = load_split(source.link_split)
        return shard
    graph = load_graph(spec)
    shard = build_shard(graph, run_partition(spec, graph, world), rank)
    shard.meta["vertex_order"] = graph.meta.get("vertex_order")  # as a shard folder's
    if "link_split" in graph.meta:
        shard.meta["link_split"] = graph.meta["link_split"]
    return shard


def dataset_ids(data, ids) -> np.ndarray:
    """The dataset's own ids of rows ``ids`` of ``data`` (the whole graph or a shard, as the
    run loaded it: ``--reorder`` renumbers; ``partitioners/shards.py`` keeps the order)."""
    ids = np.asarray(ids, np.int64)
    order = (data.meta or {}).get("vertex_order")
    return ids if order is None else np.asarray(order[ids], np.int64)


def shard_fingerprint(shard: Shard, spec) -> str:
    """Dataset fingerprint plus partitioning, as a checkpoint records it."""
    meta = shard.meta or {}
    data = (meta.get("fingerprint")
            or f"{spec.data.dataset or DEFAULT_SPEC}|directed={spec.data.directed}")
    return f"{data}|{meta.get('method')}|seed={meta.get('seed')}|parts={meta.get('parts')}"
