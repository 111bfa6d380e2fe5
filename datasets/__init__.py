"""Graph data for gnnpar (imported as ``gnnpar.datasets``).

``load_dataset(spec)`` turns one spec string into a validated :class:`Graph`:

- ``rmat:scale=S,ef=E[,feat=F,classes=C,seed=K]``
- ``sbm:n=N,blocks=B,p_in=P,p_out=Q[,feat=F,noise=Z,seed=K]``
- ``npz:PATH``
- ``ogb:DIR``
- ``cache:DIR`` (a binary cache written by :func:`save_cache`)
"""
from .errors import InputError
from .graph import Graph, split_masks

__all__ = ["InputError", "Graph", "split_masks"]
try:  # filled by the dataset modules
    from .spec import DEFAULT_SPEC, load_dataset, parse_spec  # noqa: F401
    from .cache import load_cache, save_cache  # noqa: F401
    from .interop import from_dgl, from_pyg, to_pyg  # noqa: F401
    __all__ += ["DEFAULT_SPEC", "load_dataset", "parse_spec", "load_cache", "save_cache",
                "from_dgl", "from_pyg", "to_pyg"]
except ImportError:  # pragma: no cover - during bring-up only
    pass
