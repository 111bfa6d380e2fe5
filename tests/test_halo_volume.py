"""Sparsity-aware 1D moves far fewer bytes than 1D all-gather on a well-partitioned graph
(exact per-rank epoch counts from the cost model, which the multi-rank tests prove equal to
what Comm measures)."""
from gnnpar.datasets import load_dataset
from gnnpar.kernels.cost_model import Structure, epoch_traffic
from gnnpar.partitioners import partition_graph


def epoch_bytes(graph, owner, parts, algo, widths):
    s = Structure.from_graph(graph, owner, parts)
    return int(epoch_traffic(s, algo, "gcn", widths).get("bytes").sum())


def test_metis_sbm_halo_is_at_most_a_fifth_of_allgather():
    n, blocks = 4000, 8
    p_in = 10 / (n / blocks - 1)          # mean in-block degree 10
    p_out = 0.5 / (n - n / blocks)        # mean cross-block degree 0.5
    g = load_dataset(f"sbm:n={n},blocks={blocks},p_in={p_in},p_out={p_out},feat=32,seed=2")
    part = partition_graph(g, 8, "metis", seed=0)
    widths = [32, 128, 128, 8]
    b1d = epoch_bytes(g, part.owner, 8, "1d", widths)
    halo = epoch_bytes(g, part.owner, 8, "1d-halo", widths)
    assert halo <= b1d / 5, (halo, b1d, halo / b1d)


def test_rmat_halo_still_moves_less():
    g = load_dataset("rmat:scale=11,ef=8,feat=16")
    part = partition_graph(g, 4, "metis", seed=0)
    widths = [16, 64, 16]
    assert epoch_bytes(g, part.owner, 4, "1d-halo", widths) < epoch_bytes(g, part.owner, 4, "1d", widths)
    rnd = partition_graph(g, 4, "random", seed=0)
    assert (epoch_bytes(g, part.owner, 4, "1d-halo", widths)
            < epoch_bytes(g, rnd.owner, 4, "1d-halo", widths))
