"""One rank of a launcher test: bootstrap, gloo all-reduce, a 1D SpMM checked against serial.

Run by every launcher test (mpirun, srun under the SLURM fixture, the two network namespaces,
plain loopback)::

    python tests/rank_probe.py --out DIR [--n 13] [--f 3]

Each rank writes ``DIR/rank-<r>.json``: how it was launched, the all-reduce sum, the largest
error of its rows of Z = A·H and of dH = Aᵀ·G against the serial product, and those rows
themselves (so two launches can be compared exactly), and whether the process groups and
their threads were released when it shut down.
"""
import argparse
import gc
import json
import os
import socket
import sys
import weakref

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gnnpar.launcher import bootstrap  # noqa: E402
from gnnpar.launcher.bootstrap import detect_world, init_distributed, shutdown  # noqa: E402
from gnnpar.training.adam import FusedAdam  # noqa: E402


def block_sizes(n: int, p: int):
    return [n // p + (1 if r < n % p else 0) for r in range(p)]


def problem(n: int, f: int):
    """A fixed sparse A (n × n, ~30 % dense), H (n × f) and an upstream gradient G."""
    rng = np.random.default_rng(7)
    a = (rng.random((n, n)) < 0.3) * rng.uniform(0.5, 1.5, (n, n))
    np.fill_diagonal(a, 1.0)
    h = rng.normal(size=(n, f))
    g = rng.normal(size=(n, f))
    return a.astype(np.float32), h.astype(np.float32), g.astype(np.float32)


def probe(info, ctx, args):
    """The record of this rank's checks, and weak references to the process groups it used
    (the world's and the grid's), which must be gone once the rank has shut down."""
    import torch.distributed as dist
    from gnnpar.kernels.comm import Comm
    from gnnpar.kernels.grid import ProcessGrid
    from gnnpar.kernels.spmm_1d import Op1D
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    a, h, g = problem(args.n, args.f)
    sizes = block_sizes(args.n, world)
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    rows = a[lo:hi]
    indptr = np.concatenate([[0], np.cumsum((rows != 0).sum(1))]).astype(np.int64)
    indices = np.nonzero(rows)[1].astype(np.int64)
    values = rows[rows != 0].astype(np.float32)
    grid = ProcessGrid.create({"row": world})
    op = Op1D(Comm(grid), indptr, indices, values, sizes)
    h_r = torch.from_numpy(h[lo:hi].copy()).requires_grad_(True)
    z_r = op(h_r)
    (z_r * torch.from_numpy(g[lo:hi].copy())).sum().backward()
    FusedAdam([h_r]).step()  # as a trainer on the CPU does (torch.optim's would import dynamo)
    z_ref = (a.astype(np.float64) @ h.astype(np.float64))[lo:hi]
    dh_ref = (a.T.astype(np.float64) @ g.astype(np.float64))[lo:hi]
    rec = {"source": info.source, "rank": rank, "world_size": world,
           "local_rank": info.local_rank, "master": f"{info.master_addr}:{info.master_port}",
           "backend": ctx.backend, "host": socket.gethostname(), "pid": os.getpid(),
           "all_reduce": float(total[0]),
           "z_err": float(np.abs(z_r.detach().numpy() - z_ref).max()),
           "dh_err": float(np.abs(h_r.grad.numpy() - dh_ref).max()),
           "z": z_r.detach().tolist(), "dh": h_r.grad.tolist()}
    groups = [dist.group.WORLD] + [grp for grp in grid.groups.values() if grp is not None]
    return rec, [weakref.ref(grp) for grp in groups]


def released(groups) -> dict:
    """After shutdown: are the process groups freed, and which of their threads (gloo's, the
    rendezvous store's; Linux names them) still run? Left over, they are torn down at
    interpreter exit, where that can abort the process."""
    gc.collect()
    task = "/proc/self/task"
    names = [open(os.path.join(task, t, "comm")).read().strip()
             for t in os.listdir(task)] if os.path.isdir(task) else []
    return {"groups_freed": all(ref() is None for ref in groups),
            "threads": sorted(n for n in names if "gloo" in n or "tcpstore" in n)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=13)
    ap.add_argument("--f", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    info = detect_world()
    again = detect_world()  # as gnnpar's launch does: the same world, no second rendezvous
    stores = len(bootstrap._MPI_STORES)  # mpirun: rendezvous stores open before joining
    ctx = init_distributed(info, "auto", timeout=args.timeout)
    try:
        rec, groups = probe(info, ctx, args)
    finally:
        shutdown()
    rec.update(detected_again=again == info, mpi_stores=stores, released=released(groups))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank-{rec['rank']}.json"), "w") as fh:
        json.dump(rec, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
