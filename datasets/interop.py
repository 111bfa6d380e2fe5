"""Conversion to and from PyTorch Geometric ``Data`` and DGL graphs.

Edge direction follows both libraries' default message flow: an edge (source u, target v) is
stored in v's CSR row (v aggregates from u). ``to_pyg`` lists the edges in CSR order, so
``from_pyg(to_pyg(g))`` returns ``g`` exactly (same arrays, same fingerprint).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .errors import InputError
from .graph import Graph
from .readers import graph_from_arrays

_MASKS = ("train_mask", "val_mask", "test_mask")


def _numpy(value, what: str) -> np.ndarray:
    """A torch tensor or array-like as a numpy array (CPU copy if needed)."""
    if value is None:
        raise InputError(f"the graph has no {what}")
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def from_pyg(data, num_classes: Optional[int] = None, directed: bool = True) -> Graph:
    """Build a :class:`Graph` from a ``torch_geometric.data.Data``.

    Reads ``edge_index`` (2, E), ``x`` (N, F), ``y`` (N,) or (N, 1), ``train_mask``,
    ``val_mask``, ``test_mask`` (N,) and, if present, ``edge_weight`` (E,). ``num_classes``
    defaults to ``data.num_classes`` if set (``to_pyg`` sets it), else ``y.max() + 1``.
    Edges are kept as given (``directed=True``; PyG datasets usually store both directions
    already); pass ``directed=False`` to add the reverse edges. Duplicates are merged.
    """
    store = data.to_dict() if hasattr(data, "to_dict") else dict(data)
    missing = [k for k in ("edge_index", "x", "y") + _MASKS if store.get(k) is None]
    if missing:
        raise InputError(f"PyG data has no '{missing[0]}' "
                         f"(needs edge_index, x, y, {', '.join(_MASKS)})")
    if num_classes is None and store.get("num_classes") is not None:
        num_classes = int(store["num_classes"])
    weight = store.get("edge_weight")
    return graph_from_arrays(_numpy(store["edge_index"], "edge_index"), _numpy(store["x"], "x"),
                             _numpy(store["y"], "y"), [_numpy(store[k], k) for k in _MASKS],
                             num_classes, directed=directed,
                             edge_weight=None if weight is None else _numpy(weight, "edge_weight"),
                             name=str(store.get("name") or "pyg"), meta={"source": "pyg"})


def to_pyg(graph: Graph):
    """A ``torch_geometric.data.Data`` holding copies of the graph's arrays.

    ``edge_index`` (2, m) int64 in CSR order (row 0 = column = source, row 1 = row = target),
    ``x`` float32, ``y`` int64, the masks, ``edge_weight`` if the graph has one, and the plain
    attributes ``num_classes`` and ``name``.
    """
    import torch
    from torch_geometric.data import Data

    src, dst = graph.edges()
    fields = {"edge_index": torch.from_numpy(np.stack([src, dst])),
              "x": torch.from_numpy(np.array(graph.x, dtype=np.float32)),
              "y": torch.from_numpy(np.array(graph.y, dtype=np.int64)),
              "num_nodes": graph.num_nodes, "num_classes": int(graph.num_classes),
              "name": graph.name}
    for key in _MASKS:
        fields[key] = torch.from_numpy(np.array(getattr(graph, key), dtype=bool))
    if graph.edge_weight is not None:
        fields["edge_weight"] = torch.from_numpy(np.array(graph.edge_weight, dtype=np.float32))
    return Data(**fields)


def from_dgl(g, num_classes: Optional[int] = None, directed: bool = True) -> Graph:
    """Build a :class:`Graph` from a homogeneous ``dgl.DGLGraph``.

    Reads ``g.edges()`` (source, target), ``g.ndata['feat']`` (N, F), ``g.ndata['label']``
    (N,), ``g.ndata['train_mask' | 'val_mask' | 'test_mask']`` and, if present,
    ``g.edata['weight']`` or ``g.edata['w']`` (E,). Edges are kept as given unless
    ``directed=False``.

    DGL is imported here, not at module import: current DGL wheels pin older torch versions
    and cannot be installed beside the torch gnnpar uses, so it is an optional extra (use a
    separate environment, or convert the DGL graph to PyG / npz there).
    """
    try:
        import dgl  # noqa: F401  (checked so that the error below is about DGL, not the graph)
    except ImportError:
        raise InputError("from_dgl needs DGL: pip install dgl (DGL wheels need an older torch than "
                         "gnnpar's; use a separate environment, or save the graph as npz "
                         "there)") from None
    if not getattr(g, "is_homogeneous", True):
        raise InputError("from_dgl takes a homogeneous graph; "
                         "convert with dgl.to_homogeneous first")
    ndata = g.ndata
    missing = [k for k in ("feat", "label") + _MASKS if k not in ndata]
    if missing:
        raise InputError(f"DGL graph has no ndata['{missing[0]}'] "
                         f"(needs feat, label, {', '.join(_MASKS)})")
    src, dst = g.edges()
    edge_index = np.stack([_numpy(src, "edges"), _numpy(dst, "edges")])
    weight = None
    for key in ("weight", "w"):
        if key in g.edata:
            weight = _numpy(g.edata[key], f"edata['{key}']")
            break
    if int(g.num_nodes()) != int(ndata["feat"].shape[0]):
        raise InputError(f"DGL graph has {int(g.num_nodes())} nodes but ndata['feat'] has "
                         f"{ndata['feat'].shape[0]} rows")
    return graph_from_arrays(edge_index, _numpy(ndata["feat"], "feat"),
                             _numpy(ndata["label"], "label"),
                             [_numpy(ndata[k], k) for k in _MASKS], num_classes, directed=directed,
                             edge_weight=weight, name="dgl", meta={"source": "dgl"})
