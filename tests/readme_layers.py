"""The README's GIN layer and the user guide's ``DotAttention`` layer as printed, each run in
this module so the README's own ``@gnnpar.register_layer`` line registers GIN and one line
here registers the attention layer: ``GNN(GIN_KIND, ...)`` and ``GNN(ATTENTION_KIND, ...)``
stack them as gnnpar's own layers (``tests/test_model_seam.py``). Imported by every rank of
a spawned world, so each registers them itself."""
import torch

import gnnpar

from .cli_util import readme_gin
from .dist_cases import readme_block


def _run(code: str, name: str):
    space = {"__name__": __name__, "torch": torch}
    exec(code, space)  # noqa: S102 - the documentation's own example, as printed
    return space[name]


GINLayer = _run(readme_gin(), "GINLayer")  # registered by the README's decorator
DotAttention = gnnpar.register_layer(_run(readme_block("class DotAttention"), "DotAttention"))
GIN_KIND = f"{__name__}:GINLayer"
ATTENTION_KIND = f"{__name__}:DotAttention"
