"""GAT on the edge-valued operator contract (kernels/edge_ops.py, gnnpar/nn/attention.py) against a
dense reference written from the paper's formulas: outputs and every gradient, several head
counts, concatenated and averaged heads, bipartite blocks, a row without edges; in mini batch,
a neighbour drawn twice (``--replace``) counted once in every mode, and the data-parallel and
grouped command-line runs against the serial run's losses."""
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from gnnpar.nn.attention import GATLayer
from gnnpar.kernels.edge_ops import CsrEdges, EdgeOperator, edge_softmax
from gnnpar.kernels.local import SparseOperator
from gnnpar.nn.models import build_model

from .cli_util import run_main, run_train


def random_mask(n_dst, n_src, density, seed, loops=True, empty_row=None):
    rng = np.random.default_rng(seed)
    mask = rng.random((n_dst, n_src)) < density
    if loops:
        mask[np.arange(n_dst), np.arange(n_dst)] = True
    if empty_row is not None:
        mask[empty_row] = False
    return mask


def operator(mask):
    rows, cols = np.nonzero(mask)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=mask.shape[0]))])
    return SparseOperator(indptr, cols, np.ones(cols.size, np.float32), mask.shape)


def dense_gat(layer, mask, h):
    """The layer's formulas on a dense adjacency mask (row i attends to the j with mask[i, j])."""
    n_dst = mask.shape[0]
    z = (h @ layer.lin.weight.t()).view(h.shape[0], layer.heads, layer.width)
    src = (z * layer.att_src).sum(-1)
    dst = (z[:n_dst] * layer.att_dst).sum(-1)
    e = F.leaky_relu(dst[:, None, :] + src[None, :, :], 0.2)        # (dst, src, heads)
    m = torch.as_tensor(mask)[:, :, None]
    alpha = torch.softmax(e.masked_fill(~m, float("-inf")), dim=1)
    alpha = torch.where(m, alpha, torch.zeros_like(alpha))            # rows without edges: 0
    out = torch.einsum("ijh,jhf->ihf", alpha, z)
    out = out.reshape(n_dst, -1) if layer.concat else out.mean(dim=1)
    return out + layer.bias


@pytest.mark.parametrize("heads,concat", [(1, True), (3, True), (3, False), (1, False)])
@pytest.mark.parametrize("shape", [(37, 37), (11, 29)])
def test_layer_equals_dense_reference(heads, concat, shape):
    torch.manual_seed(heads + 10 * concat)
    mask = random_mask(*shape, 0.15, seed=heads, empty_row=5)
    layer = GATLayer(7, 4, heads, concat)
    with torch.no_grad():
        layer.bias.normal_()
    h = torch.randn(shape[1], 7, requires_grad=True)
    out = layer(operator(mask), h)
    h2 = h.detach().clone().requires_grad_(True)
    want = dense_gat(layer, mask, h2)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, [h] + list(layer.parameters()), g)
    wants = torch.autograd.grad(want, [h2] + list(layer.parameters()), g)
    for got, ref in zip(grads, wants):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_edge_softmax_rows_sum_to_one_and_empty_rows_stay_empty():
    mask = random_mask(20, 20, 0.2, seed=3, loops=False, empty_row=4)
    edges = operator(mask).edges()
    assert isinstance(edges, EdgeOperator)
    e = torch.randn(edges.num_edges, 2) * 50  # large scores: the row shift keeps exp finite
    alpha = edge_softmax(edges, e)
    sums = edges.row_sum(alpha)
    has = torch.as_tensor(mask.any(axis=1))
    torch.testing.assert_close(sums[has], torch.ones_like(sums[has]))
    assert (sums[~has] == 0).all() and torch.isfinite(alpha).all()


def test_weighted_product_gradients_float64():
    mask = random_mask(9, 13, 0.3, seed=5, loops=False, empty_row=2)
    rows, cols = np.nonzero(mask)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=9))])
    edges = CsrEdges(torch.as_tensor(indptr), torch.as_tensor(cols), 13)
    h = torch.randn(13, 2, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(edges.num_edges, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(edges.spmm, (h, w))


def test_compiled_passes_equal_the_torch_path_and_its_blocks(monkeypatch):
    from gnnpar.kernels import edge_ops
    mask = random_mask(30, 41, 0.3, seed=6, empty_row=3)
    edges = operator(mask).edges()
    h = torch.randn(41, 2, 4, requires_grad=True)
    w = torch.rand(edges.num_edges, 2, requires_grad=True)
    g = torch.randn(30, 2, 4)

    def run():
        out = edges.spmm(h, w)
        return (out,) + torch.autograd.grad(out, (h, w), g)

    assert edge_ops._compiled_serves(h, w)
    compiled = run()
    monkeypatch.setattr(edge_ops, "_compiled_serves", lambda *t: False)
    torch_path = run()
    monkeypatch.setattr(edge_ops, "SDDMM_BLOCK", 5)  # blocks of one edge
    blocked = run()
    for a, b, c in zip(compiled, torch_path, blocked):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(c, b, rtol=0, atol=0)


def test_model_shapes_and_refusals():
    model = build_model("gat", 6, 16, 3, 3, 0.0, heads=4)
    assert [layer.heads for layer in model.layers] == [4, 4, 4]
    assert [layer.width for layer in model.layers] == [4, 4, 3]
    mask = random_mask(25, 25, 0.2, seed=8)
    out = model(operator(mask), torch.randn(25, 6))
    assert out.shape == (25, 3)
    with pytest.raises(ValueError, match="not a multiple of 4 heads"):
        build_model("gat", 6, 10, 3, 2, 0.0, heads=4)
    with pytest.raises(ValueError, match="heads are GAT's"):
        build_model("gcn", 6, 16, 3, 2, 0.0, heads=4)


def test_train_cli_runs_gat_and_refuses_what_it_cannot_run(tmp_path):
    base = ["--dataset", "sbm:n=300,blocks=3,p_in=0.08,p_out=0.005", "--model", "gat",
            "--hidden", "16", "--heads", "4", "--epochs", "30", "--lr", "0.01", "--quiet"]
    res = run_train(*base, "--log-json", str(tmp_path / "log.jsonl"))
    assert res.returncode == 0, res.stderr[-2000:]
    import json
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in lines if "loss" in x]
    assert losses[-1] < losses[0]
    res = run_train(*base, "--algo", "1d-halo", "--nprocs", "2", "--epochs", "3")
    assert res.returncode == 0, res.stderr[-2000:]
    # the refusals: the first as a new process, the others as gnnpar-train's main in this one
    for i, (extra, words) in enumerate(((["--heads", "3"], "multiple of --heads"),
                                        (["--attn-dropout", "1.5"], "--attn-dropout must be"))):
        res = run_train(*base, *extra) if i == 0 else run_main("gnnpar-train", *base, *extra,
                                                                cwd=tmp_path)
        assert res.returncode == 2 and words in res.stderr, res.stderr[-2000:]
        assert len(res.stderr.strip().splitlines()) == 1
    res = run_main("gnnpar-train", "--model", "gcn", "--heads", "2", "--epochs", "1", cwd=tmp_path)
    assert res.returncode == 2 and "--heads" in res.stderr


def test_readme_attention_example_runs_and_is_softmax_attention():
    """The user guide's custom attention layer (docs/guide.md), run as printed, against dense softmax attention."""
    from .dist_cases import readme_block
    space = {"torch": torch}
    exec(readme_block("class DotAttention"), space)
    torch.manual_seed(0)
    layer = space["DotAttention"](5, 3)
    mask = random_mask(15, 15, 0.25, seed=9)
    h = torch.randn(15, 5)
    out = layer(operator(mask), h)
    score = layer.q(h) @ layer.k(h).t()
    alpha = torch.softmax(score.masked_fill(~torch.as_tensor(mask), float("-inf")), dim=1)
    torch.testing.assert_close(out, alpha @ layer.v(h), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo,world,method,heads", [
    ("1d-halo", 2, "random", 2), ("1d-halo", 3, "metis", 1), ("1d-halo", 4, "random", 3),
    ("1d", 2, "random", 1), ("1d", 3, "random", 2)])
def test_1d_algorithms_equal_serial(algo, world, method, heads):
    """Every rank's rows, every gradient and the 3-epoch loss curve of a 3-layer GAT on a 1D
    algorithm equal the serial run's (uneven parts: 41 rows), and the exchanges are counted."""
    from gnnpar.launcher.spawn import spawn
    from .dist_cases import gat_equivalence
    outs = spawn(gat_equivalence, world, args=(algo, 41, world == 3, method, heads),
                 timeout_s=240)
    for rank, out in enumerate(outs):
        for what in ("forward", "grads", "loss"):
            assert out[what] <= 1e-5, f"rank {rank} {what}: relative error {out[what]:.3g}"
    assert sum(out["bytes"] for out in outs) > 0


#: (algo, world, grid dims, replication, builder options, heads): every block algorithm, odd
#: and even worlds, both variants, the shards' parts (uneven: 41 rows) and the balanced layout
BLOCK_CASES = [
    ("3d", 1, (1, 1, 1), 1, {"layers": 3}, 2),
    ("2d", 2, (2, 1), 1, {"variant": "bcast"}, 3),
    ("2d", 4, (2, 2), 1, {"variant": "halo"}, 2),
    ("2d", 3, (1, 3), 1, {"variant": "halo", "permute": True}, 1),
    ("2d", 6, (3, 2), 1, {"variant": "bcast", "permute": True}, 2),
    ("1.5d", 6, None, 2, {"variant": "halo"}, 3),
    ("1.5d", 4, None, 2, {"variant": "bcast"}, 1),
    ("3d", 8, (2, 2, 2), 1, {"layers": 3, "permute": True}, 2),
    ("3d", 3, (3, 1, 1), 1, {"layers": 3}, 2),
    ("4d", 6, (1, 2, 3), 1, {"layers": 3}, 1),
]


@pytest.mark.parametrize("algo,world,dims,replication,kw,heads", BLOCK_CASES)
def test_block_algorithms_equal_serial(algo, world, dims, replication, kw, heads):
    """As the 1D test, on the block operators (kernels/edge_block.py): a row's edges spread
    over the out axis, its softmax's maximum and sum reduced over it."""
    from gnnpar.launcher.spawn import spawn
    from .dist_cases import gat_equivalence
    outs = spawn(gat_equivalence, world, args=(algo, 41, world == 3, "random", heads, dims,
                                               replication, kw), timeout_s=240)
    for rank, out in enumerate(outs):
        for what in ("forward", "grads", "loss"):
            assert out[what] <= 1e-5, f"rank {rank} {what}: relative error {out[what]:.3g}"
    assert (sum(out["bytes"] for out in outs) > 0) == (world > 1)  # one rank moves nothing


@pytest.mark.parametrize("algo,world,dims,replication,kw", [
    ("1d-halo", 2, None, 1, {}), ("2d", 3, (3, 1), 1, {"variant": "bcast"}),
    ("1.5d", 4, None, 2, {"variant": "halo"}), ("3d", 4, (1, 2, 2), 1, {"layers": 3})])
def test_readme_attention_layer_equals_serial_on_every_kind_of_operator(algo, world, dims,
                                                                        replication, kw):
    """The user guide's custom attention layer (written against the contract only, no algorithm
    named) trains to the serial run's outputs, gradients and loss curve on a 1D, a block and
    a 3D operator."""
    from gnnpar.launcher.spawn import spawn
    from .dist_cases import gat_equivalence
    outs = spawn(gat_equivalence, world, args=(algo, 41, world == 3, "random", 2, dims,
                                               replication, kw, "readme"), timeout_s=240)
    for rank, out in enumerate(outs):
        # the key bias's gradient is zero (a softmax does not see a row's constant shift): its
        # error is measured against the floor of "grads", 1% of the model's largest gradient
        for what in ("forward", "grads", "loss"):
            assert out[what] <= 1e-5, f"rank {rank} {what}: relative error {out[what]:.3g}"
    assert sum(out["bytes"] for out in outs) > 0


@pytest.mark.parametrize("heads,concat", [(1, True), (3, True), (2, False)])
def test_layer_equals_pyg_gatconv_with_the_same_weights(heads, concat):
    """gnnpar's GAT layer and PyG's GATConv (self loops added by PyG on the loop-free graph)
    with the same weights give the same output and input gradient."""
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(heads)
    mask = random_mask(30, 30, 0.15, seed=heads + 20)
    ours = GATLayer(6, 5, heads, concat)
    theirs = pyg.GATConv(6, 5, heads=heads, concat=concat)
    with torch.no_grad():
        ours.bias.normal_()
        theirs.lin.weight.copy_(ours.lin.weight)
        theirs.att_src.copy_(ours.att_src.view(1, heads, 5))
        theirs.att_dst.copy_(ours.att_dst.view(1, heads, 5))
        theirs.bias.copy_(ours.bias)
    rows, cols = np.nonzero(mask & ~np.eye(30, dtype=bool))
    edge_index = torch.as_tensor(np.stack([cols, rows]))  # source -> target
    h = torch.randn(30, 6, requires_grad=True)
    h2 = h.detach().clone().requires_grad_(True)
    out, want = ours(operator(mask), h), theirs(h2, edge_index)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    out.backward(g)
    want.backward(g)
    torch.testing.assert_close(h.grad, h2.grad, rtol=1e-5, atol=1e-5)


def test_bench_gat_script_runs_both_sides():
    """bench_single.py --model gat runs scripts/bench_gat.py: gnnpar and PyG side by side, DGL
    said not measured without its venv."""
    import json
    import subprocess
    import sys
    from .cli_util import ROOT
    res = subprocess.run([sys.executable, "scripts/bench_single.py", "--model", "gat",
                          "--dataset", "sbm:n=200,blocks=2,p_in=0.05,p_out=0.01", "--rounds", "1",
                          "--repeats", "1", "--warmup", "0", "--threads", "1",
                          "--dgl-venv", "/nonexistent-dgl-venv"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "gnnpar / PyG step time" in res.stdout
    assert "dgl: not measured (no side venv at /nonexistent-dgl-venv" in res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(out["results"]) == {"gnnpar", "pyg"}
    assert all(v["epoch_s"] > 0 for v in out["results"].values())


def test_bf16_autocast_and_a_single_row():
    """Under bf16 autocast (``--precision bf16``) the layer runs and stays near its float32
    output; a one-node graph (its self loop only) attends to itself."""
    torch.manual_seed(3)
    mask = random_mask(40, 40, 0.2, seed=4, empty_row=7)
    op = operator(mask)
    layer = GATLayer(8, 6, heads=2)
    h = torch.randn(40, 8, requires_grad=True)
    want = layer(op, h)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer(op, h)
    assert got.dtype == torch.bfloat16
    scale = want.abs().max()
    assert float(((got.float() - want).abs().max() / scale).detach()) < 3e-2
    got.float().sum().backward()
    assert h.grad is not None and torch.isfinite(h.grad).all()
    one = GATLayer(3, 4, heads=2, concat=False)
    x = torch.randn(1, 3)
    out = one(operator(np.ones((1, 1), bool)), x)
    z = (x @ one.lin.weight.t()).view(1, 2, 4).mean(dim=1)  # the softmax of one edge is 1
    torch.testing.assert_close(out, z + one.bias)


def test_gat_on_full_neighbourhood_blocks_equals_the_full_graph():
    """Mini batch: GAT on sampled blocks attends over each block's edges (softmax over the
    sampled neighbours, self loop included). With every neighbour sampled (fanout -1) the
    blocks hold each seed's whole 2-hop neighbourhood, so the model's seed rows and its
    parameter gradients equal the full-graph serial model's."""
    from gnnpar.sampling import NeighborSampler, SamplerConfig, Topology, batch_rng
    from gnnpar.sampling.blocks import block_operators
    from gnnpar.training.serial import SerialRuntime
    from .graphs import random_graph
    graph = random_graph(n=120, avg_deg=4, f=6, classes=3, seed=9)
    seeds = np.arange(3, 120, 7)
    blocks = NeighborSampler(Topology.from_graph(graph, ("gcn",)),
                             SamplerConfig((-1, -1), "gcn")).sample(seeds, batch_rng(1, 0, 0, 0))
    torch.manual_seed(0)
    model = build_model("gat", 6, 8, 3, 2, 0.0, heads=2)
    rt = SerialRuntime(graph, model.norm)
    x = rt.x[torch.from_numpy(np.asarray(blocks[0].src_ids))]
    got = model(block_operators(blocks, transpose=[True, True]), x)
    grads_got = torch.autograd.grad(got.square().sum(), list(model.parameters()))
    want = model(rt.op, rt.x)[torch.from_numpy(seeds)]
    grads_want = torch.autograd.grad(want.square().sum(), list(model.parameters()))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _repeated_entries(block) -> int:
    """Entries of ``block`` that repeat an earlier (row, column) pair of their row."""
    b = block.numpy()
    rows = np.repeat(np.arange(b.num_dst), np.diff(b.indptr))
    keys = rows * b.num_src + b.indices
    return int(keys.size - np.unique(keys).size)


def _sampled_blocks(replace: bool, fanout: int):
    """The seeds' block of a small graph, as the host sampler and the device sampler (on the
    CPU, its own hash draws) sample it."""
    from gnnpar.sampling import NeighborSampler, SamplerConfig, Topology, batch_rng
    from gnnpar.sampling.device_sampler import TorchBulkSampler, TorchTopology
    from gnnpar.sampling.draws import HashDraws
    from .graphs import random_graph
    topo = Topology.from_graph(random_graph(n=60, avg_deg=3, f=6, classes=3, seed=2), ("gcn",))
    cfg = SamplerConfig((fanout, fanout), "gcn", replace=replace)
    seeds = np.arange(0, 60, 4)
    host = NeighborSampler(topo, cfg).sample(seeds, batch_rng(0, 0, 0, 0))[-1]
    device = TorchBulkSampler(TorchTopology(topo, "cpu"), cfg).sample(
        [seeds], [HashDraws(3, 0, 0, 0, "cpu")])[0][-1]
    return host, device


@pytest.mark.parametrize("sampler", ["host", "device"])
def test_a_neighbour_drawn_twice_is_one_edge_of_the_softmax(sampler):
    """With replacement (``--replace``) a neighbour drawn twice is one edge of the softmax in
    every mode: GAT (and the user guide's attention layer) on a sampled block, as serial and
    data-parallel mini batch run it, equals the same layer on the block whose repeated
    entries are merged as a grouped block's shard merges them (kernels/bipartite.block_shard,
    one member) and the dense reference over the distinct sampled neighbours; so do the
    gradients."""
    from gnnpar.kernels.bipartite import block_shard
    from .dist_cases import readme_block
    pick = ("host", "device").index(sampler)
    block = _sampled_blocks(True, 6)[pick]
    assert _repeated_entries(block) > 10 and not block.distinct
    plain = _sampled_blocks(False, 2)[pick]
    assert _repeated_entries(plain) == 0 and plain.distinct
    b = block.numpy()
    shard = block_shard(b.indptr, b.indices, b.values, np.zeros(b.num_src, np.int64), 0, 1,
                        "gcn")
    rows = shard.indptr[:b.num_dst + 1]                   # rows >= num_dst of S are empty
    merged = SparseOperator(rows, shard.indices, shard.values["gcn"], (b.num_dst, b.num_src))
    mask = block.to_scipy().toarray() != 0
    space = {"torch": torch}
    exec(readme_block("class DotAttention"), space)
    torch.manual_seed(4)
    for layer in (GATLayer(6, 4, heads=2), space["DotAttention"](6, 5)):
        h = torch.randn(b.num_src, 6, requires_grad=True)
        outs = [layer(block.operator(), h), layer(merged, h)]
        if isinstance(layer, GATLayer):
            outs.append(dense_gat(layer, mask, h))
        g = torch.randn_like(outs[0])
        grads = [torch.autograd.grad(o, [h] + list(layer.parameters()), g) for o in outs]
        for out, grad in zip(outs[1:], grads[1:]):
            torch.testing.assert_close(outs[0], out, rtol=1e-5, atol=1e-6)
            for x, y in zip(grads[0], grad):
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def _train_losses(tmp_path, name, *argv):
    """Per-epoch losses and final test accuracy of the installed ``gnnpar-train ARGV`` run
    from ``tmp_path`` (no PYTHONPATH)."""
    import json
    import os
    import subprocess
    import sys
    exe = os.path.join(os.path.dirname(sys.executable), "gnnpar-train")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([exe, *argv, "--quiet", "--log-json", f"{name}.jsonl"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    recs = [json.loads(x) for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert recs[-1]["final"] is True
    return [r["loss"] for r in recs[:-1]], recs[-1]["test_acc"]


#: a small GAT in mini batch, dropout 0 so a run depends on its draws alone
GAT_MB = ["--mode", "minibatch", "--model", "gat", "--heads", "2", "--hidden", "8",
          "--epochs", "3", "--dropout", "0", "--lr", "0.02",
          "--dataset", "sbm:n=120,blocks=3,p_in=0.1,p_out=0.01"]


def test_gat_grouped_with_replacement_trains_the_serial_model(tmp_path):
    """``--replace``: a 2-rank group (one group, stream 0) samples the serial run's
    minibatches, so its per-epoch losses and accuracy are the serial run's: a neighbour
    drawn twice counts the same in the grouped block (merged) as in the serial one."""
    mb = GAT_MB + ["--fanouts", "4,4", "--batch-size", "16", "--replace"]
    serial, acc = _train_losses(tmp_path, "serial", *mb)
    grouped, acc_g = _train_losses(tmp_path, "grouped", *mb, "--nprocs", "2", "--algo", "2d",
                                   "--grid", "1x2")
    np.testing.assert_allclose(grouped, serial, rtol=1e-5)
    assert acc_g == acc and serial[-1] < serial[0]


def test_gat_data_parallel_trains_the_serial_model(tmp_path):
    """Data parallel on 2 ranks with whole neighbourhoods and one step an epoch (every rank
    all its seeds): each step's loss is the mean over every seed, as the serial run's, so
    the per-epoch losses and accuracy are the serial run's."""
    mb = GAT_MB + ["--fanouts=-1,-1", "--batch-size", "1000"]
    serial, acc = _train_losses(tmp_path, "serial", *mb)
    parallel, acc_p = _train_losses(tmp_path, "parallel", *mb, "--nprocs", "2")
    np.testing.assert_allclose(parallel, serial, rtol=1e-5)
    assert acc_p == acc and serial[-1] < serial[0]
