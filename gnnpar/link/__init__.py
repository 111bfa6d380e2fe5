"""Link prediction (issue 42), built up in parts; what exists so far is the serial reference
every distributed path will be tested against:

- :mod:`.split`: the edge split without leakage (held-out edges never in the graph messages
  pass over) and its fixed evaluation negatives;
- :mod:`.negatives`: training negatives as a pure function of (seed, epoch, positive, j), so
  any partition of the positives draws the same ones;
- :mod:`.decoders`: pair scores from two endpoints' embeddings (dot product, Hadamard MLP) and
  the summed binary cross-entropy;
- :mod:`.metrics`: AUC, MRR (OGB citation2's rule) and Hits@K (OGB collab's rule);
- :mod:`.serial`: the full-batch link-prediction loop on one process.

Not built yet (issue 42 stays open): ``gnnpar-train --task link``, the distributed scoring
exchange, mini batch, dataset-given splits (npz keys, OGB folders), ``--pairs`` scoring.
"""
