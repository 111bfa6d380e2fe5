"""The wire format (``--comm-dtype``), padded byte counts and asynchronous collectives of
:mod:`gnnpar.kernels.comm`.

- bf16/fp16 on the wire halve the forward and backward bytes exactly, leave the gradient
  all-reduce in fp32, and keep every algorithm's output and gradients close to serial;
- a low-precision reduce-scatter sums in fp32;
- padded counts are (g−1)·largest chunk for all-gather and reduce-scatter;
- an issued collective's ``wait()`` gives what the blocking call gives, and the exposed and
  total seconds are counted.
"""
import pytest
import torch

from gnnpar.datasets import DEFAULT_SPEC, load_dataset
from gnnpar.distributed import DistRuntime
from gnnpar.kernels.build import make_grid
from gnnpar.kernels.comm import WIRE_DTYPES, Comm
from gnnpar.kernels.grid import ProcessGrid
from gnnpar.models import GNN
from gnnpar.partitioners import partition_graph
from gnnpar.partitioners.shard_build import build_shard
from gnnpar.serial import SerialRuntime
from gnnpar.spawn import spawn
from gnnpar.trainer import TrainConfig, fit

from .dist_cases import _loss_and_grads, rel_err
from .graphs import random_graph

H, B = {"variant": "halo"}, {"variant": "bcast"}
# (label, algo, grid dims, replication, builder options) at 4 ranks
CASES = [("1d", "1d", None, 1, {}), ("1d-halo", "1d-halo", None, 1, {}),
         ("1.5d-halo", "1.5d", None, 2, H), ("1.5d-bcast", "1.5d", None, 2, B),
         ("2d-halo", "2d", (2, 2), 1, H), ("2d-bcast", "2d", (2, 2), 1, B),
         ("3d", "3d", (1, 2, 2), 1, {"layers": 3})]


def _phase_bytes(comm):
    out = {}
    for (axis, phase), b in comm.bytes.items():
        out[phase] = out.get(phase, 0) + b
    return out


def wire_body(rank, world):
    g = random_graph(n=70, f=6, classes=3, seed=11)
    shard = build_shard(g, partition_graph(g, world, "random", seed=3), rank, norms=("gcn",))
    torch.manual_seed(0)
    model = GNN("gcn", 6, 8, 3, layers=3, dropout=0.0)
    rt_s = SerialRuntime(g, model.norm)
    count = float(rt_s.masks["train"].sum())
    out_s, grads_s = _loss_and_grads(model, rt_s, count)
    res = {}
    for label, algo, dims, replication, kw in CASES:
        for name in ("fp32", "bf16", "fp16"):
            rt = DistRuntime(make_grid(algo, world, dims, replication), shard, algo,
                             model.norm, "cpu", WIRE_DTYPES[name], **kw)
            rt.comm.reset()
            out_d, grads_d = _loss_and_grads(model, rt, count)
            ids = torch.as_tensor(rt.global_ids)
            res[label, name] = {
                "bytes": _phase_bytes(rt.comm),
                "forward": rel_err(out_d, out_s[ids]),
                "grads": max(rel_err(a, b) for a, b in zip(grads_d, grads_s)),
                "cos": min(float(torch.nn.functional.cosine_similarity(
                    a.flatten(), b.flatten(), dim=0)) for a, b in zip(grads_d, grads_s)),
                "dtype": str(out_d.dtype)}
    return res


@pytest.fixture(scope="module")
def wire_results():
    return spawn(wire_body, 4, timeout_s=240)


@pytest.mark.parametrize("label", [c[0] for c in CASES])
def test_low_precision_wire_halves_bytes_and_stays_close(wire_results, label):
    for rank, res in enumerate(wire_results):
        full = res[label, "fp32"]
        assert full["forward"] < 1e-5 and full["grads"] < 1e-5, full
        for name, tol in (("bf16", 1.5e-2), ("fp16", 3e-3)):
            low = res[label, name]
            for phase in ("forward", "backward"):
                # 3d also gathers pieces of Â (indices, and values kept exact) in these
                # phases; its feature traffic halves
                want = full["bytes"].get(phase, 0)
                got = low["bytes"].get(phase, 0)
                if label != "3d":
                    assert 2 * got == want, (rank, name, phase, got, want)
                else:
                    assert want / 2 <= got < want or want == 0, (rank, name, phase, got, want)
            assert low["bytes"].get("grad_sync") == full["bytes"].get("grad_sync")
            assert low["dtype"] == "torch.float32"
            assert low["forward"] < tol, (rank, name, low)
            # partial sums rounded to bf16 can flip a ReLU whose input nearly cancels, so bf16
            # gradients are checked by direction (training accuracy: test_wire_accuracy)
            assert (low["grads"] < tol) if name == "fp16" else (low["cos"] > 0.99), (rank, low)
            assert low["forward"] > 0, "the wire rounded nothing: the test would be blind"


def collectives_body(rank, world):
    comm = Comm(ProcessGrid.create({"row": world}))
    sizes = [1, 2, 4][:world]
    torch.manual_seed(rank)
    mine = torch.randn(sizes[rank], 3)
    out = {}
    with comm.in_phase("forward"):
        blocking = comm.all_gather(mine, "row", sizes)
        issued = comm.start_all_gather(mine, "row", sizes)
        out["gather_same"] = all(torch.equal(a, b) for a, b in zip(blocking, issued.wait()))
        out["gather_padded"] = dict(comm.padded)
        out["gather_bytes"] = dict(comm.bytes)
        comm.reset()
        full = torch.randn(sum(sizes), 3, generator=torch.Generator().manual_seed(rank))
        exact = comm.reduce_scatter(full.double(), "row", sizes)
        out["rs_padded"] = dict(comm.padded)
        out["rs_bytes"] = dict(comm.bytes)
        low = Comm(ProcessGrid.create({"row": world}), torch.bfloat16)
        with low.in_phase("backward"):
            summed = low.reduce_scatter(full, "row", sizes)
        every = [torch.randn(sum(sizes), 3, generator=torch.Generator().manual_seed(r))
                 for r in range(world)]
        mine_rows = slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))
        total = sum(t.double() for t in every)[mine_rows]
        rounded = sum(t.bfloat16().double() for t in every)[mine_rows]
        out["rs_exact_err"] = float((exact - total).abs().max())
        out["rs_low_err"] = float((summed.double() - rounded).abs().max())
        out["rs_low_dtype"] = str(summed.dtype)
        out["seconds"] = (comm.seconds, comm.total_seconds)
    return out


def test_padded_counts_async_results_and_fp32_sums():
    world, sizes, row = 3, [1, 2, 4], 3 * 4
    for rank, out in enumerate(spawn(collectives_body, world, timeout_s=120)):
        assert out["gather_same"]
        key = ("row", "forward")
        # two all-gathers: logical (g-1)·mine, padded (g-1)·largest
        assert out["gather_bytes"][key] == 2 * 2 * sizes[rank] * row
        assert out["gather_padded"][key] == 2 * 2 * max(sizes) * row
        assert out["rs_bytes"][key] == (sum(sizes) - sizes[rank]) * 3 * 8
        assert out["rs_padded"][key] == 2 * max(sizes) * 3 * 8
        assert out["rs_exact_err"] < 1e-12
        # bf16 on the wire, summed in fp32: only the fp32 rounding of the sum is left
        assert out["rs_low_err"] < 1e-5 and out["rs_low_dtype"] == "torch.float32"
        assert out["seconds"][0] > 0 and out["seconds"][1] > 0


def accuracy_body(rank, world):
    g = load_dataset(DEFAULT_SPEC)
    shard = build_shard(g, partition_graph(g, world, "random", seed=3), rank, norms=("gcn",))
    acc = {}
    for name in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = GNN("gcn", g.num_features, 64, g.num_classes, layers=2, dropout=0.5)
        torch.manual_seed(rank + 1)
        rt = DistRuntime(make_grid("1.5d", world, None, 2), shard, "1.5d", model.norm, "cpu",
                         WIRE_DTYPES[name], variant="halo")
        acc[name] = fit(model, rt, TrainConfig(epochs=100))[-1]["test_acc"]
    return acc


def test_wire_accuracy_on_the_default_sbm_within_half_a_point():
    # 1.5d: the algorithm whose bf16 gradients differ most from serial (partial sums on the
    # wire); 400 test nodes, so half a point is 2 nodes
    acc = spawn(accuracy_body, 2, timeout_s=240)[0]
    assert acc["fp32"] > 0.9, acc  # the run learns: the comparison means something
    assert abs(acc["bf16"] - acc["fp32"]) <= 0.005, acc
