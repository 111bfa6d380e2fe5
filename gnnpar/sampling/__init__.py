"""Mini-batch training: neighbour samplers, the macrobatch service, partitioned features.

One file per idea:

- :mod:`.topology` — Â as the samplers read it (diagonal + off-diagonal CSR, replicated);
- :mod:`.partitioned` — the same, each rank holding only its own rows;
- :mod:`.choose` — which positions of each row are kept (Floyd's algorithm, vectorised);
- :mod:`.blocks` — :class:`Block` / :class:`MiniBatch` and block-local numbering;
- :mod:`.neighbor` — node-wise sampling of one minibatch (the reference);
- :mod:`.bulk` — bulk matrix sampling of a macrobatch (same blocks, one pass per layer);
- :mod:`.seeds` — each rank's seeds per step, the same step count on every rank;
- :mod:`.features` — partitioned feature rows, one all-to-all per macrobatch;
- :mod:`.cache` — which remote rows a rank keeps;
- :mod:`.service` — sampler threads running ahead of the trainer;
- :mod:`.loop` — the data-parallel training loop and its engine hook;
- :mod:`.grouped` — a group of ranks per minibatch (``--algo … --group-size g``, 4d): each
  block on a full-batch kernel (:mod:`gnnpar.kernels.bipartite`), groups data parallel;
- :mod:`.run` / :mod:`.options` — ``gnnpar-train --mode minibatch``.

Quick use (serial)::

    topo = Topology.from_graph(graph, ("mean",))
    sampler = BulkSampler(topo, SamplerConfig((15, 10, 5), "mean"))
    blocks = sampler.sample([seeds_a, seeds_b], [batch_rng(0, 0, 0, 0), batch_rng(0, 0, 0, 1)])
    logits_a = model([b.operator() for b in blocks[0]], x[blocks[0][0].src_ids])

Graph structure: replicated on every rank (:mod:`.topology`) or partitioned
(:mod:`.partitioned`, ``--no-replicate-graph``: each rank its own rows, the neighbours of
other rows asked of their owners once per layer); both draw exactly the same blocks. Their
memory per rank is in those modules' docstrings.
"""
from gnnpar.sampling.blocks import Block, MiniBatch, Relabeler
from gnnpar.sampling.bulk import BulkSampler
from gnnpar.sampling.features import FeatureStore
from gnnpar.sampling.neighbor import NeighborSampler, SamplerConfig, batch_rng, parse_fanouts
from gnnpar.sampling.partitioned import PartitionedTopology
from gnnpar.sampling.seeds import EpochPlan
from gnnpar.sampling.service import MacrobatchService, ReadyBatch, SamplingStats, ServiceConfig
from gnnpar.sampling.topology import Topology, gather_topology

__all__ = ["Block", "MiniBatch", "Relabeler", "BulkSampler", "FeatureStore", "NeighborSampler",
           "SamplerConfig", "batch_rng", "parse_fanouts", "PartitionedTopology", "EpochPlan",
           "MacrobatchService",
           "ReadyBatch", "SamplingStats", "ServiceConfig", "Topology", "gather_topology"]
