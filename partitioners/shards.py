"""Per-rank shards on disk: the format every distributed kernel and the mini-batch service read.

Layout of ``OUT`` after ``write_shards(graph, partition, OUT)`` (format_version 1)::

    OUT/meta.json                 written last, atomically: the directory is valid only with it
    OUT/part-00000/ ... part-<P-1>/   one folder per rank, each renamed into place when complete
        part.json                 manifest: rank, run_id, byte size of every file below
        global_ids.npy            int64 (n_local,)   owned global ids, ascending = local order
        indptr.npy, indices.npy   int64              rank's rows of S = A' + I; columns
                                                     [0, n_local) owned, [n_local, +n_halo) halo
        values_<kind>.npy         float32 (nnz,)     Â of each norm, computed on the whole graph
        raw_weight.npy            float32 (nnz,)     S's raw weights (float64 if A's are)
        orig_edge.npy             bool (nnz,)        entry is an edge of A (not an added loop)
        halo_ids.npy              int64 (n_halo,)    by owner rank, then ascending global id
        recv_counts.npy           int64 (P,)         halo rows coming from each rank
        send_counts.npy           int64 (P,)         rows sent to each rank
        send_local.npy            int64              local ids to send, grouped by destination,
                                                     each group in the receiver's halo order
        x.npy y.npy train_mask.npy val_mask.npy test_mask.npy   owned rows

``meta.json`` holds ``format_version``, ``run_id``, ``fingerprint`` (``Graph.fingerprint()``),
``method``, ``parts``, ``seed``, ``balance``, ``imbalance``, ``n``, ``m``, ``nnz``,
``num_features``, ``num_classes``, ``sizes``, ``norms`` and what :func:`reassemble`
needs to rebuild the graph (``weighted``, dtypes, ``canonical_csr``).

Grid blocks: earlier versions could also write 2D/3D blocks (``part-*/grid/``, ``OUT/grid/``,
``gnnpar-partition --grid``). No kernel read them (the 2D/3D kernels cut their blocks from these
shards at setup, in the layout the run picks), so they are no longer written; in an older folder
they are ignored on load and removed by a rewrite.

Consistency: for ranks q != r, ``halo_ids`` of q restricted to owner r equals
``global_ids[send_local[group q]]`` of r. Crash safety: folders are written as
``part-0000k.tmp-<pid>`` and renamed; ``meta.json`` is removed before a rewrite starts and written
after every folder is in place; each ``part.json`` carries the ``run_id`` of its write, so a
folder from another write, a missing or truncated file, or a missing ``meta.json`` is refused.

Ownership: ``OUT`` is claimed as gnnpar's ``"shards"`` (:mod:`gnnpar.datasets.owned`; marker
``.gnnpar-owner.json``). A write goes only into a new or empty folder, or one whose every entry
is provably a gnnpar shard artefact (see :func:`check_shard_folder`); anything else in it — a
file gnnpar never writes, a ``part-NNNNN`` or ``grid`` folder holding files its manifest does
not list, a symbolic link — refuses the whole write with :class:`InputError` before any work,
so a rewrite removes only gnnpar's own files. A shard folder of an older gnnpar (no marker,
every entry an artefact, ``meta.json`` included) is accepted and marked.

Loading refuses (:class:`InputError` naming the file) a symbolic link anywhere in the shard
folder, a manifest naming a path outside its folder, a file numpy cannot read without
unpickling (``allow_pickle=False``), and contents a valid graph cannot have: wrong shapes or
dtypes, NaN/inf features or values, a label outside ``[0, num_classes)``, an index out of
range (checked in chunks, so memory-mapped shards stay memory-mapped).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import uuid

import numpy as np

from gnnpar.datasets import Graph, InputError
from gnnpar.datasets.cache import stored_fingerprint

from .partition import Partition
from .node_stream import FeatureBlocks, write_small_arrays
from .part_pool import map_parts
from .shard_build import NODE_ARRAYS, Shard, ShardBuilder, build_shard, build_shards, kernels  # noqa: F401
from .shard_check import validate_shard
from .write_through import background, save_npy
from .shard_folder import (GRID_DIR, GRID_MANIFEST, LEFTOVER_RE, MANIFEST, META, PART_RE,  # noqa: F401
                           TMP_FILE_RE, VERTEX_ORDER, check_shard_folder, claim_shard_folder,  # noqa: F401
                           dataset_source, writing)

FORMAT_VERSION = 1
#: a part's structure files besides its ``values_<norm>.npy``
STRUCTURE_ARRAYS = ("global_ids", "indptr", "indices", "raw_weight", "orig_edge", "halo_ids",
                    "recv_counts", "send_counts", "send_local")
_REL_RE = re.compile(r"^[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*\.npy$")  # a file a manifest may name


def part_dir(out_dir: str, rank: int) -> str:
    return os.path.join(out_dir, f"part-{rank:05d}")


def _write_json_atomic(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _move_into_place(tmp: str, final: str) -> None:
    """Rename a finished folder to its final name, replacing an older one."""
    if os.path.exists(final):
        old = f"{final}.old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)


def _structure_files(arrays: dict) -> dict:
    """relative path -> array of a part's structure (:meth:`ShardBuilder.structure`; the send
    lists only when ``arrays`` has them)."""
    files = {f"{name}.npy": arrays[name] for name in STRUCTURE_ARRAYS if name in arrays}
    files.update({f"values_{k}.npy": v for k, v in arrays["values"].items()})
    return files


def _save_files(folder: str, files: dict) -> None:
    for rel, arr in files.items():
        save_npy(os.path.join(folder, rel), arr)


def _start_folder(final: str) -> str:
    tmp = f"{final}.tmp-{os.getpid()}"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    return tmp


def _finish_folder(tmp: str, final: str, manifest: dict) -> None:
    """Write the manifest (every file's size) into ``tmp`` and rename it to ``final``."""
    files = {}
    for dirpath, _, names in os.walk(tmp):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), tmp).replace(os.sep, "/")
            files[rel] = os.path.getsize(os.path.join(dirpath, name))
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump({**manifest, "files": dict(sorted(files.items()))}, f, indent=1)
    _move_into_place(tmp, final)


def write_shards(graph: Graph, partition: Partition, out_dir: str, norms=("gcn", "mean"),
                 progress=None, source=None, what: str = "shard folder", jobs: int = 1,
                 row_block=None, builder: ShardBuilder = None, validated: bool = False) -> dict:
    """Write one folder per part plus ``meta.json`` (see module docstring); returns the meta.

    Streams: the global passes keep O(n) vectors (:class:`ShardBuilder`), each part's rows are
    made and written on their own, and ``x`` goes to every part in row blocks
    (``partitioners/node_stream.py``; ``row_block`` rows a block, default about 64 MiB), so no
    copy of the graph or of its features is held. The parts (biggest first) and then the
    feature blocks are the tasks of one pool of ``jobs`` forked processes, so the blocks fill
    in while the last parts finish. ``builder`` reuses passes already made for ``graph`` and
    ``partition``; one made with ``halos=False`` gets its halos from the part tasks, each
    part's halo pass just before its rows pass (and holds them after, for the quality
    report). ``progress(msg)`` is
    called before each long step. ``source`` (:func:`dataset_source`) is recorded in
    ``meta.json`` so readers can match a dataset spec cheaply. ``out_dir`` must pass
    :func:`check_shard_folder` (``what`` names it in messages). ``validated``: the caller has
    just validated ``graph`` (``load_dataset`` does), so its arrays are not read once more.
    """
    out_dir = os.fspath(out_dir)
    check_shard_folder(out_dir, what)                        # before any work
    with writing(out_dir, what):  # the folder's write lock, unless this process holds it
        return _write_shards(graph, partition, out_dir, norms, progress, source, what, jobs,
                             row_block, builder, validated)


def _write_shards(graph, partition, out_dir, norms, progress, source, what, jobs, row_block,
                  builder, validated) -> dict:
    say = progress or (lambda msg: None)
    if not validated:
        graph.validate()
    if builder is None:
        say("normalisation sums (a pass over the structure)")
        builder = ShardBuilder(graph, partition, norms, jobs=jobs, progress=say, halos=False)
    elif builder.graph is not graph or builder.partition is not partition:
        raise ValueError("write_shards: the builder was made for another graph or partition")
    claim_shard_folder(out_dir, what)  # checked again: from here on every entry is gnnpar's
    meta_path = os.path.join(out_dir, META)
    if os.path.exists(meta_path):
        os.remove(meta_path)  # the directory stays invalid until this write completes
    for entry in os.listdir(out_dir):  # debris of a crashed write (one writer per directory)
        if LEFTOVER_RE.match(entry):
            shutil.rmtree(os.path.join(out_dir, entry))
        elif TMP_FILE_RE.match(entry):
            os.remove(os.path.join(out_dir, entry))
    run_id = uuid.uuid4().hex
    fingerprint = stored_fingerprint(graph) or graph.fingerprint()  # a cache's: no re-hash
    P = partition.num_parts
    if os.path.exists(os.path.join(out_dir, GRID_DIR)):  # grid rows of an older gnnpar
        shutil.rmtree(os.path.join(out_dir, GRID_DIR))
    tmps = [_start_folder(part_dir(out_dir, rank)) for rank in range(P)]

    say(f"features and labels of {graph.num_nodes:,} vertices")
    write_small_arrays(graph, partition, tmps)
    blocks = FeatureBlocks(graph, partition, tmps, row_block)
    blocks.prepare()

    halos_later = builder.halo_ids is None  # each part task makes its own halo first

    def task(plan: ShardBuilder, job: tuple):
        kind, i = job
        if kind == "x":  # a block of feature rows, beside the parts' rows in the pool
            rows = blocks.write(i, background())
            if i % 8 == 7:
                say(f"features: block {i + 1}/{len(blocks)} ({rows:,} rows)")
            return None
        halo, arrays = plan.rows_with_halo(i) if halos_later else (None, plan.structure(i))
        # the disk takes this part's files while the process makes the next task's
        background().submit(_save_files, tmps[i], _structure_files(arrays))
        plan.release()
        say(f"rows of part {i + 1}/{P}: {arrays['indices'].shape[0]:,} non-zeros, "
            f"{arrays['halo_ids'].shape[0]:,} halo rows")
        return halo, {"n_local": int(arrays["global_ids"].shape[0]),
                      "n_halo": int(arrays["halo_ids"].shape[0]),
                      "nnz": int(arrays["indices"].shape[0])}

    # the biggest parts first, the feature blocks last: they fill in while the last rows finish
    size = builder.work_estimate() if halos_later else builder.part_nnz
    by_size = sorted(range(P), key=lambda r: -int(size[r]))
    jobs = [("rows", r) for r in by_size] + [("x", i) for i in range(len(blocks))]
    results = map_parts(builder, task, jobs, builder.jobs, before_fork=kernels,
                        finish=lambda: background().flush())
    done = {job[1]: res for job, res in zip(jobs, results) if job[0] == "rows"}
    if halos_later:  # every halo is known now: the send lists follow from them
        builder.take_halos(done[rank][0] for rank in range(P))
        for rank in range(P):
            send_local, send_counts = builder.sends(rank)
            save_npy(os.path.join(tmps[rank], "send_local.npy"), send_local)
            save_npy(os.path.join(tmps[rank], "send_counts.npy"), send_counts)
    for rank in range(P):
        manifest = {"format_version": FORMAT_VERSION, "run_id": run_id, "rank": rank,
                    **done[rank][1]}
        _finish_folder(tmps[rank], part_dir(out_dir, rank), manifest)
    for entry in os.listdir(out_dir):  # parts left over from an earlier write with more parts
        match = PART_RE.match(entry)
        if match and int(match.group(1)) >= P:
            shutil.rmtree(os.path.join(out_dir, entry))
    order = _write_vertex_order(graph, out_dir)
    ew = graph.edge_weight
    meta = {
        "format_version": FORMAT_VERSION, "run_id": run_id, "fingerprint": fingerprint,
        "name": graph.name, "method": partition.method, "parts": P, "seed": partition.seed,
        "balance": partition.info.get("balance"), "imbalance": partition.info.get("imbalance"),
        "n": graph.num_nodes, "m": graph.num_edges, "nnz": builder.nnz_total,
        "num_features": graph.num_features, "num_classes": int(graph.num_classes),
        "sizes": [int(s) for s in partition.sizes], "norms": list(builder.norms),
        "weighted": ew is not None,
        "edge_weight_dtype": np.asarray(ew).dtype.str if ew is not None else None,
        "canonical_csr": builder.canonical,
        "source": dict(source) if source is not None else None,
    }
    if order is not None:
        meta["vertex_order"] = order
    _write_json_atomic(meta_path, meta)
    say(f"wrote {P} parts to {out_dir}")
    return meta


def _write_vertex_order(graph: Graph, out_dir: str):
    """A reordered graph's ``vertex_order`` (new position → dataset id, :mod:`gnnpar.datasets.
    reorder`) as ``vertex_order.npy`` beside ``meta.json``, so what is computed per shard row
    can be put back in the dataset's order; returns its ``--reorder`` name, or None (the
    dataset's own order: an older file is removed)."""
    path = os.path.join(out_dir, VERTEX_ORDER)
    order = graph.meta.get("vertex_order")
    if order is None or graph.meta.get("reorder", "none") == "none":
        if os.path.exists(path):
            os.remove(path)
        return None
    tmp = f"{path}.tmp-{os.getpid()}"
    save_npy(tmp, np.asarray(order, np.int64))
    os.replace(tmp, path)
    return str(graph.meta["reorder"])


def dataset_order(out_dir: str, meta: dict):
    """The shards' new position → dataset id (memory-mapped), or None when they are in the
    dataset's own order."""
    if not meta.get("vertex_order"):
        return None
    path = os.path.join(out_dir, VERTEX_ORDER)
    _no_link(out_dir, path)
    try:
        order = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read the shards' vertex order ({e}); rewrite the "
                         "shards") from None
    if order.shape != (int(meta["n"]),) or order.dtype != np.int64:
        raise InputError(f"{path}: not a vertex order of {meta['n']} vertices; rewrite the "
                         "shards")
    return order


# ---------------------------------------------------------------------------- loading
def _no_link(out_dir: str, path: str) -> None:
    """Refuse ``path`` when it, or a folder between ``out_dir`` and it, is a symbolic link."""
    rel = os.path.relpath(path, out_dir)
    probe = out_dir
    for part in rel.split(os.sep):
        if part in ("", "."):
            continue
        probe = os.path.join(probe, part)
        if os.path.islink(probe):
            raise InputError(f"{probe} is a symbolic link: gnnpar reads only files inside the "
                             "shard folder; rewrite the shards with gnnpar-partition")


def read_meta(out_dir: str) -> dict:
    """``meta.json`` of a shard directory, with its format version checked."""
    path = os.path.join(out_dir, META)
    _no_link(out_dir, path)
    if not os.path.isfile(path):
        raise InputError(f"{out_dir} has no {META}: not a shard directory, "
                         "or its write did not finish")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read {path}: {err}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path} is not a shard meta.json (not a JSON object)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path} has shard format version {meta.get('format_version')!r}; "
                         f"this gnnpar reads version {FORMAT_VERSION}: "
                         "rewrite the shards with gnnpar-partition")
    missing = [k for k in ("run_id", "fingerprint", "parts", "n", "num_features", "num_classes",
                           "norms") if k not in meta]
    if missing:
        raise InputError(f"{path} lacks {', '.join(missing)}: "
                         "rewrite the shards with gnnpar-partition")
    return meta


def _check_folder(out_dir: str, folder: str, manifest_name: str, run_id: str) -> dict:
    _no_link(out_dir, folder)
    path = os.path.join(folder, manifest_name)
    _no_link(out_dir, path)
    if not os.path.isfile(path):
        raise InputError(f"{folder} is incomplete (no {manifest_name}): its write did not finish; "
                         f"rewrite the shards")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read {path}: {err}; rewrite the shards") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise InputError(f"{path} is not a shard manifest (no 'files'); rewrite the shards")
    if manifest.get("run_id") != run_id:
        raise InputError(f"{folder} comes from a different write than {META} (run ids differ); "
                         f"rewrite the shards")
    for rel, size in manifest["files"].items():
        if not isinstance(rel, str) or not _REL_RE.match(rel):
            raise InputError(f"{path} names {rel!r}, not a file inside {folder}; "
                             "rewrite the shards")
        file = os.path.join(folder, *rel.split("/"))
        _no_link(out_dir, file)
        if not os.path.isfile(file) or os.path.getsize(file) != size:
            raise InputError(f"{file} is missing or truncated; rewrite the shards")
    return manifest


def _load(folder: str, rel: str, mmap: bool):
    path = os.path.join(folder, *rel.split("/"))
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise InputError(f"cannot read {path}: {' '.join(str(err).split())}; rewrite the "
                         "shards") from None


def load_grid_rows(out_dir: str, start: int = 0, stop: int = 0, mmap: bool = True) -> dict:
    """Refused: grid blocks and grid-ordered rows are no longer written (no kernel read them;
    the 2D/3D kernels cut their blocks from the shards at setup). Kept so that a caller of the
    old API gets this message rather than an import error."""
    raise InputError(f"grid rows are no longer written or read ({out_dir}): the 2D/3D kernels "
                     "build their blocks from the per-rank shards at setup")


def load_shard(out_dir: str, rank: int, world_size=None, fingerprint=None,
               mmap: bool = True) -> Shard:
    """Rank ``rank``'s :class:`Shard` from ``out_dir`` (arrays memory-mapped when ``mmap``).

    Refuses with :class:`InputError` a wrong format version, a ``world_size`` other than the part
    count, a ``fingerprint`` other than the written graph's, an incomplete/stale folder, a
    symbolic link in it, or contents no valid graph has (checked in chunks; see module docstring).
    """
    meta = read_meta(out_dir)
    P = int(meta["parts"])
    if world_size is not None and int(world_size) != P:
        raise InputError(f"the shards in {out_dir} are for {P} ranks "
                         f"but the world size is {world_size}; "
                         f"rerun gnnpar-partition with --parts {world_size}")
    if fingerprint is not None and fingerprint != meta["fingerprint"]:
        raise InputError(f"the shards in {out_dir} were written for dataset fingerprint "
                         f"{meta['fingerprint']}, "
                         f"not {fingerprint}: they belong to another graph")
    if not 0 <= int(rank) < P:
        raise InputError(f"rank {rank} is outside [0, {P}) for the shards in {out_dir}")
    folder = part_dir(out_dir, int(rank))
    _no_link(out_dir, folder)
    if not os.path.isdir(folder):
        raise InputError(f"{folder} is missing: the write did not finish; rewrite the shards")
    manifest = _check_folder(out_dir, folder, MANIFEST, meta["run_id"])
    if manifest.get("rank") != int(rank):
        raise InputError(f"{folder} holds rank {manifest.get('rank')}, not {rank}")
    arr = {rel[:-4]: _load(folder, rel, mmap) for rel in manifest["files"] if "/" not in rel}
    validate_shard(folder, meta, manifest, arr)
    return Shard(
        rank=int(rank), world_size=P, n_global=int(meta["n"]), num_classes=int(meta["num_classes"]),
        global_ids=arr["global_ids"], indptr=arr["indptr"], indices=arr["indices"],
        values={k: arr[f"values_{k}"] for k in meta["norms"]}, raw_weight=arr["raw_weight"],
        orig_edge=arr["orig_edge"], halo_ids=arr["halo_ids"], recv_counts=arr["recv_counts"],
        send_counts=arr["send_counts"], send_local=arr["send_local"],
        meta={**meta, "vertex_order": dataset_order(out_dir, meta)},
        **{name: arr[name] for name in NODE_ARRAYS})


def reassemble(out_dir: str) -> Graph:
    """Rebuild the written graph from all shards (tests and tools; holds the whole graph).

    Exact (same CSR, weights, features, labels, masks and fingerprint) when the original rows
    had sorted, duplicate-free columns (``meta['canonical_csr']``, true for every graph built by
    ``Graph.csr_from_edges``); otherwise the result is that graph's canonical form.
    """
    meta = read_meta(out_dir)
    n, P = int(meta["n"]), int(meta["parts"])
    rows, cols, weights, node = [], [], [], {}
    for rank in range(P):
        s = load_shard(out_dir, rank, mmap=True)
        keep = np.asarray(s.orig_edge)
        local_rows = np.repeat(np.arange(s.n_local, dtype=np.int64), np.diff(s.indptr))
        rows.append(np.asarray(s.global_ids)[local_rows[keep]])
        cols.append(s.column_ids()[np.asarray(s.indices)[keep]])
        weights.append(np.asarray(s.raw_weight)[keep])
        for name in NODE_ARRAYS:
            src = np.asarray(getattr(s, name))
            if name not in node:
                node[name] = np.zeros((n,) + src.shape[1:], src.dtype)
            node[name][np.asarray(s.global_ids)] = src
    src, dst = np.concatenate(cols), np.concatenate(rows)
    order = np.argsort(dst * n + src, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    indices = src[order]
    ew = (np.concatenate(weights)[order].astype(np.dtype(meta["edge_weight_dtype"]))
          if meta["weighted"] else None)
    return Graph(indptr=indptr, indices=indices, edge_weight=ew,
                 num_classes=int(meta["num_classes"]), name=meta.get("name", "graph"), **node)
