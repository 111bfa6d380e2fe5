"""The contracts between gnnpar's layers, written as code (``docs/architecture.md`` draws them).

- :class:`Runtime` — what the full-batch loop (:func:`gnnpar.training.trainer.fit`) trains on:
  :class:`gnnpar.training.serial.SerialRuntime` and
  :class:`gnnpar.training.distributed.DistRuntime`.
- :class:`MiniBatchEngine` — how a mini-batch step runs its blocks and combines gradients
  (:func:`gnnpar.training.minibatch_loop.fit_minibatch`):
  :class:`~gnnpar.training.minibatch_loop.DataParallel` and
  :class:`~gnnpar.sampling.grouped.GroupEngine`.
- :class:`ShardRows` / :class:`Shard` — the rows of Â a kernel builder reads, and one rank's
  part of a dataset as partitioners write it (:class:`gnnpar.partitioners.shard_build.Shard`).
- :class:`CommStats` — one epoch's communication, the one shape every runtime and engine
  returns.
- :class:`Reducer` — the collectives a training loop itself needs (metric sums and maxima,
  the gradient sum), one implementation for every runtime and engine.
- :class:`Operator` / :class:`EdgeOperator` — what a layer receives: the aggregation
  ``op(h)`` = Â·h, and the per-edge operations an attention layer asks ``op.edges()`` for.
- :class:`LayerOps` — what a model's ``forward(ops, x)`` receives, one type whatever the run.
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Protocol, Sequence, Union, runtime_checkable

import numpy as np
import torch

from gnnpar.kernels.comm import Comm

#: the node splits every dataset, shard and log uses, in this order
SPLITS = ("train", "val", "test")


class CommStats(NamedTuple):
    """Bytes sent (summed over the ranks it covers), bytes of the busiest rank, *exposed*
    seconds (computation held up by a collective: blocked in one, or, on a GPU, the compute
    stream waiting for one) and total seconds (every collective from issue to completion,
    overlapped with computation or not) — since the previous call — and ``timing``, what
    measured the seconds (:attr:`gnnpar.kernels.comm.Comm.timing`: ``host``, ``cuda_events``,
    ``none`` when no collective was timed). An engine reports its own rank's
    (``bytes == bytes_max_rank``); a runtime reports the world's (seconds of the slowest
    rank)."""

    bytes: int = 0
    bytes_max_rank: int = 0
    seconds: float = 0.0
    total_seconds: float = 0.0
    timing: str = "none"


class Reducer:
    """Collectives over ``axes`` of ``comm`` for the training loops; identities when ``comm``
    is None or the axes hold one rank.

    ``sum``/``max``: small metric tensors, sent as control traffic (not counted: they are not
    the algorithm's). ``sync_grads``: the parameters' gradients summed over the axes in one
    flat all-reduce, phase ``grad_sync`` (counted). ``missing="zeros"`` (mini batch, where a
    step may leave a parameter without a gradient on one rank only): such a parameter
    contributes zeros, so every rank reduces the same elements; ``missing="skip"`` (full
    batch, where every rank's gradients cover the same parameters): it is left out and keeps
    no gradient, as in a serial run.
    """

    def __init__(self, comm: Optional[Comm] = None, axes=(), missing: str = "zeros"):
        if missing not in ("zeros", "skip"):
            raise ValueError(f"missing must be 'zeros' or 'skip', got {missing!r}")
        self.comm, self.axes, self.missing = comm, axes, missing
        self.world = 1 if comm is None else len(comm.grid.ranks_of(axes))

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.world == 1 else self.comm.reduce_control(t, self.axes)

    def max(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.world == 1 else self.comm.reduce_control(t, self.axes, "max")

    def max_int(self, value: int) -> int:
        return int(self.max(torch.tensor([float(value)], dtype=torch.float64))[0])

    def sync_grads(self, params) -> None:
        if self.world == 1:
            return
        params = [p for p in params if p.grad is not None or self.missing == "zeros"]
        if not params:
            return
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        with self.comm.in_phase("grad_sync"):
            self.comm.all_reduce(flat, self.axes)
        offset = 0
        for p in params:
            g = flat[offset:offset + p.numel()].view_as(p)
            p.grad = g.clone() if p.grad is None else p.grad.copy_(g)
            offset += p.numel()


@runtime_checkable
class EdgeOperator(Protocol):
    """The per-edge operations an attention layer uses, over the edges of Â's structure
    (in full batch A' + I), numbered in CSR order so per-edge tensors are ``(E, heads)``
    (:mod:`gnnpar.kernels.edge_ops` has the details and :func:`~gnnpar.kernels.edge_ops.
    edge_softmax`, built from them):

    - ``at_src(s)``: ``s`` (num_src, H) → (E, H), each edge's source row;
    - ``at_dst(d)``: ``d`` (num_dst, H) → (E, H), each edge's destination row;
    - ``row_max(e)``: (E, H) → (num_dst, H), each row's largest value, no gradient;
    - ``row_sum(e)``: (E, H) → (num_dst, H), with gradient;
    - ``spmm(h, w)``: ``h`` (num_src, H, F) aggregated with edge values ``w`` (E, H) →
      (num_dst, H, F), gradients to both."""

    num_dst: int
    num_src: int
    num_edges: int

    def at_src(self, s: torch.Tensor) -> torch.Tensor: ...

    def at_dst(self, d: torch.Tensor) -> torch.Tensor: ...

    def row_max(self, e: torch.Tensor) -> torch.Tensor: ...

    def row_sum(self, e: torch.Tensor) -> torch.Tensor: ...

    def spmm(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Operator(Protocol):
    """The aggregation a layer receives as ``op``, whatever the algorithm or mode (the serial
    runtime's local CSR, every distributed algorithm's operator, a sampled block's):

    - ``op(h)``: Â·h with autograd, ``h`` (num_src, F) → (num_dst, F), for this rank's rows;
    - ``num_dst``: the destination rows, which are the first ``num_dst`` rows of ``h``
      (``num_dst == num_src`` in full batch; fewer in a sampled bipartite block);
    - ``num_src``: the rows ``h`` must have;
    - ``edges()``: the :class:`EdgeOperator` over the same edges (attention layers).

    Which Â (``gcn``, ``mean``, ``sum``) is the model's ``norm`` (or its layers')."""

    num_dst: int
    num_src: int

    def __call__(self, h: torch.Tensor) -> torch.Tensor: ...

    def edges(self) -> EdgeOperator: ...


class LayerOps:
    """The operators of a model's layers, one type whatever the run: ``ops[i]`` is layer i's.

    Full batch on ``serial``, ``1d``, ``1d-halo``, ``1.5d`` and ``2d`` gives one operator that
    serves every layer (``ops[i]`` is it for any i); ``3d``/``4d`` give one a layer (their grid
    axes rotate from layer to layer) and mini batch one sampled block a layer, outermost
    (input layer) first. A model indexes by layer and never needs to know which: the
    trainers hand every model (``gnnpar.nn.models.GNN`` and a ``--model package.module:factory``
    one alike) a ``LayerOps``. ``layers``: the operators' count when there is one a layer,
    else None. Made from an operator, a list of them, or another ``LayerOps`` (whose
    ``input_dropout`` it keeps unless given).

    ``input_dropout``: the drop probability the input features already went through
    (inverted dropout by the mini-batch sampler as it assembled the minibatch,
    :mod:`gnnpar.sampling.service`), so a model must not drop them again; None when they
    did not. :class:`gnnpar.nn.models.GNN` honours it; a model of one's own is never handed
    dropped features (the sampler drops them only for ``GNN``)."""

    def __init__(self, ops, input_dropout: Optional[float] = None):
        if isinstance(ops, LayerOps):
            if input_dropout is None:
                input_dropout = ops.input_dropout
            ops = ops._ops
        self._ops = list(ops) if isinstance(ops, (list, tuple)) else ops
        self.input_dropout = input_dropout

    @property
    def layers(self) -> Optional[int]:
        return len(self._ops) if isinstance(self._ops, list) else None

    def __getitem__(self, i: int):
        if not isinstance(self._ops, list):
            return self._ops
        if not -len(self._ops) <= i < len(self._ops):
            raise IndexError(f"the run made {len(self._ops)} operators (one a layer: --layers "
                             f"{len(self._ops)}) and the model asked for layer {i}: the "
                             "model's layer count must equal --layers")
        return self._ops[i]


@runtime_checkable
class Runtime(Protocol):
    """This rank's rows and the collectives :func:`gnnpar.training.trainer.fit` needs.

    ``op``: the aggregation operator handed to the model (one, or one per layer);
    ``x`` (n_local, f), ``y`` (n_local,), ``masks``: :data:`SPLITS` → bool (n_local,).
    """

    op: Union[Operator, Sequence[Operator]]
    x: torch.Tensor
    y: torch.Tensor
    masks: Dict[str, torch.Tensor]

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a small tensor over every rank (identity serially)."""

    def all_reduce_max(self, value: int) -> int:
        """The largest ``value`` of any rank."""

    def sync_grads(self, params) -> None:
        """Sum each parameter's gradient over the ranks that share it."""

    def comm_stats(self) -> CommStats:
        """The world's communication since the last call (zeros serially)."""

    def start_pass(self) -> None:
        """A forward pass begins (a runtime reusing SpMM outputs rewinds them)."""


@runtime_checkable
class MiniBatchEngine(Protocol):
    """How a sampled minibatch's blocks run and how gradients are combined."""

    def operators(self, batch) -> Sequence:
        """One operator per layer for a :class:`~gnnpar.sampling.service.ReadyBatch`."""

    def sync_grads(self, params) -> None:
        """Sum gradients over every rank (zeros for a parameter without one)."""

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce a small metric tensor over every rank (uncounted)."""

    def comm_stats(self) -> CommStats:
        """This rank's training communication since the last call."""


@runtime_checkable
class ShardRows(Protocol):
    """The rows of Â a kernel builder reads (a partitioner's shard, or a sampled block's
    :class:`~gnnpar.kernels.bipartite.BlockShard`).

    Rows: ``n_local`` of ``n_global``, global ids ``global_ids`` (n_local,). CSR over them:
    ``indptr`` (n_local+1,), ``indices`` into [local rows, then ``halo_ids`` grouped by owner
    rank], ``values``: normalisation → (nnz,) float32. Halo plan: ``recv_counts``/
    ``send_counts`` (P,), ``send_local`` (Σ send,) local rows to send; ``meta``: where the
    rows came from (a partition: method, seed, parts, fingerprint).
    """

    n_local: int
    n_global: int
    global_ids: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    values: Dict[str, np.ndarray]
    halo_ids: np.ndarray
    recv_counts: np.ndarray
    send_counts: np.ndarray
    send_local: np.ndarray
    meta: dict


@runtime_checkable
class Shard(ShardRows, Protocol):
    """One rank's part of a dataset (:class:`gnnpar.partitioners.shard_build.Shard`, written by
    ``gnnpar-partition`` and memory-mapped by the ranks): its rows plus their data —
    ``x`` (n_local, f), ``y`` (n_local,), ``train_mask``/``val_mask``/``test_mask``
    (n_local,) bool, ``num_classes``."""

    x: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
