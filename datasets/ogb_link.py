"""The edge split of an OGB link-property folder, read without the ogb package.

OGB's downloader unpacks a link-property dataset (ogbl-collab, ogbl-ppa, ogbl-citation2, …)
as ``raw/`` (the graph, read by :mod:`.ogb` like a node-property folder's, without labels)
and ``split/<name>/{train,valid,test}.pt``: each a ``torch.save`` of a dict of arrays (numpy
arrays in OGB's files, torch tensors where a user saved them), in one of two layouts:

- pairs as rows (collab, ppa, ddi): ``edge`` (K, 2) and, in ``valid``/``test``, ``edge_neg``
  (K', 2) — negatives shared by every positive (OGB's Hits@K evaluator);
- sources and targets (citation2): ``source_node`` (K,), ``target_node`` (K,) and, in
  ``valid``/``test``, ``target_node_neg`` (K, R) — each positive ranked against its own R
  destinations with its own source (OGB's MRR evaluator).

Other keys (``weight``, ``year``) are ignored. The files are read with
``torch.load(weights_only=True)``: nothing is unpickled but tensors, containers and — on an
allowlist of three names — numpy's array reconstruction, so a file that holds any other
object is refused, not run. What comes back uses the names of an ``npz:`` dataset's own split
(:data:`gnnpar.link.split.GIVEN_KEYS`, plus ``val_neg_dst``/``test_neg_dst``), as 2 × K and
K × R int64 arrays; the ids are checked against the node count by the link split.
"""
from __future__ import annotations

import os
from typing import Dict

import numpy as np

from .errors import InputError

#: the split files of a link-property folder, and the side each gives
PARTS = (("train", "train"), ("valid", "val"), ("test", "test"))


def is_link_split(split_dir: str) -> bool:
    """Whether ``split_dir`` is a link-property split (``train.pt``), not a node one."""
    return os.path.isfile(os.path.join(split_dir, "train.pt"))


def _numpy_globals():
    """The globals a numpy array's pickle names, each under every name numpy 1.x and 2.x
    files use for it (``numpy.core`` became ``numpy._core``)."""
    rebuild = np.zeros(1).__reduce__()[0]  # numpy's _reconstruct, whichever its home
    found = [np.ndarray, np.dtype]
    found += [(rebuild, f"{home}.multiarray._reconstruct")
              for home in ("numpy.core", "numpy._core")]
    found += [type(np.dtype(t)) for t in (np.int64, np.int32, np.float32, np.float64, np.bool_)]
    return found


def load_split_file(path: str) -> dict:
    """One split file's dict of arrays, loaded with ``weights_only=True`` (module docstring);
    InputError naming the file when it is missing, not a dict, or holds another object."""
    import torch
    if not os.path.isfile(path):
        raise InputError(f"OGB link split file not found: {path}")
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # the unpickler's refusal or a damaged file
        first = str(exc).strip().splitlines()
        why = next((line for line in first if "Unsupported global" in line),
                   first[0] if first else type(exc).__name__)
        raise InputError(f"{path} is not an OGB split file gnnpar can read safely: "
                         f"{why.strip()}") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path} must hold a dict of arrays, got {type(obj).__name__}")
    return obj


def _array(d: dict, key: str, path: str) -> np.ndarray:
    value = d[key]
    if hasattr(value, "numpy") and hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    a = np.asarray(value)
    if not np.issubdtype(a.dtype, np.integer):
        raise InputError(f"{path}: {key} must hold integer vertex ids, got {a.dtype}")
    return a.astype(np.int64, copy=False)


def _rows_as_pairs(a: np.ndarray, key: str, path: str) -> np.ndarray:
    if a.ndim != 2 or a.shape[1] != 2:
        raise InputError(f"{path}: {key} must be a K x 2 array of vertex pairs, "
                         f"got shape {a.shape}")
    return np.ascontiguousarray(a.T)


def _side(d: dict, side: str, path: str) -> Dict[str, np.ndarray]:
    """One file's arrays under the link split's names (module docstring)."""
    out = {}
    if "edge" in d:
        out[f"{side}_pos"] = _rows_as_pairs(_array(d, "edge", path), "edge", path)
        if side != "train" and "edge_neg" in d:
            out[f"{side}_neg"] = _rows_as_pairs(_array(d, "edge_neg", path), "edge_neg", path)
        return out
    if "source_node" in d and "target_node" in d:
        src, dst = _array(d, "source_node", path), _array(d, "target_node", path)
        if src.ndim != 1 or src.shape != dst.shape:
            raise InputError(f"{path}: source_node and target_node must be 1-D arrays of one "
                             f"length, got shapes {src.shape} and {dst.shape}")
        out[f"{side}_pos"] = np.stack([src, dst])
        if side != "train" and "target_node_neg" in d:
            neg = _array(d, "target_node_neg", path)
            if neg.ndim == 1:
                neg = neg[:, None]
            if neg.ndim != 2 or neg.shape[0] != src.shape[0]:
                raise InputError(f"{path}: target_node_neg must be K x R with K = "
                                 f"{src.shape[0]} (one row a positive), got shape {neg.shape}")
            out[f"{side}_neg_dst"] = neg
        return out
    raise InputError(f"{path} has neither 'edge' nor 'source_node'/'target_node' (keys: "
                     f"{', '.join(map(str, d)) or 'none'})")


def read_link_split(split_dir: str) -> Dict[str, np.ndarray]:
    """``split_dir``'s three files as the link split's arrays (module docstring)."""
    arrays: Dict[str, np.ndarray] = {}
    for part, side in PARTS:
        path = os.path.join(split_dir, f"{part}.pt")
        arrays.update(_side(load_split_file(path), side, path))
    return arrays
