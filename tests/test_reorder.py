"""--reorder: the same graph renumbered (datasets/reorder.py), training unchanged up to
summation order, refused where shards already fix the order."""
import json

import numpy as np
import pytest

from gnnpar.datasets import load_dataset
from gnnpar.datasets.reorder import ORDERS, partition_order, reorder
from gnnpar.train import main

from .graphs import random_graph


@pytest.mark.parametrize("how", ORDERS)
def test_reordered_graph_is_the_same_graph(how):
    g = random_graph(80, 5, seed=3, weighted=True)
    r = reorder(g, how)
    if how == "none":
        assert r is g
        return
    order = r.meta["vertex_order"]
    assert sorted(order.tolist()) == list(range(g.num_nodes))
    dense = g.to_scipy().toarray()
    assert np.array_equal(r.to_scipy().toarray(), dense[np.ix_(order, order)])
    for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(r, name), np.asarray(getattr(g, name))[order]), name
    assert r.fingerprint() != g.fingerprint() and r.validate() is r
    if how == "degree":
        assert np.all(np.diff(r.degrees()) <= 0)


def test_rcm_narrows_the_band_of_a_power_law_graph():
    g = load_dataset("rmat:scale=10,ef=8")
    r = reorder(g, "rcm")

    def bandwidth(h):
        src, dst = h.edges()
        return np.abs(src - dst).mean()
    assert bandwidth(r) < 0.8 * bandwidth(g)


def test_partition_order_keeps_clusters_together():
    g = load_dataset("sbm:n=400,blocks=8,p_in=0.2,p_out=0.005,seed=2")
    order = partition_order(g, rows=50)
    assert sorted(order.tolist()) == list(range(g.num_nodes))
    pos = np.empty_like(order)
    pos[order] = np.arange(order.shape[0])
    src, dst = g.edges()

    def near(p):  # edges whose ends land within one cluster's span of each other
        return np.mean(np.abs(p[src] - p[dst]) < 50)
    shuffled = np.random.default_rng(0).permutation(g.num_nodes)
    assert near(pos) > 0.8 > 0.3 > near(shuffled)


def _final(tmp_path, name, *argv):
    log = tmp_path / f"{name}.jsonl"
    assert main(["--epochs", "3", "--dropout", "0", "--quiet", "--log-json", str(log),
                 *argv]) == 0
    return json.loads(open(log).readlines()[-1])


def test_training_is_unchanged_up_to_summation_order(tmp_path):
    base = _final(tmp_path, "none", "--reorder", "none")
    assert base["reorder"] == "none"
    assert _final(tmp_path, "auto")["reorder"] == "degree"  # the default, serial full batch
    for how in ("degree", "rcm", "partition", "auto"):
        assert _final(tmp_path, how, "--reorder", how)["loss"] == pytest.approx(base["loss"],
                                                                               rel=1e-5)
    dist = _final(tmp_path, "dist", "--reorder", "degree", "--algo", "1d-halo", "--nprocs", "2")
    assert dist["loss"] == pytest.approx(base["loss"], rel=1e-5) and dist["reorder"] == "degree"
    mb = _final(tmp_path, "mb", "--reorder", "rcm", "--mode", "minibatch", "--fanouts", "5,5",
                "--batch-size", "64")
    assert np.isfinite(mb["loss"]) and mb["reorder"] == "rcm"
    assert _final(tmp_path, "mb-auto", "--mode", "minibatch", "--fanouts", "5,5",
                  "--batch-size", "64")["reorder"] == "none"  # auto: degree only serial full


def test_reorder_refused_where_shards_fix_the_order(tmp_path, capsys):
    shards = tmp_path / "s"
    assert main(["--epochs", "1", "--quiet", "--algo", "1d", "--nprocs", "2",
                 "--partition-dir", str(shards)]) == 0
    assert main(["--epochs", "1", "--quiet", "--algo", "1d", "--nprocs", "2",
                 "--partition-dir", str(shards), "--reorder", "degree"]) == 2
    assert "--reorder degree applies when the shards are written" in capsys.readouterr().err
    # the default (auto) takes the shards as they are
    assert main(["--epochs", "1", "--quiet", "--algo", "1d", "--nprocs", "2",
                 "--partition-dir", str(shards)]) == 0


def test_auto_order_is_degree_only_for_a_single_process_full_batch_run(tmp_path):
    from gnnpar.training.shard_source import resolve_reorder, vertex_order
    from gnnpar.cli.spec import RunSpec
    spec = RunSpec.of()
    assert spec.data.reorder == "auto" and vertex_order(spec) == "none"  # unsettled: as given
    assert resolve_reorder(spec, True).data.reorder == "degree"
    assert resolve_reorder(spec, False).data.reorder == "none"  # mini batch, distributed
    assert resolve_reorder(spec.evolve(reorder="rcm"), False).data.reorder == "rcm"
    shards = tmp_path / "s"
    shards.mkdir()
    (shards / "meta.json").write_text("{}")
    assert resolve_reorder(spec.evolve(partition_dir=str(shards)), True).data.reorder == "none"
