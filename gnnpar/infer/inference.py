"""Whole-graph inference with trained weights: every row's logits and, if asked, the node
embeddings of one layer — the computation behind ``gnnpar-predict``, ``gnnpar.predict`` and
``gnnpar-train --save-predictions`` (``docs/architecture.md``, "Inference").

Two ways, the same numbers up to summation order:

- :func:`forward_rows`: the model's forward pass on a full-batch runtime (serial or any
  ``--algo``), as the trainer's evaluation runs it;
- :func:`layerwise`: layer by layer over all rows in chunks of ``batch`` rows, each chunk
  with its rows' full neighbourhood (a bipartite block: the chunk's rows first, then their
  neighbours), so at any time one layer's input and output are held, never a sampled
  neighbourhood's growth. On several ranks each rank runs its own rows and receives the rows
  its neighbourhoods touch once per layer (``gather``: the 1D halo exchange).

Both run under :func:`torch.inference_mode` in evaluation mode (no dropout, no autograd
graph; a layer's input is freed once the next layer has its output) and under the run's
``--precision`` (:mod:`gnnpar.nn.precision`); logits come back as float32.

The embeddings of layer ``K`` are the rows entering layer ``K`` of the model's ``layers``
(the output of layer ``K - 1`` after its activation), ``1 <= K <= len(layers) - 1``; the
default is the last: the input of the output layer of a :class:`~gnnpar.nn.models.GNN`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Optional, Tuple

import numpy as np
import torch

from gnnpar.datasets import InputError

from gnnpar.training.distributed import drop_row_pages
from gnnpar.interfaces import LayerOps
from gnnpar.nn.models import GNN
from gnnpar.nn.precision import autocast, matmuls
from gnnpar.sampling.blocks import BlockOperator, Relabeler

Rows = Tuple[torch.Tensor, Optional[torch.Tensor]]  #: (logits, embeddings or None)


def embeddings_layer(model, asked: Optional[int]) -> int:
    """The layer whose input ``--embeddings-layer`` names (``asked``; None: the last), checked
    against ``model``; an InputError naming the valid range otherwise."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise InputError("--embeddings reads the rows entering one of the model's layers, but "
                         f"{type(model).__name__} has no `layers` ModuleList")
    top = len(layers) - 1
    if top < 1:
        raise InputError("--embeddings: a model of one layer has no hidden layer whose output "
                         "could be an embedding")
    k = top if asked is None else int(asked)
    if not 1 <= k <= top:
        raise InputError(f"--embeddings-layer {k} is out of range: this model's layers give "
                         f"embeddings 1..{top} (the input of layer K)")
    return k


@contextmanager
def _captured_input(model, k: Optional[int]):
    """A dict whose ``"h"`` is, after a forward pass, the input of ``model.layers[k]``."""
    seen = {}
    if k is None:
        yield seen
        return
    handle = model.layers[k].register_forward_pre_hook(
        lambda module, args: seen.__setitem__("h", args[1]))
    try:
        yield seen
    finally:
        handle.remove()


def forward_rows(model, runtime, precision: str = "fp32", layer: Optional[int] = None) -> Rows:
    """This rank's rows of ``model(x)`` on a full-batch runtime (``runtime.op``,
    ``runtime.x``) and, with ``layer``, the rows entering that layer. Hidden layers' bias
    and ReLU run in place on their products (:class:`~gnnpar.nn.models.GNN`), so on a runtime
    that reuses its product outputs (the serial one on a CPU) the embeddings are valid until
    its next pass."""
    model.eval()
    start = getattr(runtime, "start_pass", None)
    with torch.inference_mode(), matmuls(precision), autocast(precision, runtime.x.device):
        if start is not None:
            start()
        ops = LayerOps(runtime.op)
        if isinstance(model, GNN):  # step by step: a fused GPU epilogue skips forward hooks
            h, emb = runtime.x, None
            for i in range(len(model.layers)):
                if i == layer:
                    emb = h
                with _input_pages_dropped(model.layers[i], h if i == 0 else None):
                    h = model.layer_step(i, ops[i], h)
            return h.float(), emb
        with _captured_input(model, layer) as seen:
            out = model(ops, runtime.x)
        return out.float(), seen.get("h")


@contextmanager
def _input_pages_dropped(layer: torch.nn.Module, x: Optional[torch.Tensor]):
    """Run ``layer`` with ``x``'s file pages (rows mapped from a shard:
    :func:`~gnnpar.training.distributed.drop_row_pages`) handed back after each of its linear maps
    and at its end: the first layer's dense product reads every input row once, and the
    input's pages need not stay resident beside that product's output, the halo rows and the
    layer's output (a read after a drop maps the page again from the page cache)."""
    if x is None:
        yield
        return
    handles = [m.register_forward_hook(lambda *args: drop_row_pages(x))
               for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        drop_row_pages(x)


def check_layerwise(model) -> None:
    """Refuse layer-wise inference for a model that is one forward pass (a user's own)."""
    if not isinstance(model, GNN):
        raise InputError("layer-wise inference (--batch-size) runs gnnpar's own models "
                         f"layer by layer; {type(model).__name__} is one forward pass: drop "
                         "--batch-size to run it on the whole graph")


def layerwise(model, structure, x: torch.Tensor, batch: int, precision: str = "fp32",
              layer: Optional[int] = None,
              gather: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> Rows:
    """``model(x)`` over this rank's ``n`` rows, layer by layer in chunks of ``batch`` rows.

    ``structure``: ``(indptr, indices, values)``, Â's rows of this rank as numpy arrays, a
    column < n one of its own rows and column n + j row j of ``gather(h)`` (the rows other
    ranks own that these rows read; None on one process). Only a :class:`GNN` is run this
    way: its layers are steps of their own (:meth:`GNN.layer_step`)."""
    check_layerwise(model)
    if batch < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch}")
    indptr, indices, values = (np.asarray(a) for a in structure)
    n = indptr.shape[0] - 1
    device = x.device
    model.eval()
    h, emb = x, None
    with torch.inference_mode(), matmuls(precision), autocast(precision, device):
        for i in range(len(model.layers)):
            if i == layer:
                emb = h
            ext = h if gather is None else torch.cat([h, gather(h).to(h.dtype)])
            relabel = Relabeler(ext.shape[0])
            out = None
            for a in range(0, max(n, 1), batch):  # one empty chunk on a rank of no rows
                b = min(n, a + batch)
                op, rows = _chunk(indptr, indices, values, a, b, ext.shape[0], relabel,
                                  device)
                z = model.layer_step(i, op, _chunk_input(ext, a, rows))
                if out is None:
                    out = torch.empty((n, z.shape[1]), dtype=z.dtype, device=device)
                out[a:b] = z
            h = out
    return h.float(), emb


def _chunk(indptr, indices, values, a: int, b: int, width: int, relabel: Relabeler, device):
    """Rows ``a:b`` of Â as a bipartite block whose first ``b - a`` source rows are those
    rows themselves (the layers read ``h[:num_dst]``), and what the block's input is: the
    source ids (int64 array), or None for "all of ``ext``, rolled so row ``a`` comes first".

    A chunk whose edges reach at least half of the ``width`` input rows (large chunks, hub
    rows) takes every input row in rolled order: one contiguous copy, no relabelling; a
    smaller one takes only its neighbourhood (relabelled, gathered). The same products and
    sums either way."""
    lo, hi = int(indptr[a]), int(indptr[b])
    cols = indices[lo:hi]
    if 2 * (hi - lo + b - a) >= width:
        local, rows, n_src = (np.asarray(cols, np.int64) - a) % width, None, width
    else:
        rows, local = relabel(np.arange(a, b, dtype=np.int64), cols)
        n_src = rows.shape[0]
    op = BlockOperator(indptr[a:b + 1] - lo, local, values[lo:hi], (b - a, n_src), device,
                       transpose=False)
    return op, rows


def _chunk_input(ext: torch.Tensor, a: int, rows) -> torch.Tensor:
    """The block's input rows (:func:`_chunk`)."""
    if rows is not None:
        return ext.index_select(0, torch.from_numpy(rows).to(ext.device))
    return ext if a == 0 else torch.cat([ext[a:], ext[:a]])
