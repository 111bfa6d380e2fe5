"""Cost model of full-batch epochs: bytes and messages per rank, memory per rank, time.

Two modes, same formulas:

- *exact*: given the graph's structure (Â's union structure, self loops included) and the
  ownership of every vertex (the partition), :func:`epoch_traffic` returns per-rank bytes and
  messages of one training epoch (forward + backward SpMMs + the gradient all-reduce) that
  equal :class:`gnnpar.kernels.comm.Comm`'s counters exactly for every algorithm (the counting
  rules of comm.py's docstring are reproduced here collective by collective);
- *estimate*: with only n, m and an optional ``cut_fraction`` (share of non-zeros whose column
  another rank owns; default 1 − 1/p, a random partition), :func:`estimate_traffic` models the
  average rank with the same collectives. Distinct halo rows are estimated as
  w·(1 − e^(−e/w)) for e non-zeros spread over w candidate rows (uniform random graph).

An epoch per layer l with SpMM width f_l: the forward SpMM, and its backward when the SpMM's
input needs a gradient (not the first layer's when it aggregates the raw features, see
:func:`spmm_widths`). Evaluation passes (phase ``eval``) are not part of an epoch.

Time model (:class:`Machine`, every field settable): latency·messages + bytes/bandwidth +
SpMM and dense flops / rates. Defaults (documented in the fields) are a 2020s GPU cluster:
25 GB/s per rank, 5 µs per message, 2e11 sparse and 5e13 dense flop/s.

:func:`rank_algorithms` enumerates every algorithm and grid for a world size and returns them
ranked by modelled epoch time under a per-rank memory cap (``--algo auto``, ``gnnpar-plan``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

F32 = 4
ALGOS = ("1d", "1d-halo", "1.5d", "2d", "3d", "4d")


# ----------------------------------------------------------------- the model's workload
def spmm_widths(kind: str, widths: Sequence[int]):
    """[(f, needs_backward)] per layer: GCN and SAGE aggregate at min(f_in, f_out); the first
    layer's SpMM has no backward when it reads the raw features (f_in ≤ f_out)."""
    out = []
    for l, (fi, fo) in enumerate(zip(widths[:-1], widths[1:])):
        out.append((min(fi, fo), l > 0 or fi > fo))
    return out


def param_count(kind: str, widths: Sequence[int]) -> int:
    """Parameters of :class:`gnnpar.models.GNN` (GCN: W + b; SAGE: W_neigh + b + W_root)."""
    per = {"gcn": lambda a, b: a * b + b, "sage": lambda a, b: 2 * a * b + b}[kind]
    return int(sum(per(a, b) for a, b in zip(widths[:-1], widths[1:])))


def _chunk(numel: int, g: int, i):
    return numel // g + (np.asarray(i) < numel % g)


def allreduce_bytes(numel: int, p: int) -> np.ndarray:
    """Comm.all_reduce's count of a float32 tensor over p ranks, per rank."""
    if p == 1:
        return np.zeros(1, np.int64)
    return 2 * (numel - _chunk(numel, p, np.arange(p))) * F32


# ----------------------------------------------------------------- exact per-rank traffic
@dataclass
class Structure:
    """Â's non-zeros as (row, col) global ids and each vertex's owner rank (p ranks)."""

    rows: np.ndarray
    cols: np.ndarray
    owner: np.ndarray
    p: int

    @classmethod
    def from_graph(cls, graph, owner, p: int) -> "Structure":
        from gnnpar.datasets.normalize import union_structure
        indptr, indices, _ = union_structure(graph)
        rows = np.repeat(np.arange(graph.num_nodes, dtype=np.int64), np.diff(indptr))
        return cls(rows, np.asarray(indices, np.int64), np.asarray(owner, np.int64), p)

    @property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.owner, minlength=self.p).astype(np.int64)


def _plan(p, dest, item, item_owner):
    """Distinct (dest, item) pairs with a remote owner: (recv rows, send rows, recv msgs,
    send msgs) per rank — a :class:`HaloPlan` built by ``compact_plan`` or the 1D shards."""
    keep = item_owner != dest
    n = int(item.max(initial=0)) + 1
    key = np.unique(dest[keep] * n + item[keep])
    d, it = key // n, key % n
    # owner of each distinct item (items keep their owner whatever the destination)
    lookup = np.zeros(n, np.int64)
    lookup[item[keep]] = item_owner[keep]
    o = lookup[it]
    recv = np.bincount(d, minlength=p)
    send = np.bincount(o, minlength=p)
    pairs = np.unique(d * p + o)
    recv_msgs = np.bincount(pairs // p, minlength=p)
    send_msgs = np.bincount(pairs % p, minlength=p)
    return recv, send, recv_msgs, send_msgs


def _coll(g, present=True):
    return (g - 1) if (g > 1 and present) else 0


class _Exact:
    """Per-rank (bytes, messages) of one SpMM forward and backward at width f."""

    def __init__(self, s: Structure, algo: str, dims, variant: str, layers: int, rotate: bool):
        self.s, self.algo, self.dims, self.variant = s, algo, dims, variant
        self.layers, self.rotate = layers, rotate
        self.n_r = s.sizes
        getattr(self, "_setup_" + algo.replace(".", "").replace("-", "_"))()

    # 1d/1.5d/2d setups fill rows = (fwd, bwd) rows sent per rank per feature and msgs;
    # 3d keeps per-orientation counts, as its feature slices make bytes non-linear in f
    def _setup_1d(self):
        p, n = self.s.p, int(self.n_r.sum())
        self.rows = ((p - 1) * self.n_r, n - self.n_r)
        self.msgs = (np.full(p, _coll(p)), np.full(p, _coll(p)))

    def _setup_1d_halo(self):
        s = self.s
        recv, send, rm, sm = _plan(s.p, s.owner[s.rows], s.cols, s.owner[s.cols])
        self.rows, self.msgs = (send, recv), (sm, rm)

    def _setup_2d(self):
        s, (pr, pc) = self.s, self.dims
        q = np.arange(s.p)
        i, j = q // pc, q % pc
        ou, ov = s.owner[s.rows], s.owner[s.cols]
        if self.variant == "bcast":
            R = np.bincount(i, weights=self.n_r, minlength=pr).astype(np.int64)[i]
            C = np.bincount(j, weights=self.n_r, minlength=pc).astype(np.int64)[j]
            self.rows = ((pr - 1) * self.n_r + R - self.n_r, (pc - 1) * self.n_r + C - self.n_r)
            self.msgs = (np.full(s.p, _coll(pr) + _coll(pc)),) * 2
            return
        dest = (ou // pc) * pc + ov % pc
        ir, is_, irm, ism = _plan(s.p, dest, s.cols, ov)
        orr, os_, orm, osm = _plan(s.p, dest, s.rows, ou)
        self.rows = (is_ + orr, os_ + ir)
        self.msgs = (ism + orm, osm + irm)

    def _setup_15d(self):
        s, c = self.s, self.dims
        qn = s.p // c
        q = np.arange(s.p)
        i, k = q // c, q % c
        holder = (k == i % c)
        R = np.bincount(i, weights=self.n_r, minlength=qn).astype(np.int64)
        stage_rows = np.array([R[kk::c].sum() for kk in range(c)])[k]
        others = np.array([[self.n_r[ii * c + r] > 0 for r in range(c)] for ii in range(qn)])
        to_holder = np.where(holder, 0, self.n_r)
        to_msgs = np.where(holder | (self.n_r == 0) | (c == 1), 0, 1)
        from_msgs = np.where(holder, others[i].sum(1) - (self.n_r > 0), 0) if c > 1 else 0 * q
        rs_rows, rs_msgs = R[i] - self.n_r, _coll(c)
        if self.variant == "bcast":
            b_rows = np.where(holder, (qn - 1) * R[i], 0)
            b_msgs = np.where(holder, _coll(qn), 0)
            red_rows = stage_rows - np.where(holder, R[i], 0)
            fwd_stage, bwd_stage = (b_rows, b_msgs), (red_rows, np.full(s.p, _coll(qn)))
        else:
            ou, ov = s.owner[s.rows], s.owner[s.cols]
            j = ov // c
            dest = (ou // c) * c + j % c
            recv, send, rm, sm = _plan(s.p, dest, s.cols, j * c + j % c)
            fwd_stage, bwd_stage = (send, sm), (recv, rm)
        self.rows = (to_holder + fwd_stage[0] + rs_rows,
                     (c - 1) * self.n_r + bwd_stage[0] + np.where(holder, R[i] - self.n_r, 0))
        self.msgs = (to_msgs + fwd_stage[1] + rs_msgs,
                     _coll(c) + bwd_stage[1] + from_msgs)

    def _setup_3d(self):
        s = self.s
        self.orients = []
        dims = dict(zip(("row", "col", "depth"), self.dims))
        count = min(self.layers, 3) if (self.layers and self.rotate) else 1
        q = np.arange(s.p)
        coords = dict(zip(("row", "col", "depth"), np.unravel_index(q, self.dims)))
        for k in range(count):
            roles = ("row", "col", "depth")[k:] + ("row", "col", "depth")[:k]
            X, Y, Z = roles
            px, py, pz = dims[X], dims[Y], dims[Z]
            x, y, z = coords[X], coords[Y], coords[Z]
            Nxy = np.bincount(x * py + y, weights=self.n_r, minlength=px * py).astype(np.int64)
            R = np.bincount(x, weights=self.n_r, minlength=px).astype(np.int64)
            C = np.bincount(y, weights=self.n_r, minlength=py).astype(np.int64)
            # piece of each non-zero: position of its row in R_x (y-major, z-minor ranks)
            ou, ov = s.owner[s.rows], s.owner[s.cols]
            start = np.zeros(s.p, np.int64)
            for xv in range(px):
                members = q[x == xv][np.argsort(y[x == xv] * pz + z[x == xv], kind="stable")]
                start[members] = np.concatenate([[0], np.cumsum(self.n_r[members])])[:-1]
            by_owner = np.argsort(s.owner, kind="stable")
            local = np.empty(s.owner.shape[0], np.int64)
            first = np.concatenate([[0], np.cumsum(self.n_r)])[:-1]
            local[by_owner] = np.arange(by_owner.shape[0]) - first[s.owner[by_owner]]
            pos = start[ou] + local[s.rows]
            bounds = (R[x[ou]][:, None] * np.arange(pz + 1)[None, :]) // pz
            piece = (bounds[:, 1:] <= pos[:, None]).sum(1)
            dest = np.ravel_multi_index(
                tuple({X: x[ou], Y: y[ov], Z: piece}[a] for a in ("row", "col", "depth")),
                self.dims)
            nnz = np.bincount(dest, minlength=s.p)
            rows_z = (R[x] * (z + 1)) // pz - (R[x] * z) // pz
            self.orients.append(dict(pz=pz, px=px, py=py, z=z, Nxy=Nxy[x * py + y], R=R[x],
                                     C=C[y], nnz=nnz, rows_z=rows_z,
                                     zgroup=np.stack([np.ravel_multi_index(tuple(
                                         {X: x, Y: y, Z: np.full(s.p, zz)}[a]
                                         for a in ("row", "col", "depth")), self.dims)
                                         for zz in range(pz)], 1)))

    _setup_4d = _setup_3d  # d = 1 in full batch: the 3d group is the world

    def spmm(self, f: int, layer: int):
        """(fwd bytes, fwd msgs, bwd bytes, bwd msgs) per rank."""
        if self.algo not in ("3d", "4d"):
            return (self.rows[0] * f * F32, self.msgs[0], self.rows[1] * f * F32, self.msgs[1])
        o = self.orients[layer % len(self.orients)]
        pz, px, py, z = o["pz"], o["px"], o["py"], o["z"]
        wb = [(f * k) // pz for k in range(pz + 1)]
        w = np.diff(wb)
        wz = w[z]
        n_me = self.n_r
        nz = self.n_r[o["zgroup"]]                       # (p, pz) owned rows of (x, y, ·)
        not_me = np.arange(pz)[None, :] != z[:, None]
        split_b = (n_me[:, None] * w[None, :] * not_me).sum(1) * F32
        split_m = ((n_me[:, None] * w[None, :] > 0) & not_me).sum(1)
        join_b = (nz * wz[:, None] * not_me).sum(1) * F32
        join_m = ((nz * wz[:, None] > 0) & not_me).sum(1)
        a_fwd = _coll(pz) * (8 * (o["rows_z"] + 1) + 12 * o["nnz"])
        a_bwd = _coll(pz) * (8 * (o["C"] + 1) + 12 * o["nnz"])
        fwd_b = (split_b + _coll(px) * o["Nxy"] * wz * F32 + a_fwd
                 + (o["R"] - o["Nxy"]) * wz * F32 * (py > 1) + join_b)
        bwd_b = (split_b + _coll(py) * o["Nxy"] * wz * F32 + a_bwd
                 + (o["C"] - o["Nxy"]) * wz * F32 * (px > 1) + join_b)
        fwd_m = split_m + _coll(px) + 3 * _coll(pz) + _coll(py) + join_m
        bwd_m = split_m + _coll(py) + 3 * _coll(pz) + _coll(px) + join_m
        return fwd_b, fwd_m, bwd_b, bwd_m


def epoch_traffic(structure: Structure, algo: str, kind: str, widths: Sequence[int], dims=None,
                  variant: str = "halo", layers: int = 0, rotate: bool = True) -> Dict[str, np.ndarray]:
    """Exact per-rank ``bytes`` and ``messages`` of one epoch (``dims``: (pr, pc) for 2d, c for
    1.5d, (px, py, pz) for 3d/4d; ``layers``/``rotate`` as the 3d builder)."""
    p = structure.p
    ex = _Exact(structure, algo, dims, variant, layers, rotate)
    nbytes = np.zeros(p, np.int64)
    msgs = np.zeros(p, np.int64)
    for l, (f, back) in enumerate(spmm_widths(kind, widths)):
        fb, fm, bb, bm = ex.spmm(f, l)
        nbytes += fb + (bb if back else 0)
        msgs += fm + (bm if back else 0)
    P = param_count(kind, widths)
    nbytes += allreduce_bytes(P, p)
    msgs += 2 * _coll(p)
    return {"bytes": nbytes, "messages": msgs}


# ----------------------------------------------------------------- estimates (no partition)
def _distinct(e: float, w: float) -> float:
    """Expected distinct rows hit by e uniform non-zeros over w candidate rows."""
    return w * (1.0 - np.exp(-e / w)) if w > 0 and e > 0 else 0.0


def _partners(rows: float, g: int) -> float:
    return (g - 1) * (1.0 - np.exp(-rows / (g - 1))) if g > 1 else 0.0


def estimate_traffic(n: int, m: int, p: int, algo: str, kind: str, widths: Sequence[int],
                     dims=None, variant: str = "halo", cut_fraction: Optional[float] = None
                     ) -> Dict[str, float]:
    """Average-rank ``bytes``, ``messages`` per epoch and ``recv_rows`` (rows of H a rank holds
    beyond its own, for memory) from n, m and the share of non-zeros with a remote column."""
    nr, mr = n / p, m / p
    cut = (1.0 - 1.0 / p) if cut_fraction is None else float(cut_fraction)
    scale = cut / (1.0 - 1.0 / p) if p > 1 else 0.0
    per_f, fixed3d = None, None
    if algo == "1d":
        per_f = ((p - 1) * nr, n - nr, _coll(p), _coll(p), n)
    elif algo == "1d-halo":
        h = _distinct(cut * mr, n - nr)
        k = _partners(cut * mr, p)
        per_f = (h, h, k, k, h)
    elif algo == "2d":
        pr, pc = dims
        R, C = n / pr, n / pc
        if variant == "bcast":
            per_f = ((pr - 1) * nr + R - nr, (pc - 1) * nr + C - nr, _coll(pr) + _coll(pc),
                     _coll(pr) + _coll(pc), R + C)
        else:
            hin = _distinct(mr * scale * (1 - 1 / pr), C - nr)
            hout = _distinct(mr * scale * (1 - 1 / pc), R - nr)
            k = _partners(mr * scale * (1 - 1 / pr), pr) + _partners(mr * scale * (1 - 1 / pc), pc)
            per_f = (hin + hout, hin + hout, k, k, hin + hout)
    elif algo == "1.5d":
        c = int(dims)
        q, R = p // c, n * c / p
        base_f = nr * (c - 1) / c + R - nr
        base_b = (c - 1) * nr + (R - nr) / c
        mf, mb = (1 if c > 1 else 0) + _coll(c), 2 * _coll(c)
        if variant == "bcast":
            per_f = (base_f + (q - 1) * R / c, base_b + n / c - R / c, mf + _coll(q) / c,
                     mb + _coll(q), n / c)
        else:
            h = _distinct(mr * scale * (1 - 1 / q), n / c)
            k = _partners(mr * scale * (1 - 1 / q), q)
            per_f = (base_f + h, base_b + h, mf + k, mb + k, h + R)
    elif algo in ("3d", "4d"):
        px, py, pz = dims
        R, C, Nxy = n / px, n / py, n / (px * py)
        a_f = _coll(pz) * (8 * (R / pz + 1) + 12 * mr)
        a_b = _coll(pz) * (8 * (C + 1) + 12 * mr)
        fixed3d = (a_f, a_b, R, C, Nxy)
    else:
        raise ValueError(f"unknown algorithm {algo!r}")
    nbytes = msgs = 0.0
    recv_rows = 0.0
    for f, back in spmm_widths(kind, widths):
        if per_f is not None:
            fb, bb, fm, bm, rr = per_f
            nbytes += (fb + (bb if back else 0)) * f * F32
            msgs += fm + (bm if back else 0)
            recv_rows = max(recv_rows, rr * f)
        else:
            a_f, a_b, R, C, Nxy = fixed3d
            wz = f / pz
            split = nr * f * (pz - 1) / pz * F32 * 2
            fb = split + ((px - 1) * Nxy + (R - Nxy)) * wz * F32 + a_f
            bb = split + ((py - 1) * Nxy + (C - Nxy)) * wz * F32 + a_b
            nbytes += fb + (bb if back else 0)
            k = 2 * _coll(pz) + _coll(px) + _coll(py) + 3 * _coll(pz)
            msgs += k * (2 if back else 1)
            recv_rows = max(recv_rows, (R + C) * wz)
    nbytes += float(allreduce_bytes(param_count(kind, widths), p).mean())
    msgs += 2 * _coll(p)
    return {"bytes": nbytes, "messages": msgs, "recv_rows": recv_rows}


# ----------------------------------------------------------------- memory and time
@dataclass
class Machine:
    """Figures of the time model (override any).

    bandwidth: bytes/s a rank sends (default 25e9, ≈ 200 Gb/s InfiniBand per GPU).
    latency: seconds per message (default 5e-6).
    spmm_rate: sparse multiply-adds/s ×2, i.e. flop/s of SpMM (default 2e11, memory-bound).
    dense_rate: flop/s of the dense layers (default 5e13).
    """

    bandwidth: float = 25e9
    latency: float = 5e-6
    spmm_rate: float = 2e11
    dense_rate: float = 5e13


def memory_bytes(n: int, m: int, p: int, algo: str, widths: Sequence[int], recv_feat_rows: float,
                 dims=None, layers: int = 0) -> float:
    """Approximate peak bytes per rank: Â and Âᵀ as CSR (12 bytes a non-zero, 8 a row pointer;
    3d: one piece per orientation used plus the gathered block), owned activations and their
    gradients for every layer, and the received H rows of the widest SpMM."""
    nr, mr = n / p, m / p
    a = 2 * (12 * mr + 8 * nr)
    if algo in ("3d", "4d"):
        px, py, pz = dims
        a = a * (min(layers, 3) if layers else 1) + 12 * m / (px * py) + 8 * n / px
    acts = 2 * F32 * nr * sum(fi + fo for fi, fo in zip(widths[:-1], widths[1:]))
    return a + acts + F32 * recv_feat_rows


def epoch_time(nbytes: float, msgs: float, n: int, m: int, p: int, kind: str,
               widths: Sequence[int], machine: Machine) -> float:
    spmm = sum(2 * (m / p) * f * (2 if back else 1) for f, back in spmm_widths(kind, widths))
    dense = sum(6 * (n / p) * fi * fo for fi, fo in zip(widths[:-1], widths[1:]))
    return (msgs * machine.latency + nbytes / machine.bandwidth + spmm / machine.spmm_rate
            + dense / machine.dense_rate)


def _factorisations(p: int, k: int):
    if k == 1:
        yield (p,)
        return
    for d in range(1, p + 1):
        if p % d == 0:
            for rest in _factorisations(p // d, k - 1):
                yield (d,) + rest


def candidates(p: int):
    """(algo, dims, variant) for every algorithm and grid at world size p (4d = 3d when
    full-batch, so it is not listed twice)."""
    yield "1d", None, "bcast"
    yield "1d-halo", None, "halo"
    for c in range(2, p + 1):
        if p % c == 0:
            for v in ("halo", "bcast"):
                yield "1.5d", c, v
    for dims in _factorisations(p, 2):
        for v in ("halo", "bcast"):
            yield "2d", dims, v
    for dims in _factorisations(p, 3):
        yield "3d", dims, "-"


def rank_algorithms(n: int, m: int, widths: Sequence[int], world: int, kind: str = "gcn",
                    mem_cap: Optional[float] = None, machine: Optional[Machine] = None,
                    cut_fraction: Optional[float] = None, layers: Optional[int] = None) -> List[dict]:
    """Every (algorithm, grid, variant) at ``world`` ranks with modelled bytes, messages, memory
    and epoch time per (average) rank, best first; rows over ``mem_cap`` bytes come last with
    ``fits`` False. Needs only n, m (and optionally the cut fraction): works for any world."""
    machine = machine or Machine()
    layers = len(widths) - 1 if layers is None else layers
    rows = []
    for algo, dims, variant in candidates(world):
        t = estimate_traffic(n, m, world, algo, kind, widths, dims, variant, cut_fraction)
        mem = memory_bytes(n, m, world, algo, widths, t["recv_rows"], dims, layers)
        secs = epoch_time(t["bytes"], t["messages"], n, m, world, kind, widths, machine)
        grid = ("x".join(map(str, dims)) if isinstance(dims, tuple)
                else (f"{world // dims}x{dims}" if dims else str(world)))
        rows.append({"algo": algo, "grid": grid, "variant": variant, "replication":
                     dims if algo == "1.5d" else 1, "bytes": t["bytes"],
                     "messages": t["messages"], "memory": mem, "time_s": secs,
                     "fits": bool(mem_cap is None or mem <= mem_cap)})
    rows.sort(key=lambda r: (not r["fits"], r["time_s"]))
    return rows
