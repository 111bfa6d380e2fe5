"""Link prediction (issue 42), built up in parts; what exists so far is a library: the loop
on one process (the reference) and on every full-batch distributed algorithm.

- :mod:`.split`: the edge split without leakage (held-out edges never in the graph messages
  pass over) and its fixed evaluation negatives;
- :mod:`.negatives`: training negatives as a pure function of (seed, epoch, positive, j), so
  any partition of the positives draws the same ones;
- :mod:`.decoders`: pair scores from two endpoints' embeddings (dot product, Hadamard MLP) and
  the summed binary cross-entropy;
- :mod:`.metrics`: AUC, MRR (OGB citation2's rule) and Hits@K (OGB collab's rule);
- :mod:`.loop`: the full-batch loop, one process or any distributed algorithm;
- :mod:`.exchange`: the distributed scoring exchange (the other endpoint's row from its owner).

Not built yet (issue 42 stays open): ``gnnpar-train --task link`` (a command line,
logs, checkpoints, shards that carry the split), the cost-model term of the exchange, mini
batch, dataset-given splits (npz keys, OGB folders), ``--pairs`` scoring.
"""
