#!/usr/bin/env python
"""Planetoid citation graphs (Cora, Citeseer, PubMed) as gnnpar's ``npz:`` files, public split.

    python scripts/planetoid_npz.py DIR cora OUT.npz     # DIR holds ind.cora.x, .y, ... files
    gnnpar-train --dataset npz:OUT.npz --model gat ...

The Planetoid release (Yang et al. 2016, the files GCN, GAT and PyG's ``Planetoid`` read) is
eight files per graph, ``ind.<name>.{x,y,allx,ally,tx,ty,graph,test.index}``: Python pickles
(of scipy matrices, numpy arrays and a dict of neighbour lists), so convert only files you
trust. gnnpar has no network access at run time; this reads files the user already has.

What the npz holds, as the GCN and GAT papers and PyG's loader take it:

- nodes: ``allx`` rows then ``tx`` rows, the test rows put at the ids ``test.index`` gives
  (Citeseer's ids have gaps: the missing test nodes get zero features and no split);
- edges: the ``graph`` dict's neighbour lists (undirected; gnnpar symmetrises and adds self
  loops, S = A' + I);
- split: train = the ``len(y)`` first nodes (20 per class), val = the next 500, test = the
  ``test.index`` ids (1000);
- features row-normalised (each row sums to 1; an all-zero row stays zero), as PyG's
  ``NormalizeFeatures`` in its GAT example; ``--raw-features`` keeps them as stored.
"""
import argparse
import os
import pickle
import sys

import numpy as np

PARTS = ("x", "y", "allx", "ally", "tx", "ty", "graph")


def _read(folder: str, name: str, part: str):
    path = os.path.join(folder, f"ind.{name}.{part}")
    if not os.path.exists(path):
        sys.exit(f"planetoid_npz: {path} is missing (a Planetoid graph needs ind.{name}."
                 f"{{{','.join(PARTS)},test.index}})")
    if part == "test.index":
        with open(path) as f:
            return np.array([int(line) for line in f if line.strip()], np.int64)
    with open(path, "rb") as f:
        return pickle.load(f, encoding="latin1")  # Python 2 pickles


def _dense(m) -> np.ndarray:
    return np.asarray(m.todense() if hasattr(m, "todense") else m, np.float32)


def planetoid_arrays(folder: str, name: str, normalize: bool = True, val: int = 500) -> dict:
    """The npz arrays (``edge_index``, ``x``, ``y``, the three masks, ``num_classes``) of
    graph ``name`` in ``folder`` (module docstring; ``val``: the validation nodes after the
    training ones)."""
    x, y, allx, ally, tx, ty, graph = (_read(folder, name, p) for p in PARTS)
    test = _read(folder, name, "test.index")
    ordered = np.sort(test)
    lo, hi = int(ordered[0]), int(ordered[-1])
    tx, ty = _dense(tx), _dense(ty)
    if hi - lo + 1 != tx.shape[0]:  # Citeseer: ids without a node in tx
        full_x = np.zeros((hi - lo + 1, tx.shape[1]), np.float32)
        full_y = np.zeros((hi - lo + 1, ty.shape[1]), np.float32)
        full_x[ordered - lo], full_y[ordered - lo] = tx, ty
        tx, ty = full_x, full_y
    feats = np.vstack([_dense(allx), tx])
    onehot = np.vstack([_dense(ally), ty])
    # row i of tx/ty (now at the i-th smallest test id) is the node test.index names i-th
    feats[test], onehot[test] = feats[ordered].copy(), onehot[ordered].copy()
    n = feats.shape[0]
    src = np.concatenate([np.full(len(v), int(k), np.int64) for k, v in graph.items()])
    dst = np.concatenate([np.asarray(v, np.int64) for v in graph.values()])
    keep = (src < n) & (dst < n) & (src != dst)
    if normalize:
        sums = feats.sum(axis=1, keepdims=True)
        feats = np.divide(feats, sums, out=np.zeros_like(feats), where=sums > 0)
    masks = {k: np.zeros(n, bool) for k in ("train_mask", "val_mask", "test_mask")}
    masks["train_mask"][:len(y)] = True
    masks["val_mask"][len(y):len(y) + val] = True
    masks["test_mask"][test] = True
    return {"edge_index": np.stack([src[keep], dst[keep]]), "x": feats,
            "y": onehot.argmax(axis=1).astype(np.int64), "num_classes": onehot.shape[1],
            **masks}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", help="the folder holding the ind.<name>.* files")
    p.add_argument("name", help="cora, citeseer or pubmed (the files' middle name)")
    p.add_argument("out", help="the .npz to write")
    p.add_argument("--raw-features", action="store_true",
                   help="keep the features as stored (default: rows normalised to sum 1)")
    args = p.parse_args(argv)
    arrays = planetoid_arrays(args.folder, args.name, not args.raw_features)
    np.savez(args.out, **arrays)
    n, e = arrays["x"].shape[0], arrays["edge_index"].shape[1]
    print(f"{args.out}: {n} nodes, {e} directed edge entries, {arrays['x'].shape[1]} features, "
          f"{arrays['num_classes']} classes, train/val/test = "
          f"{int(arrays['train_mask'].sum())}/{int(arrays['val_mask'].sum())}/"
          f"{int(arrays['test_mask'].sum())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
