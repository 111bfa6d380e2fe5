"""DGL side of scripts/bench_dgl.py: runs in the side venv (torch 2.2.1 + dgl 2.1.0), never in
gnnpar's. Not meant to be run by hand:

    /tmp/gnnpar-dgl-venv/bin/python scripts/bench_dgl_side.py GRAPH.npz

GRAPH.npz (written by bench_dgl.py): ``indptr``, ``indices`` (CSR of A, row i aggregates from
its columns, no self loops), ``x`` (n, f) float32, ``y`` (n,) int64, ``train_mask`` (n,) bool,
``num_classes``. Reads one JSON request per line on stdin and answers one JSON line on stdout:

    {"measure": "check"}                                   -> Â·x rows to compare with gnnpar
    {"measure": "step", "threads": 2, "warmup": 2, "steps": 5}   -> {"step_s": median}
    {"measure": "sample", "threads": 2, "gather": false, "seconds": 3,
     "fanouts": [15, 10, 5], "batch_size": 1024[, "fused": true]}
                                                           -> {"mb_s", "edges_per_mb", ...}
    {"measure": "train", "threads": 2, "epochs": 5, "fanouts": [15, 10, 5],
     "batch_size": 1024, "hidden": 256, "dropout": 0.5}    -> {"epochs_s": [...], "steps", ...}
    {"measure": "link_train", "threads": 2, "epochs": 3, "fanouts": [15, 10],
     "batch_size": 1024, "hidden": 256, "dropout": 0.5, "neg_ratio": 1}
                                                           -> {"epochs_s": [...], "steps", ...}
    {"measure": "gat", "threads": 2, "warmup": 2, "steps": 5, "layers": 2, "heads": 4,
     "width": 64, "dropout": 0.5}             -> {"step_s": median, "steps_s", "peak_growth_bytes"}

``link_train`` (``scripts/bench_link_dgl.py``; the npz also has ``train_eids``, the edge ids
of the training positives, one direction each) is DGL's own mini-batch link-prediction loop
(as in DGL's link-prediction examples): ``as_edge_prediction_sampler`` around the
``NeighborSampler``, ``negative_sampler.Uniform(neg_ratio)``, ``DataLoader`` over the
positives' edge ids (shuffled, batch ``batch_size``, ``num_workers=0``), the SAGE encoder
above with output width ``hidden``, the dot product of each pair's rows as its score, the mean
binary cross-entropy with logits of positives and negatives, Adam (lr 0.01, no weight decay:
a link run's defaults in gnnpar). No edge is excluded from the blocks, as gnnpar excludes
none. Each epoch's wall time, from the first batch's sampling to the last step.

``gat`` is ``scripts/bench_gat.py``'s model in DGL: ``layers`` × ``GATConv`` (``heads`` heads of
``width`` in the hidden layers, flattened; the output layer's heads averaged), LeakyReLU 0.2,
dropout ``dropout`` on each layer's input (outside the layer, as the PyG side) and on the
attention coefficients (``attn_drop``), ELU between layers, on A' + I (DGL's
``add_self_loop``), Adam (lr 0.005, weight decay 5e-4), mean cross-entropy of the training
nodes; a step is forward + backward + Adam step. ``peak_growth_bytes``: the largest resident
set while the request ran (sampled every 2 ms from ``/proc/self/statm``) minus the one before
the model was made.

``fanouts`` are in DGL's own order (input layer first, as NeighborSampler takes them).

``train`` is DGL's own mini-batch loop (as in DGL's GraphSAGE example): ``NeighborSampler``
(without replacement, its fused kernel) and ``DataLoader`` (shuffled train ids, batch
``batch_size``, the last batch smaller, ``num_workers=0``: sampling runs in this thread,
between the steps, on DGL's OpenMP pool of ``threads``), the features of each minibatch's
input nodes by indexing, ``len(fanouts)`` × ``SAGEConv('mean')`` with dropout before every
layer and ReLU between (gnnpar's ``GNN("sage", ...)``; SAGEConv, like gnnpar, aggregates at
the narrower width), mean cross-entropy of the seeds, backward, Adam (lr 0.01, weight decay
5e-4) with ``threads`` torch threads; no evaluation. Each epoch's wall time, from the first
batch's sampling to the last step.
"""
import json
import os
import statistics
import sys
import threading
import time

import numpy as np
import torch
from torch.nn import functional as F

import dgl
from dgl.nn import GATConv, GraphConv, SAGEConv

HIDDEN, LAYERS, DROPOUT, LR, WEIGHT_DECAY = 256, 3, 0.5, 0.01, 5e-4  # gnnpar's defaults


def set_threads(n):
    torch.set_num_threads(n)
    if hasattr(dgl, "utils") and hasattr(dgl.utils, "set_num_threads"):
        dgl.utils.set_num_threads(n)  # DGL's own OpenMP pool (sampling kernels)


class GCN(torch.nn.Module):
    """gnnpar's GCN in DGL: dropout before every layer, ReLU between, norm D^-1/2 (A'+I) D^-1/2
    (DGL's norm="both" scales by the source's out-degree and the destination's in-degree, as
    gnnpar's column and row sums do)."""

    def __init__(self, f_in, hidden, f_out, layers):
        super().__init__()
        widths = [f_in] + [hidden] * (layers - 1) + [f_out]
        self.layers = torch.nn.ModuleList(GraphConv(a, b, norm="both", allow_zero_in_degree=True)
                                          for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, g, h):
        for i, layer in enumerate(self.layers):
            h = layer(g, F.dropout(h, DROPOUT, self.training))
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h


class SAGE(torch.nn.Module):
    """gnnpar's GraphSAGE in DGL: dropout before every layer, ReLU between, mean aggregation
    plus a root term (SAGEConv 'mean': fc_neigh(mean of sources) + fc_self(dst) + bias)."""

    def __init__(self, f_in, hidden, f_out, layers, dropout):
        super().__init__()
        widths = [f_in] + [hidden] * (layers - 1) + [f_out]
        self.dropout = dropout
        self.layers = torch.nn.ModuleList(SAGEConv(a, b, "mean")
                                          for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, blocks, h):
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, F.dropout(h, self.dropout, self.training))
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h


class GAT(torch.nn.Module):
    def __init__(self, f_in, width, heads, f_out, layers, dropout):
        super().__init__()
        widths = [f_in] + [width * heads] * (layers - 1)
        self.dropout = dropout
        self.convs = torch.nn.ModuleList(
            [GATConv(a, width, heads, attn_drop=dropout, negative_slope=0.2,
                     allow_zero_in_degree=True) for a in widths[:-1]]
            + [GATConv(widths[-1], f_out, heads, attn_drop=dropout, negative_slope=0.2,
                       allow_zero_in_degree=True)])

    def forward(self, g, h):
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            h = conv(g, F.dropout(h, self.dropout, self.training))
            h = F.elu(h.flatten(1)) if i < last else h.mean(1)
        return h


class PeakRSS:
    """The largest resident set while open, sampled every 2 ms on a thread."""

    def __enter__(self):
        self.base = self.peak = self._rss()
        self.stop = False
        self.t = threading.Thread(target=self._watch, daemon=True)
        self.t.start()
        return self

    @staticmethod
    def _rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _watch(self):
        while not self.stop:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.stop = True
        self.t.join()
        self.growth = self.peak - self.base


class Side:
    def __init__(self, path):
        d = np.load(path)
        indptr, indices = d["indptr"], d["indices"]
        n = indptr.shape[0] - 1
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        # edge col -> row: DGL aggregates over in-edges, gnnpar over a row's columns
        self.g = dgl.graph((torch.from_numpy(indices.astype(np.int64)), torch.from_numpy(rows)),
                           num_nodes=n)
        self.g.create_formats_()
        self.x = torch.from_numpy(d["x"])
        self.y = torch.from_numpy(d["y"])
        self.train_mask = torch.from_numpy(d["train_mask"])
        self.train_ids = torch.nonzero(self.train_mask).flatten()
        self.num_classes = int(d["num_classes"])
        self.train_eids = (torch.from_numpy(d["train_eids"]) if "train_eids" in d.files
                           else None)
        self._gcn = None

    def gcn_graph(self):
        if self._gcn is None:  # A' + I: loops replaced by weight-1 ones, as gnnpar's gcn kind
            self._gcn = dgl.add_self_loop(dgl.remove_self_loop(self.g))
            self._gcn.create_formats_()
        return self._gcn

    def check(self, req):
        """First rows of D^-1/2 (A'+I) D^-1/2 · x, DGL's way (to match against gnnpar's op)."""
        conv = GraphConv(self.x.shape[1], self.x.shape[1], norm="both", weight=False, bias=False)
        with torch.no_grad():
            out = conv(self.gcn_graph(), self.x)
        k = int(req.get("rows", 8))
        return {"rows": out[:k].tolist(), "num_edges_gcn": int(self.gcn_graph().num_edges())}

    def step(self, req):
        g = self.gcn_graph()
        torch.manual_seed(0)
        model = GCN(self.x.shape[1], HIDDEN, self.num_classes, LAYERS)
        opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        count = float(self.train_mask.sum())
        times = []
        for i in range(req["warmup"] + req["steps"]):
            t0 = time.perf_counter()
            model.train()
            opt.zero_grad(set_to_none=True)
            out = model(g, self.x)
            loss = F.cross_entropy(out[self.train_mask], self.y[self.train_mask],
                                   reduction="sum")
            (loss / count).backward()
            opt.step()
            if i >= req["warmup"]:
                times.append(time.perf_counter() - t0)
        return {"step_s": statistics.median(times), "steps_s": times}

    def gat(self, req):
        g = self.gcn_graph()
        with PeakRSS() as rss:
            torch.manual_seed(0)
            model = GAT(self.x.shape[1], req["width"], req["heads"], self.num_classes,
                        req["layers"], req["dropout"])
            opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=WEIGHT_DECAY)
            times = []
            for i in range(req["warmup"] + req["steps"]):
                t0 = time.perf_counter()
                model.train()
                opt.zero_grad()
                out = model(g, self.x)
                F.cross_entropy(out[self.train_ids], self.y[self.train_ids]).backward()
                opt.step()
                if i >= req["warmup"]:
                    times.append(time.perf_counter() - t0)
        return {"step_s": statistics.median(times), "steps_s": times,
                "peak_growth_bytes": rss.growth}

    def sample(self, req):
        # fused=True is DGL's default (its fused kernel when it has > 1 OpenMP thread)
        sampler = dgl.dataloading.NeighborSampler(list(req["fanouts"]),
                                                  fused=req.get("fused", True))
        loader = dgl.dataloading.DataLoader(self.g, self.train_ids, sampler,
                                            batch_size=req["batch_size"], shuffle=True,
                                            drop_last=True, num_workers=0)
        gather = req["gather"]

        def one_pass(stop_at):
            mbs = edges = inputs = 0
            while True:
                for input_nodes, _, blocks in loader:
                    if gather:
                        torch.index_select(self.x, 0, input_nodes)
                    mbs += 1
                    edges += sum(b.num_edges() for b in blocks)
                    inputs += int(input_nodes.shape[0])
                    if time.perf_counter() >= stop_at:
                        return mbs, edges, inputs

        one_pass(0.0)  # warm-up: one minibatch
        t0 = time.perf_counter()
        mbs, edges, inputs = one_pass(t0 + req["seconds"])
        dt = time.perf_counter() - t0
        return {"mb_s": mbs / dt, "edges_per_mb": edges / mbs, "inputs_per_mb": inputs / mbs}


    def train(self, req):
        torch.manual_seed(0)
        fanouts = list(req["fanouts"])
        model = SAGE(self.x.shape[1], req.get("hidden", HIDDEN), self.num_classes, len(fanouts),
                     req.get("dropout", DROPOUT))
        opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        sampler = dgl.dataloading.NeighborSampler(fanouts)
        loader = dgl.dataloading.DataLoader(self.g, self.train_ids, sampler,
                                            batch_size=req["batch_size"], shuffle=True,
                                            drop_last=False, num_workers=0)
        return _epochs(model, opt, loader, req["epochs"], lambda input_nodes, output_nodes,
                       blocks: F.cross_entropy(model(blocks, self.x[input_nodes]),
                                               self.y[output_nodes]))

    def link_train(self, req):
        torch.manual_seed(0)
        fanouts, hidden = list(req["fanouts"]), req.get("hidden", HIDDEN)
        model = SAGE(self.x.shape[1], hidden, hidden, len(fanouts), req.get("dropout", DROPOUT))
        opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=0.0)
        sampler = dgl.dataloading.as_edge_prediction_sampler(
            dgl.dataloading.NeighborSampler(fanouts),
            negative_sampler=dgl.dataloading.negative_sampler.Uniform(req.get("neg_ratio", 1)))
        loader = dgl.dataloading.DataLoader(self.g, self.train_eids, sampler,
                                            batch_size=req["batch_size"], shuffle=True,
                                            drop_last=False, num_workers=0)

        def scores(pair_graph, h):
            u, v = pair_graph.edges()
            return (h[u] * h[v]).sum(-1)

        def loss_of(input_nodes, pair_graph, neg_graph, blocks):
            h = model(blocks, self.x[input_nodes])
            pos, neg = scores(pair_graph, h), scores(neg_graph, h)
            labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
            return F.binary_cross_entropy_with_logits(torch.cat([pos, neg]), labels)
        return _epochs(model, opt, loader, req["epochs"], loss_of)


def _epochs(model, opt, loader, epochs, loss_of):
    """``epochs`` passes over ``loader``: each batch's ``loss_of(*batch)``, backward, the
    optimiser's step; each epoch's wall time (the loader's sampling included)."""
    times, steps, loss_sum = [], 0, 0.0
    for _ in range(epochs):
        model.train()
        steps, loss_sum = 0, 0.0
        t0 = time.perf_counter()
        for batch in loader:
            opt.zero_grad(set_to_none=True)
            loss = loss_of(*batch)
            loss.backward()
            opt.step()
            steps += 1
            loss_sum += loss.detach()
        times.append(time.perf_counter() - t0)
    return {"epochs_s": times, "steps": steps, "loss": float(loss_sum) / max(steps, 1)}


def main():
    side = Side(sys.argv[1])
    print(json.dumps({"ready": True, "dgl": dgl.__version__, "torch": torch.__version__,
                      "omp": os.environ.get("OMP_NUM_THREADS")}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        set_threads(int(req.get("threads", 1)))
        out = getattr(side, req["measure"])(req)
        out["threads"] = torch.get_num_threads()
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
