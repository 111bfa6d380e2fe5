"""GNN layers whose aggregation is "the SpMM the runtime provides".

A layer never touches the graph itself: it receives an *aggregation operator* ``op``
(:class:`gnnpar.interfaces.Operator`) with

- ``op(h)`` → Â·h with autograd (shape ``(op.num_dst, f)`` from ``(op.num_src, f)``), and
- ``op.num_dst`` — the first ``num_dst`` rows of ``h`` are the destination nodes themselves
  (equal to ``num_src`` in full-batch training; smaller in a sampled bipartite block);
- ``op.edges()`` — the per-edge operations of an attention layer.

The serial runtime passes a :class:`gnnpar.kernels.local.SparseOperator`; the distributed
runtimes pass operators that run 1D/1.5D/2D/3D SpMM over a process grid; mini-batch training
passes one sampled block per layer. The same model code runs on all of them unchanged.

Under ``--precision bf16`` (:mod:`gnnpar.nn.precision`) the forward pass runs in
:func:`torch.autocast`: the linear layers compute in bf16 and the operators take bf16
features. The float32 biases are cast to the activations' dtype where they are added
(:func:`gnnpar.nn.dropout.add_bias`), so the activations stay bf16 from layer to layer instead of
being promoted back to float32 by an fp32 + bf16 sum; in an fp32 run that cast is the identity.

A layer may also offer ``unbiased(op, h)`` (its output without the bias) and ``bias``: where
the next ReLU + dropout run as one GPU pass, :class:`GNN` hands the bias over to that pass
(:func:`gnnpar.nn.dropout.fuses_bias`); elsewhere it calls the layer as usual. GCN and SAGE do.

Which Â a model wants is its ``norm`` attribute (``"gcn"``, ``"mean"`` or ``"sum"``; see
``gnnpar.datasets.normalize``), taken from its layer class in a :class:`GNN`.

A user's layer joins :class:`GNN` with one line, :func:`register_layer`, and trains as
``--model module:Class`` (``--model-arg`` values go to its constructor)::

    @gnnpar.register_layer
    class SumMLP(torch.nn.Module):
        norm = "sum"
        def __init__(self, f_in, f_out):
            super().__init__()
            self.mlp = torch.nn.Sequential(torch.nn.Linear(f_in, f_out), torch.nn.ReLU())
        def forward(self, op, h):
            return self.mlp(op(h) + h[:op.num_dst])
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.nn import functional as F

from gnnpar.datasets import InputError
from gnnpar.datasets.normalize import KINDS

from gnnpar.nn.dropout import add_bias, bias_relu_dropout, dropout, fuses_bias, relu_dropout
from gnnpar.nn.model_registry import built_in, facts
# the fused SAGE layer draws its mask as they do
from gnnpar.nn.dropout import _check, _seed, _units
from gnnpar.nn.attention import GAT_HEADS, GATLayer, gat_layers
from gnnpar.nn.bf16_dense import Linear, linear
from gnnpar.nn.custom_model import TRIAL_F_IN, TRIAL_F_OUT, build_custom, is_custom, load_factory
from gnnpar.interfaces import LayerOps, Operator
from gnnpar.kernels import sage_fused
from gnnpar.nn.product_order import aggregate_first_op


class GCNLayer(nn.Module):
    """GCN layer (Kipf & Welling 2017): Z = Â · H · W + b, Â = D̃^{-1/2}(A+I)D̃^{-1/2}.

    Â·(H·W) = (Â·H)·W, so the SpMM runs at the narrower of ``f_in`` and ``f_out``.

    Shapes: H (num_src, f_in) → Z (num_dst, f_out).
    """

    norm = "gcn"

    def __init__(self, f_in: int, f_out: int, bias: bool = True):
        super().__init__()
        self.lin = Linear(f_in, f_out, bias=False)
        # Glorot, as the GCN paper (and PyG's GCNConv): torch's Linear default draws a third
        # as wide on wide inputs, which slowed link training (docs/performance.md, "Link
        # prediction")
        nn.init.xavier_uniform_(self.lin.weight)
        self.bias = nn.Parameter(torch.zeros(f_out)) if bias else None

    def unbiased(self, op: Operator, h: torch.Tensor) -> torch.Tensor:
        """Â·H·W without the bias: on a GPU :class:`GNN` adds it in the same pass as the ReLU
        and dropout that follow (:func:`gnnpar.nn.dropout.bias_relu_dropout`)."""
        if aggregate_first_op(op, self.lin.in_features, self.lin.out_features):
            return self.lin(op(h))
        return op(self.lin(h))

    def forward(self, op: Operator, h: torch.Tensor) -> torch.Tensor:
        return add_bias(self.unbiased(op, h), self.bias)


class SAGELayer(nn.Module):
    """GraphSAGE layer, mean aggregation (Hamilton et al. 2017):
    Z = (D⁻¹A·H)·W_neigh + H_dst·W_root + b.

    On a local CSR operator on the CPU in float32 with autocast off
    (:func:`gnnpar.kernels.sage_fused.usable`: a sampled block's operator, or the serial
    runtime's) the layer is one autograd Function (:mod:`gnnpar.kernels.sage_fused`): the
    root term accumulated into Z in place, no zeros + copy for ``H[:num_dst]``'s gradient,
    and, given ``act``, the ReLU + dropout that follow in place on Z with the masks of
    :func:`gnnpar.nn.dropout.relu_dropout`. The same products as the unfused layer; only the
    root term's accumulation order differs (last bits). Everything else runs the unfused
    layer.

    ``forward(op, h, act=None)``: ``act = (p, training)`` ends the layer with
    ``relu_dropout(·, p, training)`` (what :class:`GNN` does after a hidden layer; it passes
    ``act`` only where the fused path runs, so a forward hook on a hidden layer then sees
    the activated output).

    Shapes: H (num_src, f_in) → Z (num_dst, f_out); H_dst = H[:num_dst].
    """

    norm = "mean"

    def __init__(self, f_in: int, f_out: int, bias: bool = True):
        super().__init__()
        self.lin_neigh = Linear(f_in, f_out, bias=bias)
        self.lin_root = Linear(f_in, f_out, bias=False)

    @property
    def bias(self):
        return self.lin_neigh.bias

    def unbiased(self, op: Operator, h: torch.Tensor) -> torch.Tensor:
        """Z without the bias (see :meth:`GCNLayer.unbiased`)."""
        return self._neigh(op, h, None) + self.lin_root(h[:op.num_dst])

    def fused(self, op: Operator, h: torch.Tensor) -> bool:
        """Whether ``self(op, h)`` runs as one fused Function (see the class docstring)."""
        return sage_fused.usable(op, h, self.lin_neigh.weight, self.lin_root.weight,
                                 self.bias)

    def forward(self, op: Operator, h: torch.Tensor, act: Optional[Tuple[float, bool]] = None
                ) -> torch.Tensor:
        if self.fused(op, h):
            epilogue = None if act is None else _epilogue(*act)
            return sage_fused.sage_block(op, h, self.lin_neigh.weight, self.lin_root.weight,
                                         self.bias, epilogue, self._aggregates_first(op))
        z = self._neigh(op, h, self.bias) + self.lin_root(h[:op.num_dst])
        return z if act is None else relu_dropout(z, *act)

    def _aggregates_first(self, op) -> bool:
        """Whether the neighbour product is (D⁻¹A·H)·W_neigh (else D⁻¹A·(H·W_neigh)): the
        cheaper order (:mod:`gnnpar.nn.product_order`; the narrower width in full batch). Both
        paths follow it."""
        return aggregate_first_op(op, self.lin_neigh.in_features, self.lin_neigh.out_features)

    def _neigh(self, op: Operator, h: torch.Tensor, bias) -> torch.Tensor:
        """(D⁻¹A·H)·W_neigh (+ ``bias`` unless None), the SpMM at the narrower width."""
        w = self.lin_neigh.weight
        if self._aggregates_first(op):
            return linear(op(h), w, bias)
        return add_bias(op(linear(h, w)), bias)


def _epilogue(p: float, training: bool) -> sage_fused.Epilogue:
    """The fused layer's epilogue for ``relu_dropout(·, p, training)``: ReLU alone, or ReLU
    and dropout with a seed drawn here — one draw, where :func:`relu_dropout` would draw it
    (nothing between the two points draws), rounded as it rounds p, so the same mask."""
    if not training or p == 0.0:
        return sage_fused.RELU
    _check(p)
    return (_seed(), *_units(p))


#: the layers a :class:`GNN` stacks, by ``--model`` name: gnnpar's, and a user's that
#: :func:`register_layer` added (keyed ``module:Class``, how ``--model`` names it)
LAYERS = {"gcn": GCNLayer, "sage": SAGELayer, "gat": GATLayer}  # gnnpar.nn.model_registry's
BUILT_IN = built_in()


def register_layer(cls: type) -> type:
    """Let :class:`GNN` stack ``cls``, a ``torch.nn.Module`` built as ``cls(f_in, f_out,
    **model_args)`` whose ``forward(op, h)`` is one layer (``op``: an
    :class:`~gnnpar.interfaces.Operator`). One line in the user's module —
    ``gnnpar.register_layer(MyLayer)``, or ``@gnnpar.register_layer`` on the class — and
    ``--model module:MyLayer`` trains a GNN of it: ReLU and dropout between its layers (in
    one pass with the bias where the layer offers ``unbiased`` and ``bias``, as GCN does), the
    mini-batch sampler's input dropout, every algorithm and mode. Its ``norm`` (class
    attribute; ``"gcn"`` when it has none) picks the Â. Returns ``cls``."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"register_layer takes a torch.nn.Module class, got {cls!r}")
    norm = getattr(cls, "norm", "gcn")
    if norm not in KINDS:
        raise ValueError(f"layer {cls.__qualname__}: norm {norm!r} is not one of "
                         f"{', '.join(KINDS)}")
    LAYERS[f"{cls.__module__}:{cls.__qualname__}"] = cls
    return cls

Ops = Union[Operator, Sequence[Operator], LayerOps]


class GNN(nn.Module):
    """A stack of layers with ReLU and dropout between them (where one GPU pass can do it, the
    bias add of a layer with ``unbiased`` and ``bias`` joins them:
    :func:`gnnpar.nn.dropout.fuses_bias`; where a SAGE layer runs fused on the CPU,
    :meth:`SAGELayer.fused`, the layer does them itself; elsewhere each layer adds its own
    bias, as always).

    ``forward(ops, x)``: ``ops`` is a :class:`~gnnpar.interfaces.LayerOps` (what the trainers
    hand every model; ``ops[i]`` is layer i's operator), or what makes one: an operator used
    by every layer, or a list of one a layer (3d/4d, mini-batch blocks, outermost first).

    ``kind``: a name in :data:`LAYERS` (gnnpar's layers, or a user's registered with
    :func:`register_layer`); ``layer_args`` go to every layer's constructor (a user layer's
    ``--model-arg`` values).

    ``kind="gat"`` (:mod:`gnnpar.nn.attention`): ``heads`` heads (default :data:`GAT_HEADS`),
    ``hidden`` a hidden layer's width in all (a multiple of ``heads``), ELU and dropout
    between layers as in the GAT paper, and ``attn_dropout`` (default ``dropout``) on the
    attention coefficients.
    """

    def __init__(self, kind: str, f_in: int, hidden: int, f_out: int, layers: int = 2,
                 dropout: float = 0.5, heads: Optional[int] = None,
                 attn_dropout: Optional[float] = None, layer_args: Optional[dict] = None):
        super().__init__()
        if kind not in LAYERS:
            raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(LAYERS)}")
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        if heads is not None and not facts(kind).attention:
            raise ValueError(f"heads are GAT's; model {kind!r} has none")
        if layer_args and kind in BUILT_IN:
            raise ValueError(f"model {kind!r} takes no layer arguments")
        layer = LAYERS[kind]
        self.kind, self.norm, self.dropout = kind, getattr(layer, "norm", "gcn"), dropout
        self.attn_dropout = dropout if attn_dropout is None else attn_dropout
        self.attention = facts(kind).attention
        if self.attention:
            self.layers = gat_layers(f_in, hidden, f_out, layers, heads or GAT_HEADS)
            return
        widths = [f_in] + [hidden] * (layers - 1) + [f_out]
        self.layers = nn.ModuleList(layer(a, b, **(layer_args or {}))
                                    for a, b in zip(widths[:-1], widths[1:]))

    def _input(self, ops: LayerOps, x: torch.Tensor) -> torch.Tensor:
        """The first layer's input: ``x`` after this model's dropout, or ``x`` itself when
        the sampler has dropped it already (``ops.input_dropout``, with this model's p)."""
        done = ops.input_dropout
        if done is None:
            return dropout(x, self.dropout, self.training)
        if not self.training or done != self.dropout:
            raise ValueError(f"the input features come dropped with p={done}, but the model "
                             f"{'evaluates' if not self.training else 'drops'} with "
                             f"p={self.dropout if self.training else 0}")
        return x

    def forward(self, ops: Ops, x: torch.Tensor) -> torch.Tensor:
        ops = LayerOps(ops)
        if ops.layers is not None and ops.layers != len(self.layers):
            raise ValueError(f"got {ops.layers} operators for {len(self.layers)} layers")
        h = self._input(ops, x)
        for i in range(len(self.layers)):
            h = self.layer_step(i, ops[i], h)
        return h

    def layer_step(self, i: int, op: Operator, h: torch.Tensor) -> torch.Tensor:
        """Layer ``i`` on ``op`` and its input ``h``, with what follows it inside the stack
        (a hidden layer's activation and the next layer's input dropout): ``forward`` is
        these steps one after another, and layer-wise inference (:mod:`gnnpar.infer.inference`)
        runs each over row chunks."""
        layer, last = self.layers[i], i == len(self.layers) - 1
        if self.attention:  # GAT: ELU between layers, as the GAT paper
            h = layer(op, h, (self.attn_dropout, self.training))
            return h if last else dropout(F.elu(h), self.dropout, self.training)
        if last:
            return layer(op, h)
        if hasattr(layer, "unbiased") and _inferring(self):
            return _bias_relu_in_place(layer.unbiased(op, h), layer.bias, h)
        if hasattr(layer, "unbiased") and fuses_bias(h, self.dropout, self.training):
            # the bias add, ReLU and the next layer's input dropout in one GPU pass
            return bias_relu_dropout(layer.unbiased(op, h), layer.bias, self.dropout,
                                     self.training)
        if isinstance(layer, SAGELayer) and layer.fused(op, h):
            # the layer, ReLU and the next layer's input dropout in one CPU Function
            return layer(op, h, (self.dropout, self.training))
        # ReLU, then the next layer's input dropout: one pass on CPUs
        return relu_dropout(layer(op, h), self.dropout, self.training)


def _inferring(model: nn.Module) -> bool:
    """Evaluation under :func:`torch.inference_mode` (:mod:`gnnpar.infer.inference`): nothing will
    differentiate a layer's output, so what follows the layer may overwrite it."""
    return not model.training and torch.is_inference_mode_enabled()


def _bias_relu_in_place(z: torch.Tensor, bias, h: torch.Tensor) -> torch.Tensor:
    """A hidden layer's :func:`add_bias` and ReLU in place on its product ``z``: the same
    values as the out-of-place ops (one add and one max each), without two more
    (rows × width) tensors to allocate and fault in; a ``z`` that shares ``h``'s memory is
    left alone. (The output layer keeps its out-of-place bias add: logits are never one of
    the runtime's reused product outputs.)"""
    if z.data_ptr() == h.data_ptr():
        return F.relu(add_bias(z, bias))
    if bias is not None:
        z.add_(bias.to(z.dtype))
    return z.relu_()


def build_model(kind: str, f_in: int, hidden: int, f_out: int, layers: int, dropout: float,
                heads: Optional[int] = None, attn_dropout: Optional[float] = None,
                model_args: Optional[dict] = None) -> nn.Module:
    """``--model``'s model: a :class:`GNN` of ``kind`` (``gcn``, ``sage``, ``gat``), or a
    user's ``package.module:name`` (imported here, :mod:`gnnpar.nn.custom_model`): a GNN of that
    layer where the module registered it (:func:`register_layer`), else what the factory
    returns. ``model_args`` (``--model-arg``) go to the user's layer or factory as keywords."""
    if not is_custom(kind):
        return GNN(kind, f_in, hidden, f_out, layers, dropout, heads, attn_dropout)
    target = load_factory(kind)
    if target not in LAYERS.values():
        return build_custom(kind, f_in, hidden, f_out, layers, dropout, model_args)
    LAYERS.setdefault(kind, target)  # the name ``--model`` gave it (a package re-export)
    try:
        return GNN(kind, f_in, hidden, f_out, layers, dropout, layer_args=model_args)
    except Exception as exc:  # noqa: BLE001 - the user's layer: one line, not a traceback
        raise InputError(f"--model {kind}: building the layer raised {type(exc).__name__}: "
                         f"{exc}") from None


def check_model(kind: str, hidden: int, layers: int, dropout: float,
                model_args: Optional[dict] = None) -> None:
    """Refuse (InputError) a user's ``--model`` that cannot give a model, before any data:
    one trial build with the run's ``hidden``/``layers``/``dropout``/``model_args`` and small
    stand-in widths."""
    build_model(kind, TRIAL_F_IN, hidden, TRIAL_F_OUT, layers, dropout,
                model_args=model_args)


def sampler_input_dropout(model, device) -> float:
    """The input dropout the mini-batch sampler does for ``model`` on a CPU run, as it
    copies the features (:mod:`gnnpar.sampling.service`): a :class:`GNN`'s p (it skips its
    own then, :class:`~gnnpar.interfaces.LayerOps`); 0 for a model of one's own, and on a
    GPU, whose one-pass dropout there is cheap."""
    if not isinstance(model, GNN) or torch.device(device).type != "cpu":
        return 0.0
    return float(model.dropout)
