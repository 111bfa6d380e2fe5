"""The serial runtime: the whole graph on one device. The reference every distributed
algorithm is tested against."""
from __future__ import annotations

import numpy as np
import torch

from gnnpar.datasets import Graph
from gnnpar.datasets.normalize import propagation_matrix
from gnnpar.kernels.local import SparseOperator, as_tensor

from gnnpar.interfaces import SPLITS
from gnnpar.training.trainer import RuntimeCollectives


class SerialRuntime(RuntimeCollectives):
    """Whole-graph data and the local SpMM operator for normalisation ``norm``."""

    def __init__(self, graph: Graph, norm: str, device="cpu"):
        self.device = torch.device(device)
        indptr, indices, values = propagation_matrix(graph, norm)
        n = graph.num_nodes
        self.op = SparseOperator(indptr, indices, values, (n, n), self.device)
        self.global_ids = np.arange(n, dtype=np.int64)  # the rows, in the graph's order
        if self.device.type == "cpu":
            self.op.reuse_outputs()  # the trainer finishes each pass before the next
        self.x = as_tensor(graph.x, np.float32, self.device)
        self.y = as_tensor(graph.y, np.int64, self.device)
        self.masks = {s: as_tensor(getattr(graph, f"{s}_mask"), np.bool_, self.device)
                      for s in SPLITS}

    def start_pass(self) -> None:
        """Rewind the reused SpMM outputs: a new forward pass begins."""
        self.op.start_pass()
