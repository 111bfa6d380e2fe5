"""What each ``--model`` is, in one table, as :mod:`gnnpar.kernels.algorithms` is for
``--algo``: the facts every tool reads about a model by name (the flags, the cost model, the
checkpoint identity, the model file), so none of them compares names of its own.

The layer classes are in :data:`gnnpar.nn.models.LAYERS`; this module holds no torch code, so the
command-line checks and ``gnnpar-plan`` read it without building a model. A user's model
(``package.module:name``: a factory, or a layer class its module registers with
:func:`gnnpar.nn.models.register_layer`) has :data:`USER`'s facts: no attention settings, and the
cost model estimates it as GCN (one product a layer at the narrower width)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class ModelFacts:
    """``norm``: the Â its layers read (None: the model's own, a user's); ``attention``: it
    takes ``--heads``/``--attn-dropout`` and reads per-edge values (``op.edges()``), which
    the checkpoint identity and the model file record; ``cost``: the cost model's kind
    (:mod:`gnnpar.kernels.cost_model`; an attention model's is made with its heads);
    ``weight_sets``: weight matrices a layer holds from its input to its output width (SAGE:
    the root's and the neighbours'), which the flag checks count in the model's size."""

    norm: "str | None"
    attention: bool = False
    cost: str = "gcn"
    weight_sets: int = 1


#: gnnpar's own models, in ``--help`` order
MODELS: Dict[str, ModelFacts] = {
    "gcn": ModelFacts(norm="gcn", cost="gcn"),
    "sage": ModelFacts(norm="mean", cost="sage", weight_sets=2),
    "gat": ModelFacts(norm="gcn", attention=True, cost="gat"),
}
#: a user's model or layer
USER = ModelFacts(norm=None)


def facts(model: str) -> ModelFacts:
    """The facts of ``--model`` ``model``: a built-in one's, else :data:`USER`'s."""
    return MODELS.get(model, USER)


def built_in() -> tuple:
    """The names of gnnpar's own models (``--model`` choices besides a user's)."""
    return tuple(MODELS)
