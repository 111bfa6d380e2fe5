"""Graph data for gnnpar (imported as ``gnnpar.datasets``).

``load_dataset(spec)`` turns one spec string into a validated :class:`Graph`:

- ``rmat:scale=S,ef=E[,feat=F,classes=C,seed=K,a=A,b=B,c=C,permute=true]``
- ``sbm:n=N,blocks=B,p_in=P,p_out=Q[,feat=F,noise=Z,seed=K]``
- ``npz:PATH``
- ``ogb:DIR[,split=NAME]``
- ``cache:DIR`` (a binary cache written by :func:`save_cache`)
"""
from .errors import InputError
from .graph import Graph, split_masks
from .cache import load_cache, save_cache
from .interop import from_dgl, from_pyg, to_pyg
from .readers import graph_from_arrays, read_npz, read_ogb
from .spec import DEFAULT_SPEC, load_dataset, parse_spec
from .synthetic import rmat, sbm

__all__ = ["InputError", "Graph", "split_masks", "DEFAULT_SPEC", "load_dataset", "parse_spec",
           "load_cache", "save_cache", "from_dgl", "from_pyg", "to_pyg", "graph_from_arrays",
           "read_npz", "read_ogb", "rmat", "sbm"]
