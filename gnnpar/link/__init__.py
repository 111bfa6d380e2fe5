"""Link prediction (``gnnpar-train --task link``): full and mini batch, serial and distributed.

- :mod:`.options`: the command-line flags of a link run, checked before any work;
- :mod:`.split`: the edge split without leakage (held-out edges never in the graph messages
  pass over), a dataset's own split read as given, and the fixed evaluation negatives;
- :mod:`.negatives`: training negatives as a pure function of (seed, epoch, positive, j), so
  any partition of the positives draws the same ones;
- :mod:`.decoders`: pair scores from two endpoints' embeddings (dot product, Hadamard MLP, a
  user's factory) and the summed binary cross-entropy;
- :mod:`.metrics`: AUC, MRR (OGB citation2's rule) and Hits@K (OGB collab's rule);
- :mod:`.loop`: the full-batch loop, one process or any distributed algorithm;
- :mod:`.minibatch`: mini batch, data parallel: edge batches as seeds, sampled by the
  macrobatch service;
- :mod:`.exchange`: the distributed scoring exchange (the other endpoint's row from its owner);
- :mod:`.scoring`: ``gnnpar-predict --pairs``, scores of given pairs from a saved model.

Not built yet (README, "Link prediction"): grouped mini batch, training from
``--partition-dir`` shards, the exchange's term in ``gnnpar-plan``'s cost model.
"""
