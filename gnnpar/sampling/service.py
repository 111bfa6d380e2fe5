"""The macrobatch service: sampler threads that run ahead of the trainer.

Work is cut into macrobatches of K consecutive minibatches (``--macrobatch K``); task t is
macrobatch t of the run (epochs follow each other, so sampling of the next epoch overlaps
the evaluation at the end of this one). Worker thread w (``--sampler-workers W``) takes
tasks w, w+W, w+2W, … and for each one

1. samples its K minibatches at once (:class:`~gnnpar.sampling.bulk.BulkSampler`, or one by
   one with ``bulk=False``; the blocks are identical either way);
2. takes the union U of their input nodes and fetches each row of U once
   (:meth:`~gnnpar.sampling.features.FeatureStore.fetch`; with K = 1 every minibatch fetches
   its own inputs, with larger K a row shared by several minibatches moves once);
3. copies the K minibatches' input features out of that table in one pass in row order
   (:meth:`~gnnpar.sampling.features.MacroFeatures.gather_all`, :mod:`.row_gather`) and
   assembles ready minibatches: SpMM operators of the blocks, input features, seed labels;
   with ``input_dropout`` (``ServiceConfig``) that copy drops the features on the way,
   with a mask seed of (seed, epoch, stream, step), and the model skips its own input
   dropout (``ReadyBatch.x_dropout``): a pass over the step's largest tensor and a fresh
   tensor of its size less in every step, for a hash per four elements in the copy
   (``docs/performance.md`` has the measurement). Where the copy cannot (remote rows, no
   numba) the model drops them itself.
   A block's Âᵀ (the backward product's operator) is built here too, except the input
   block's: its features need no gradient unless the model applies a weight before the
   product, so it is deferred to the first backward pass that asks for it
   (:class:`~gnnpar.sampling.blocks.BlockOperator`), and once one has, the workers build it
   for every later minibatch.

Task t may start only once the trainer has taken task t − D (``--prefetch D``), so at most
D macrobatches wait ready and memory stays bounded; the trainer takes tasks in order, and
the time it waits is ``stall_s``. A task depends only on (seed, epoch, rank, step), so
blocks are the same for every W and D, in bursts or not (below). A worker's feature fetches
are collectives on its own communicator: worker w of every rank runs the same task sequence,
so they pair up.

Threads, not processes: the samplers are numpy/torch code that releases the GIL in its
array passes, the topology and features are shared without copies, and the collectives stay
in this process's groups.

One thread budget on a CPU run: ``--threads T`` is what the trainer's torch ops (and its
compiled SpMM) get; the workers come on top, but each lowers its own OS priority
(``ServiceConfig.nice``, 19 unless told: :func:`lower_thread_priority`), so they run on the
cycles the trainer leaves idle — its single-threaded stretches (Python, autograd, small
ops) and the waits of its OpenMP threads, which :mod:`gnnpar` keeps from spinning long
(``GOMP_SPINCOUNT``) — while the trainer's GEMMs keep whole cores. A worker never changes
torch's thread count (that is per process). When the trainer has to wait for a macrobatch,
its cores are idle and the workers get them at once (``stall_s``). On a GPU the workers keep
their priority: there they feed the device, and the trainer mostly waits on it.

In bursts (``ServiceConfig.burst``): when the trainer's threads already hold every core, a
worker beside them takes a core from a parallel region (a GEMM, a compiled pass) whose other
threads then wait for it at the region's end, so the trainer loses about the workers' whole
CPU time, however low their priority. In burst mode the workers never run beside the trainer:
tasks go in groups of W, and a group starts only when the trainer asks for its first task and
blocks; the W workers then sample the group's W macrobatches at once, one per core, at normal
priority, and the trainer steps through them with no sampler running. The trainer waits for
every group (``stall_s`` counts it), but for the workers' CPU time divided by W, not all of
it. :func:`gnnpar.training.minibatch_setup.serial_parts` picks it for a one-process CPU run whose
trainer has every core (``docs/performance.md`` has the measurement).

On a GPU (``--device cuda``) the same workers feed the device without stopping it: with
``sampler="device"`` a macrobatch is sampled by torch kernels on the device
(:mod:`.device_sampler`); with features on the device (``--features-on device``) its
rows are gathered there; whatever is made on the host is copied from pinned memory on the
worker's side stream (:mod:`.staging`), so the next macrobatch's sampling and copies overlap
the current step. ``inline=True`` is the plain reference: no threads, the trainer produces
each macrobatch itself when it needs it, copies block; the blocks are the same.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional

import numpy as np
import torch

from gnnpar.datasets import InputError

from gnnpar.sampling.blocks import Block, Relabeler, block_operators
from gnnpar.sampling.bulk import BulkSampler
from gnnpar.sampling.device_sampler import TorchBulkSampler, TorchRelabeler, TorchTopology
from gnnpar.sampling.draws import DRAWS
from gnnpar.sampling.neighbor import NeighborSampler, SamplerConfig, batch_rng, input_dropout_seed
from gnnpar.sampling.seeds import EpochPlan
from gnnpar.sampling.staging import Stager, concrete_device, take

#: where a macrobatch is sampled: numpy on the host, or torch on the training device
SAMPLER_SITES = ("host", "device")


@dataclass(frozen=True)
class ServiceConfig:
    """macrobatch: minibatches sampled and fetched together, K ≥ 1 (default 1; ``gnnpar-train``
    picks its own, :func:`~gnnpar.sampling.options.pipeline_depth`); workers: sampler
    threads, ≥ 1 (default 1); prefetch: macrobatches allowed ahead of the trainer, ≥ 1
    (default 2); bulk: sample a macrobatch with the bulk matrix sampler (else
    minibatch by minibatch); seed: of every draw; device: of operators and features;
    sampler: ``host`` (numpy samplers) or ``device`` (:mod:`.device_sampler` on ``device``);
    draws: the device sampler's uniforms (:mod:`.draws`: ``hash`` made on the device, ``pcg``
    = the host samplers' draws, same blocks as ``host``); inline: no threads, the trainer
    samples each macrobatch when it needs it (the plain reference of the pipeline); nice:
    on a CPU run, each worker thread lowers its own OS priority to this niceness, 0-19
    (default 19, the lowest; 0 leaves it as the trainer's; Linux only, see the module
    docstring); input_dropout: drop probability applied to each minibatch's input features
    as they are copied (0: none; only where the compiled copy serves them, else the model
    drops them; set for :class:`gnnpar.nn.models.GNN` only, which skips its own input
    dropout then); burst: the workers sample groups of ``workers`` macrobatches only while
    the trainer waits for one (module docstring), at the trainer's priority (``nice``
    unused); prefetch must then be at least ``workers``, so a group is sampled at once."""

    macrobatch: int = 1
    workers: int = 1
    prefetch: int = 2
    bulk: bool = True
    seed: int = 0
    device: str = "cpu"
    sampler: str = "host"
    draws: str = "hash"
    inline: bool = False
    nice: int = 19
    burst: bool = False
    input_dropout: float = 0.0

    def __post_init__(self):
        if self.sampler not in SAMPLER_SITES:
            raise InputError(f"sampler site must be one of {SAMPLER_SITES}, got {self.sampler!r}")
        if self.draws not in DRAWS:
            raise InputError(f"draws must be one of {tuple(DRAWS)}, got {self.draws!r}")
        for name, flag in (("macrobatch", "--macrobatch"), ("workers", "--sampler-workers"),
                           ("prefetch", "--prefetch")):
            if getattr(self, name) < 1:
                raise InputError(f"{flag} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.nice <= 19:
            raise InputError(f"sampler niceness must be in 0..19, got {self.nice}")
        if not 0.0 <= self.input_dropout < 1.0:
            raise InputError(f"input dropout must be in [0, 1), got {self.input_dropout}")
        if self.burst and self.prefetch < self.workers:
            raise InputError(f"burst sampling holds a group of {self.workers} macrobatches "
                             f"(one per worker): prefetch must be >= {self.workers}, got "
                             f"{self.prefetch}")


@dataclass
class ReadyBatch:
    """One minibatch ready for a step: ``model(ops, x)`` gives the logits of ``seeds``.

    Shapes: seeds, y (B,); x (n_input, f); ops/blocks: L, input layer first. A rank of a
    group sharing the minibatch holds only its part: ``shards`` (one
    :class:`~gnnpar.kernels.bipartite.BlockShard` per layer, its engine builds the operators),
    x its owned input rows, y the labels of its owned seeds; ``ops`` is None. ``ready``: the
    CUDA event after which its tensors are on the device (:mod:`.staging`), None elsewhere.
    ``x_dropout``: the drop probability ``x`` already went through (``input_dropout``),
    else None. ``seed_owner`` (a group's rank): the member that owns each of ``blocks``'
    seeds (block order), whose output row it computes."""

    epoch: int
    step: int
    seeds: np.ndarray
    blocks: List[Block]
    ops: list
    x: torch.Tensor
    y: torch.Tensor
    shards: Optional[list] = None
    ready: Optional[object] = None
    x_dropout: Optional[float] = None
    seed_owner: Optional[np.ndarray] = None


@dataclass
class SamplingStats:
    """Per-rank counters of the ready macrobatches (summed over an epoch by the trainer).
    ``feat_bytes``: feature rows this rank sent; ``comm_bytes``: everything its workers sent
    (feature rows, ids, counts, partitioned-structure lookups); ``sampler_s``: producer time
    (sampling, fetch, assembly)."""

    steps: int = 0
    sampled_edges: int = 0
    input_nodes: int = 0
    unique_input_nodes: int = 0
    remote_rows: int = 0
    cache_hits: int = 0
    feat_bytes: int = 0
    comm_bytes: int = 0
    sampler_s: float = 0.0
    stall_s: float = 0.0

    def add(self, other: "SamplingStats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class _Macro:
    batches: List[ReadyBatch]
    stats: SamplingStats


@dataclass
class _Shared:
    cond: threading.Condition = field(default_factory=threading.Condition)
    ready: Dict[int, _Macro] = field(default_factory=dict)
    taken: int = 0
    released: int = 0  #: burst mode: the workers may start tasks below this one
    stop: bool = False
    error: Optional[BaseException] = None


class MacrobatchService:
    """Produces :class:`ReadyBatch` es for epochs ``[start, end)`` of ``plan``.

    ``store``: :class:`~gnnpar.sampling.features.FeatureStore`; ``labels``: (n_local,) int64
    labels of the rows this rank owns; ``comms``: one ``(Comm, axes)`` per worker for
    distributed fetches (None serially).
    """

    def __init__(self, topo, store, plan: EpochPlan, sampler: SamplerConfig, cfg: ServiceConfig,
                 labels: torch.Tensor, comms=None):
        if comms is not None and len(comms) != cfg.workers:
            raise ValueError(f"need one communicator per worker: {len(comms)} for {cfg.workers}")
        self.topo, self.store, self.plan, self.cfg = topo, store, plan, cfg
        self.device = concrete_device(cfg.device)
        if cfg.sampler == "device":
            self.sampler = TorchBulkSampler(TorchTopology(topo, self.device), sampler)
        else:
            self.sampler = (BulkSampler if cfg.bulk else NeighborSampler)(topo, sampler)
        self.labels = labels
        self.comms = comms
        self._inline = None  # the trainer's own (relabeler, stager) when cfg.inline
        self.per_epoch = -(-plan.steps // cfg.macrobatch)
        self._seeds: Dict[int, List[np.ndarray]] = {}
        self._seeds_lock = threading.Lock()
        self._shared = _Shared()
        self._threads: List[threading.Thread] = []
        self._next = 0
        self.start_epoch = self.end_epoch = 0
        #: layers whose deferred Âᵀ a step has needed: built by the workers from then on
        self._transposes_needed: set = set()

    # ------------------------------------------------------------------ trainer side
    def start(self, start_epoch: int, end_epoch: int) -> "MacrobatchService":
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        total = max(0, end_epoch - start_epoch) * self.per_epoch
        if self.cfg.inline:
            self._inline = (self._relabeler(), Stager(self.device, side_stream=False))
            return self
        for w in range(self.cfg.workers):
            t = threading.Thread(target=self._work, args=(w, total), daemon=True,
                                 name=f"gnnpar-sampler-{w}")
            t.start()
            self._threads.append(t)
        return self

    def epoch(self, epoch: int, stats: SamplingStats):
        """Yield the ``plan.steps`` ready minibatches of ``epoch`` in step order, adding the
        sampling counters and the time spent waiting to ``stats``."""
        for _ in range(self.per_epoch):
            t = self._next
            if t // self.per_epoch + self.start_epoch != epoch:
                raise RuntimeError(f"epoch {epoch} asked for out of order")
            t0 = time.perf_counter()
            macro = self._inline_macro(epoch, t) if self._inline is not None else self._take(t)
            self._next = t + 1
            macro.stats.stall_s = time.perf_counter() - t0
            stats.add(macro.stats)
            for batch in macro.batches:
                yield take(batch)  # an inline batch has no event: nothing to wait for

    def _inline_macro(self, epoch: int, t: int) -> "_Macro":
        """Task ``t`` produced by the trainer itself (``inline``)."""
        comm, axes = self.comms[0] if self.comms is not None else (None, None)
        return self.produce(epoch, t % self.per_epoch, *self._inline, comm, axes)

    def _take(self, t: int) -> "_Macro":
        """Task ``t`` from the workers, waiting until it is ready."""
        sh = self._shared
        with sh.cond:
            if self.cfg.burst and t >= sh.released:  # the group of task t starts now
                w = self.cfg.workers
                sh.released = (t // w + 1) * w
                sh.cond.notify_all()
            while t not in sh.ready and sh.error is None:
                sh.cond.wait()
            if sh.error is not None:
                raise RuntimeError(f"sampler worker failed: {sh.error!r}") from sh.error
            macro = sh.ready.pop(t)
            sh.taken = t + 1
            sh.cond.notify_all()
        return macro

    def close(self, timeout: float = 5.0) -> None:
        sh = self._shared
        with sh.cond:
            sh.stop = True
            sh.cond.notify_all()
        for t in self._threads:
            t.join(timeout)

    # ------------------------------------------------------------------ worker side
    def _work(self, w: int, total: int) -> None:
        sh = self._shared
        if self.device.type == "cpu" and not self.cfg.burst:
            lower_thread_priority(self.cfg.nice)
        stager = Stager(self.device)
        with stager.context():  # its scratch arrays are made on the stream that uses them
            relabel = self._relabeler()
        comm, axes = self.comms[w] if self.comms is not None else (None, None)
        for t in range(w, total, self.cfg.workers):
            with sh.cond:
                while (t >= sh.taken + self.cfg.prefetch
                       or (self.cfg.burst and t >= sh.released)) and not sh.stop:
                    sh.cond.wait()
                if sh.stop:
                    return
            try:
                macro = self.produce(self.start_epoch + t // self.per_epoch, t % self.per_epoch,
                                     relabel, stager, comm, axes)
            except BaseException as e:  # noqa: BLE001 - handed to the trainer
                with sh.cond:
                    sh.error = e
                    sh.cond.notify_all()
                return
            with sh.cond:
                sh.ready[t] = macro
                sh.cond.notify_all()

    def _relabeler(self):
        if self.cfg.sampler == "device":
            return TorchRelabeler(self.topo.num_nodes, self.device)
        return Relabeler(self.topo.num_nodes)

    def _epoch_seeds(self, epoch: int) -> List[np.ndarray]:
        with self._seeds_lock:
            if epoch not in self._seeds:
                for old in [e for e in self._seeds if e < epoch - 1]:
                    del self._seeds[old]
                self._seeds[epoch] = self.plan.minibatches(epoch)
            return self._seeds[epoch]

    def produce(self, epoch: int, m: int, relabel, stager: Stager, comm=None,
                axes=None) -> _Macro:
        """Macrobatch ``m`` of ``epoch``: sample, fetch features once, assemble (device work
        queued on ``stager``'s side stream; the batches carry its event)."""
        with stager.context():
            macro = self._produce(epoch, m, relabel, stager, comm, axes)
            ready = stager.seal()
        for b in macro.batches:
            b.ready = ready
        return macro

    def _produce(self, epoch: int, m: int, relabel, stager: Stager, comm, axes) -> _Macro:
        t0 = time.perf_counter()
        before = _sent_bytes(comm)
        K, plan, st = self.cfg.macrobatch, self.plan, self.store
        steps = range(m * K, min((m + 1) * K, plan.steps))
        seeds = [self._epoch_seeds(epoch)[s] for s in steps]
        owners = None if self.topo.replicated else (comm, axes)
        if self.cfg.sampler == "device":
            draws = [DRAWS[self.cfg.draws](self.cfg.seed, epoch, plan.stream, s, self.device)
                     for s in steps]
            blocks = self.sampler.sample(seeds, draws, relabel)
        elif isinstance(self.sampler, BulkSampler):
            rngs = [batch_rng(self.cfg.seed, epoch, plan.stream, s) for s in steps]
            blocks = self.sampler.sample(seeds, rngs, relabel, owners)
        else:
            rngs = [batch_rng(self.cfg.seed, epoch, plan.stream, s) for s in steps]
            blocks = [self.sampler.sample(s, r, relabel, owners) for s, r in zip(seeds, rngs)]
        shares = [self.share(b) for b in blocks]
        union = relabel.union([sh.input_ids for sh in shares])
        table, fetched = st.fetch(union, comm, axes)
        after = _sent_bytes(comm)
        counted = self.counts_sampling
        stats = SamplingStats(
            steps=len(steps),
            sampled_edges=sum(blk.num_sampled for b in blocks for blk in b) if counted else 0,
            input_nodes=sum(b[0].num_src for b in blocks) if counted else 0,
            unique_input_nodes=fetched.unique, remote_rows=fetched.remote,
            cache_hits=fetched.cache_hits, feat_bytes=after[0] - before[0],
            comm_bytes=after[1] - before[1])
        ids = [sh.input_ids for sh in shares]
        p = self.cfg.input_dropout if table.can_drop(ids) else 0.0
        drop = None if not p else (
            [input_dropout_seed(self.cfg.seed, epoch, plan.stream, s) for s in steps], p)
        xs = table.gather_all(ids, drop)
        ready = [self.assemble(epoch, s, sd, bl, sh, x, stager)
                 for s, sd, bl, sh, x in zip(steps, seeds, blocks, shares, xs)]
        for b in ready:
            b.x_dropout = p or None
        stats.sampler_s = time.perf_counter() - t0
        return _Macro(ready, stats)

    # ------------------------------------------------------------------ what this rank runs
    #: whether this rank's stats count the sampled edges and input nodes (a group of ranks
    #: sharing one minibatch counts them once)
    counts_sampling = True

    def share(self, blocks: List[Block]):
        """This rank's part of one minibatch: here all of it (``input_ids``: the feature rows
        it needs). A group of ranks running one minibatch overrides this."""
        return _Whole(blocks[0].src_ids)

    def assemble(self, epoch: int, step: int, seeds: np.ndarray, blocks: List[Block], share,
                 x: torch.Tensor, stager: Stager) -> ReadyBatch:
        """The ready minibatch: operators of the blocks, input features ``x`` (the rows of
        ``share.input_ids``, gathered for the whole macrobatch at once), seed labels (on the
        training device, through ``stager``)."""
        st = self.store
        y = self.labels[torch.from_numpy(st.local_index[seeds].astype(np.int64))]
        ops = [stager.operator_to_device(op) for op in block_operators(
            blocks, transpose=[i > 0 or i in self._transposes_needed
                               for i in range(len(blocks))],
            on_demand=self._transposes_needed.add)]
        return ReadyBatch(epoch, step, seeds, blocks, ops,
                          stager.to_device(x), stager.to_device(y))


def lower_thread_priority(nice: int) -> bool:
    """Give the calling thread (alone) OS niceness ``nice`` (Linux: a thread is a task of its
    own to ``setpriority``); whether it was set. Never raises: elsewhere, or where the call is
    refused, the thread keeps its priority. A thread cannot raise its priority back without
    privileges, so only sampler workers, which end with the service, call this."""
    if nice <= 0 or not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
        return False
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) >= nice:
            return False  # already as low (a niced run)
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (OSError, AttributeError):
        return False
    return True


@dataclass
class _Whole:
    input_ids: np.ndarray


def _sent_bytes(comm):
    """(feature-row bytes, all bytes) this worker's communicator has sent so far."""
    if comm is None:
        return 0, 0
    return (sum(b for (axis, phase), b in comm.bytes.items() if phase == "features"),
            comm.total_bytes())
