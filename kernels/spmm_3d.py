"""3D SpMM on any ``px × py × pz`` grid (axes ``row`` × ``col`` × ``depth``), features split
over the third axis, Â sharded so each rank holds ≈ m/p non-zeros, per-layer axis rotation.

Z = Â · H for the rows each rank owns (a seeded random balanced set with ``permute=True``,
what ``gnnpar-train`` runs since it balances Â's non-zeros over the blocks: max/mean 1.09-1.12
on rmat-13 at 2x2x2 against 4.1-4.2 for METIS parts; or its 1D part, the builder's default),
all f features.

An *orientation* gives the grid axes three roles: X splits Â's rows, Y Â's columns (the
reduction), Z the features and Â's storage. For the rank at (x, y, z) in those roles:

- R_x = rows owned by the ranks (x, ·, ·), ordered y-major then z (|R_x| ≈ n/px);
- C_y = rows owned by the ranks (·, y, ·), ordered x-major then z (|C_y| ≈ n/py);
- F_z = features [f·z/pz, f·(z+1)/pz);
- stored: piece z of Â[R_x, C_y] — rows [|R_x|·z/pz, |R_x|·(z+1)/pz) — and its transpose.

Forward   1. all-to-all over Z: rows of (x, y, ·), features F_z;
          2. all-gather over X → H[C_y, F_z];
          3. all-gather of the Â pieces over Z → Â[R_x, C_y] (freed after the product;
             issued before step 1, so it travels while the features are exchanged);
          4. Y = Â[R_x, C_y] · H[C_y, F_z];
          5. reduce-scatter over Y → rows of (x, y, ·), features F_z;
          6. all-to-all over Z → owned rows, all features.
Backward  the transposes in reverse: all-to-all over Z, all-gather over Y, Σ_z' Âᵀ pieces
          (gathered over Z) · G, reduce-scatter over X, all-to-all over Z.

Words sent per rank per SpMM (n_me owned rows, N_xy = rows of (x, y, ·), nnz_z of the piece):
f·n_me·(pz−1)/pz·2 (the two all-to-alls, exactly: Σ of the slices sent to the others)
+ (px−1)·N_xy·|F_z| (all-gather) + (|R_x| − N_xy)·|F_z| (reduce-scatter)
+ (pz−1)·(8·(rows_z + 1) + 12·nnz_z) bytes of Â (indptr, int64 indices, float32 values)
≈ 3m/p^(2/3) + nf/(py·pz) + nf/(px·pz) + 2nf/p words of 4 bytes for a cube (an int64 index
and a float32 value are 3 words per non-zero).
The backward moves the same amounts with X and Y swapped and Âᵀ pieces (indptr |C_y| + 1).

Per-layer rotation: layer l uses roles (X, Y, Z) = the axes (row, col, depth) rotated by l, so
on a non-cubic grid each axis in turn carries the feature split and the A traffic. Every
orientation keeps the same owned-row layout on entry and exit, so layers need no
redistribution; the price is one Â piece per orientation used (≤ 3·m/p). ``layers=0`` (or
``rotate=False``) builds one orientation shared by every layer.

Shapes: h, Z (n_me, f); piece (rows_z, |C_y|); Âᵀ piece (|C_y|, rows_z).
"""
from __future__ import annotations

import numpy as np
import torch

from gnnpar.datasets import InputError

from .blocks import (coo_to_csr, coords_of, exchange, layout_options, rank_of, shard_entries,
                     world_axes)
from .comm import Comm
from .cost_attention import Moves
from .cost_terms import (F32, Cost, coll, distinct, factorisations, gather_padding, partners,
                         plan_counts, reduce_padding)
from .cpu_spmm import csr_mm
from .dist_op import DistOperator, shard_values
from .edge_block import cube_edges
from .entry import Algorithm, GroupRule, group_of_grid, layers_option
from .local import transpose_csr
from .spmm_2d import attach_ownership, ownership

AXES3 = ("row", "col", "depth")


def orientation(layer: int):
    k = layer % 3
    return AXES3[k:] + AXES3[:k]


def _bounds(total: int, parts: int):
    return [(total * z) // parts for z in range(parts + 1)]


class Op3D(DistOperator):
    """One orientation of the 3D operator (see the module docstring)."""

    def __init__(self, comm: Comm, roles, own, rows, cols, vals, device=None):
        grid = comm.grid
        self.comm = comm
        self.X, self.Y, self.Z = roles
        self.pz = grid.shape[self.Z]
        x, y, z = (grid.coord(a) for a in roles)
        sz = {a: grid.shape[a] for a in roles}

        def at(**c):
            return int(rank_of(grid, {**grid.coords, **c}))
        self.r_ranks = [at(**{self.X: x, self.Y: b, self.Z: c})
                        for b in range(sz[self.Y]) for c in range(sz[self.Z])]
        self.c_ranks = [at(**{self.X: a, self.Y: y, self.Z: c})
                        for a in range(sz[self.X]) for c in range(sz[self.Z])]
        self.z_sizes = own.sizes(grid.ranks_of(self.Z))       # owned rows of (x, y, ·)
        self.num_src = self.num_dst = self.z_sizes[z]
        # rows of (a, y, ·) for each a, of (x, b, ·) for each b: the X / Y collective chunks
        self.xy_sizes_x = [sum(own.sizes(self.c_ranks[a * self.pz:(a + 1) * self.pz]))
                           for a in range(sz[self.X])]
        self.xy_sizes_y = [sum(own.sizes(self.r_ranks[b * self.pz:(b + 1) * self.pz]))
                           for b in range(sz[self.Y])]
        self._rows = {r: n for r, n in zip(self.r_ranks + self.c_ranks,
                                           own.sizes(self.r_ranks + self.c_ranks))}
        self._edges = None
        self.R, self.C = sum(own.sizes(self.r_ranks)), sum(own.sizes(self.c_ranks))
        self.row_bounds = _bounds(self.R, self.pz)
        r0, r1 = self.row_bounds[z], self.row_bounds[z + 1]
        shape = (r1 - r0, self.C)
        arrays = coo_to_csr(np.asarray(rows) - r0, cols, vals, shape)
        self.nnz = self.local_nnz = int(arrays[1].shape[0])  # this rank's piece
        self.piece = tuple(torch.as_tensor(a, device=device) for a in arrays)
        self.piece_t = tuple(torch.as_tensor(a, device=device)
                             for a in transpose_csr(*arrays, shape))
        with comm.in_phase("setup"):
            self.nnz_sizes = [int(t) for t in torch.cat(comm.all_gather(
                torch.tensor([self.nnz]), self.Z))]
        self.indptr_sizes = [self.row_bounds[k + 1] - self.row_bounds[k] + 1
                             for k in range(self.pz)]
        self.t_indptr_sizes = [self.C + 1] * self.pz

    def rank_rows(self, ranks):
        """Owned rows of each of ``ranks`` (members of this rank's X or Y slice)."""
        return [self._rows[r] for r in ranks]

    def edges(self):
        """The edge-valued operations (:func:`.edge_block.cube_edges`)."""
        return cube_edges(self)

    def start_pieces(self, piece, indptr_sizes):
        """The all-gathers over Z of a piece's row pointers, indices and values, issued: Â
        does not depend on the features, so it travels while they are split and gathered."""
        return (self.comm.start_all_gather(piece[0], self.Z, indptr_sizes),
                self.comm.start_all_gather(piece[1], self.Z, self.nnz_sizes),
                self.comm.start_all_gather(piece[2], self.Z, self.nnz_sizes,
                                           exact=True))  # Â values

    def gather_piece(self, pending, n_rows, n_cols):
        """Â[R_x, C_y] from the Z group's row pieces (:meth:`start_pieces`; indptr shifted by
        the nnz before)."""
        ptr, idx, val = (p.wait() for p in pending)
        shift = np.concatenate([[0], np.cumsum(self.nnz_sizes)])
        crow = torch.cat([ptr[0][:1]] + [p[1:] + int(s) for p, s in zip(ptr, shift)])
        return torch.sparse_csr_tensor(crow, torch.cat(idx), torch.cat(val), check_invariants=False,
                                       size=(n_rows, n_cols))

    def _widths(self, f: int):
        b = _bounds(f, self.pz)
        return [b[k + 1] - b[k] for k in range(self.pz)], b

    def split_features(self, h):
        """(n_me, f) → rows of (x, y, ·) with features F_z (one flat all-to-all over Z)."""
        widths, b = self._widths(h.shape[1])
        me = self.comm.grid.coord(self.Z)
        send = torch.cat([h[:, b[k]:b[k + 1]].reshape(-1) for k in range(self.pz)])
        got = self.comm.all_to_all(send, [self.num_src * w for w in widths],
                                   [n * widths[me] for n in self.z_sizes], self.Z)
        return got.reshape(sum(self.z_sizes), widths[me])

    def join_features(self, t, f: int):
        """Inverse of :meth:`split_features`: rows of (x, y, ·) × F_z → owned rows × f."""
        widths, _ = self._widths(f)
        me = self.comm.grid.coord(self.Z)
        got = self.comm.all_to_all(t.reshape(-1), [n * widths[me] for n in self.z_sizes],
                                   [self.num_src * w for w in widths], self.Z)
        chunks = torch.split(got, [self.num_src * w for w in widths])
        return torch.cat([c.reshape(self.num_src, w) for c, w in zip(chunks, widths)], dim=1)

    def forward_rows(self, h):
        pieces = self.start_pieces(self.piece, self.indptr_sizes)
        hc = torch.cat(self.comm.all_gather(self.split_features(h), self.X, self.xy_sizes_x))
        y = csr_mm(self.gather_piece(pieces, self.R, self.C), hc)
        return self.join_features(self.comm.reduce_scatter(y, self.Y, self.xy_sizes_y),
                                  h.shape[1])

    def backward_rows(self, grad):
        f = grad.shape[1]
        pending = self.start_pieces(self.piece_t, self.t_indptr_sizes)
        g_rows = torch.cat(self.comm.all_gather(self.split_features(grad), self.Y,
                                                self.xy_sizes_y))
        pieces, idx, val = (p.wait() for p in pending)
        d = None
        for z in range(self.pz):
            rows = (self.C, self.row_bounds[z + 1] - self.row_bounds[z])
            t = torch.sparse_csr_tensor(pieces[z], idx[z], val[z], size=rows,
                                        check_invariants=False)
            part = csr_mm(t, g_rows[self.row_bounds[z]:self.row_bounds[z + 1]])
            d = part if d is None else d + part
        d = self.comm.reduce_scatter(d, self.X, self.xy_sizes_x)
        return self.join_features(d, f)



def build_3d_ops(shard, comm: Comm, norm: str, device=None, layers: int = 0, rotate: bool = True,
                 permute: bool = False, seed: int = 0):
    """One :class:`Op3D` (``layers=0`` or ``rotate=False``) or a list of ``layers`` operators
    cycling through the three orientations (built once each)."""
    grid = comm.grid
    if not set(AXES3) <= set(grid.shape):
        raise InputError(f"3d needs a row x col x depth grid, got {grid.describe()}")
    own = ownership(shard, comm, permute, seed)
    u0, v0, val0 = shard_entries(shard, shard_values(shard, norm))
    count = min(layers, 3) if (layers and rotate) else 1
    built = []
    for k in range(count):
        X, Y, Z = orientation(k)
        cu, cv = coords_of(grid, own.owner[u0]), coords_of(grid, own.owner[v0])
        pz = grid.shape[Z]
        # position of u in R_x (y-major, z-minor ranks of its X slice) decides the piece
        pos = np.zeros_like(u0)
        piece = np.zeros_like(u0)
        for xv in np.unique(cu[X]) if u0.size else []:
            sel = cu[X] == xv
            ranks = [int(rank_of(grid, {**{a: 0 for a in grid.shape}, X: xv, Y: b, Z: c}))
                     for b in range(grid.shape[Y]) for c in range(pz)]
            pos[sel] = own.block_positions(ranks, u0[sel])[2]
            bounds = np.asarray(_bounds(sum(own.sizes(ranks)), pz))
            piece[sel] = np.searchsorted(bounds, pos[sel], side="right") - 1
        dest = rank_of(grid, {**{a: np.zeros_like(u0) for a in grid.shape},
                              X: cu[X], Y: cv[Y], Z: piece})
        u, v, val, rpos = exchange(comm, world_axes(grid), dest, [u0, v0, val0, pos])
        # column positions in C_y (x-major, z-minor ranks of this rank's Y slice)
        y = grid.coord(Y)
        c_ranks = [int(rank_of(grid, {**grid.coords, X: a, Y: y, Z: c}))
                   for a in range(grid.shape[X]) for c in range(pz)]
        cpos = own.block_positions(c_ranks, v)[2] if v.size else v
        op = Op3D(comm, (X, Y, Z), own, rpos, cpos, val, device)
        built.append(attach_ownership(op, shard, comm, own))
    if not layers or not rotate:
        return built[0] if not layers else [built[0]] * layers
    return [built[k % 3] for k in range(layers)]


# ---------------------------------------------------------------- registry entry
def cube(world: int, dims=None, replication: int = 1) -> dict:
    if dims is None or len(dims) != 3:
        raise InputError(f"3d needs --grid PXxPYxPZ with product {world}, got {dims}")
    return dict(zip(AXES3, dims))


#: the pairs of the cube's axes (each orientation's all-gathers and reduce-scatters)
CUBE_PAIRS = tuple(tuple(a for a in AXES3 if a != b) for b in AXES3)


def piece_dest(s, dims, k: int) -> np.ndarray:
    """The rank whose piece holds each non-zero in orientation ``k`` (:func:`build_3d_ops`):
    X of its row's owner, Y of its column's, and Z the piece of R_x its row falls in (rows of
    R_x ordered by the ranks (x, ·, ·) y-major, z-minor)."""
    X, Y, Z = orientation(k)
    axis_size = dict(zip(AXES3, dims))
    px, pz = axis_size[X], axis_size[Z]
    q = np.arange(s.p)
    coords = dict(zip(AXES3, np.unravel_index(q, dims)))
    x, y, z = coords[X], coords[Y], coords[Z]
    n_r = s.sizes
    R = np.bincount(x, weights=n_r, minlength=px).astype(np.int64)
    ou, ov = s.owner[s.rows], s.owner[s.cols]
    start = np.zeros(s.p, np.int64)
    for xv in range(px):
        members = q[x == xv][np.argsort(y[x == xv] * pz + z[x == xv], kind="stable")]
        start[members] = np.concatenate([[0], np.cumsum(n_r[members])])[:-1]
    by_owner = np.argsort(s.owner, kind="stable")
    local = np.empty(s.owner.shape[0], np.int64)
    first = np.concatenate([[0], np.cumsum(n_r)])[:-1]
    local[by_owner] = np.arange(by_owner.shape[0]) - first[s.owner[by_owner]]
    pos = start[ou] + local[s.rows]
    bounds = (R[x[ou]][:, None] * np.arange(pz + 1)[None, :]) // pz
    piece = (bounds[:, 1:] <= pos[:, None]).sum(1)
    return np.ravel_multi_index(tuple({X: x[ou], Y: y[ov], Z: piece}[a] for a in AXES3), dims)


def moves_3d(s, dims, variant, layers, rotate, reduce: bool = True):
    """``layer -> Moves`` (:mod:`.cost_attention`) of the pieces' edge-valued operations
    (:func:`.edge_block.cube_edges`): halo plans of the rows each piece touches, over the
    (Y, Z) group (out) and the (X, Z) group (in) of the layer's orientation."""
    count = min(layers, 3) if (layers and rotate) else 1
    dims = tuple(dims)[-3:]
    memo = {}

    def layer_moves(layer: int) -> Moves:
        k = layer % count
        if k not in memo:
            dest = piece_dest(s, dims, k)
            ir, is_, irm, ism = plan_counts(s.p, dest, s.cols, s.owner[s.cols])
            orr, os_, orm, osm = plan_counts(s.p, dest, s.rows, s.owner[s.rows])
            memo[k] = Moves.of(g_in=(is_, ism), r_in=(ir, irm), g_out=(os_, osm),
                               r_out=(orr, orm), m_out=(orr, orm))
        return memo[k]
    return layer_moves


def estimate_moves_3d(s, dims, variant) -> Moves:
    """The average rank's :func:`moves_3d` in the first orientation (``dims`` as X, Y, Z): a
    piece holds about m/p non-zeros of Â[R_x, C_y]; its rows come from n/(px·pz) rows of the
    (Y, Z) group's, its columns from the n/py of the (X, Z) group's, less the rank's own."""
    px, py, pz = tuple(dims)[-3:]
    n, nr, e = s.n, s.nr, s.mr * s.scale
    hin = distinct(e * (1 - 1 / (px * pz)), n / py - nr)
    hout = distinct(e * (1 - 1 / (py * pz)), n / (px * pz) - nr)
    kin, kout = partners(e * (1 - 1 / (px * pz)), px * pz), partners(e * (1 - 1 / (py * pz)),
                                                                     py * pz)
    return Moves.of(g_in=(hin, kin), r_in=(hin, kin), g_out=(hout, kout), r_out=(hout, kout),
                    m_out=(hout, kout))


class CubeCounts:
    """Exact per-rank counts of the 3d kernel on a (px, py, pz) grid: per orientation used,
    the sizes its collectives move (feature slices make bytes non-linear in f), and the bytes
    its all-gathers and reduce-scatters pad (:meth:`padding_bytes`)."""

    def __init__(self, s, dims, layers: int, rotate: bool):
        self.n_r, self.dims = s.sizes, dims
        self.orients = []
        axis_size = dict(zip(AXES3, dims))
        count = min(layers, 3) if (layers and rotate) else 1
        q = np.arange(s.p)
        coords = dict(zip(AXES3, np.unravel_index(q, dims)))
        for k in range(count):
            X, Y, Z = orientation(k)
            px, py, pz = axis_size[X], axis_size[Y], axis_size[Z]
            x, y, z = coords[X], coords[Y], coords[Z]
            Nxy = np.bincount(x * py + y, weights=self.n_r, minlength=px * py).astype(np.int64)
            R = np.bincount(x, weights=self.n_r, minlength=px).astype(np.int64)
            C = np.bincount(y, weights=self.n_r, minlength=py).astype(np.int64)
            nnz = np.bincount(piece_dest(s, dims, k), minlength=s.p)
            rows_z = (R[x] * (z + 1)) // pz - (R[x] * z) // pz
            self.orients.append(dict(pz=pz, px=px, py=py, z=z, Nxy=Nxy[x * py + y], R=R[x],
                                     C=C[y], nnz=nnz, rows_z=rows_z,
                                     # each rank's X, Y and Z group (the ranks it shares the
                                     # other two coordinates with)
                                     gx=y * pz + z, gy=x * pz + z, gz=x * py + y,
                                     zgroup=np.stack([np.ravel_multi_index(tuple(
                                         {X: x, Y: y, Z: np.full(s.p, zz)}[a]
                                         for a in AXES3), dims)
                                         for zz in range(pz)], 1)))

    def spmm(self, f: int, layer: int, wire: int = F32):
        """(fwd bytes, fwd msgs, bwd bytes, bwd msgs) per rank: feature slices at ``wire``
        bytes an element, the Â pieces as they are (int64 indices, exact float32 values)."""
        o = self.orients[layer % len(self.orients)]
        pz, px, py, z = o["pz"], o["px"], o["py"], o["z"]
        wb = [(f * k) // pz for k in range(pz + 1)]
        w = np.diff(wb)
        wz = w[z]
        n_me = self.n_r
        nz = self.n_r[o["zgroup"]]                       # (p, pz) owned rows of (x, y, ·)
        not_me = np.arange(pz)[None, :] != z[:, None]
        split_b = (n_me[:, None] * w[None, :] * not_me).sum(1) * wire
        split_m = ((n_me[:, None] * w[None, :] > 0) & not_me).sum(1)
        join_b = (nz * wz[:, None] * not_me).sum(1) * wire
        join_m = ((nz * wz[:, None] > 0) & not_me).sum(1)
        a_fwd = coll(pz) * (8 * (o["rows_z"] + 1) + 12 * o["nnz"])
        a_bwd = coll(pz) * (8 * (o["C"] + 1) + 12 * o["nnz"])
        fwd_b = (split_b + coll(px) * o["Nxy"] * wz * wire + a_fwd
                 + (o["R"] - o["Nxy"]) * wz * wire * (py > 1) + join_b)
        bwd_b = (split_b + coll(py) * o["Nxy"] * wz * wire + a_bwd
                 + (o["C"] - o["Nxy"]) * wz * wire * (px > 1) + join_b)
        fwd_m = split_m + coll(px) + 3 * coll(pz) + coll(py) + join_m
        bwd_m = split_m + coll(py) + 3 * coll(pz) + coll(px) + join_m
        return fwd_b, fwd_m, bwd_b, bwd_m

    def padding_bytes(self, f: int, layer: int, wire: int = F32, reduce: bool = True):
        """(fwd, bwd) bytes per rank that the collectives move beyond :meth:`spmm`'s logical
        count (every member's chunk padded to its group's largest): the feature slices'
        all-gather and reduce-scatter (``reduce=False``: a low-precision wire's reduce-scatter
        travels as an all-to-all, which pads nothing), and the Â pieces' all-gathers over Z
        (int64 row pointers and column indices, float32 values). The all-to-alls pad nothing."""
        o = self.orients[layer % len(self.orients)]
        pz = o["pz"]
        wz = np.diff([(f * k) // pz for k in range(pz + 1)])[o["z"]] * wire
        Nxy, gx, gy, gz = o["Nxy"], o["gx"], o["gy"], o["gz"]
        k = 1 if reduce else 0
        nnz_pad = gather_padding(o["nnz"], gz) * 12
        fwd = ((gather_padding(Nxy, gx) + k * reduce_padding(Nxy, gy)) * wz
               + gather_padding(o["rows_z"] + 1, gz) * 8 + nnz_pad)
        bwd = ((gather_padding(Nxy, gy) + k * reduce_padding(Nxy, gx)) * wz
               + gather_padding(o["C"] + 1, gz) * 8 + nnz_pad)
        return fwd, bwd


def exact_3d(s, dims, variant, layers, rotate) -> CubeCounts:
    return CubeCounts(s, dims, layers, rotate)


def cube_work(s, dims, variant, layers, rotate):
    """Work rule: each rank multiplies its piece's non-zeros by its slice of the features."""
    counts = exact_3d(s, dims, variant, layers, rotate)

    def work(f, layer):
        o = counts.orients[layer % len(counts.orients)]
        pz = o["pz"]
        w = np.diff([(f * k) // pz for k in range(pz + 1)])
        return o["nnz"] * w[o["z"]]
    return work


def estimate_3d(s, dims, variant):
    (px, py, pz), n, nr, mr = dims, s.n, s.nr, s.mr
    R, C, Nxy = n / px, n / py, n / (px * py)
    a_f = coll(pz) * (8 * (R / pz + 1) + 12 * mr)
    a_b = coll(pz) * (8 * (C + 1) + 12 * mr)

    def spmm(f: int, back: bool, wire: int = F32):
        wz = f / pz
        split = nr * f * (pz - 1) / pz * wire * 2
        fb = split + ((px - 1) * Nxy + (R - Nxy)) * wz * wire + a_f
        bb = split + ((py - 1) * Nxy + (C - Nxy)) * wz * wire + a_b
        k = 2 * coll(pz) + coll(px) + coll(py) + 3 * coll(pz)
        return fb + (bb if back else 0), k * (2 if back else 1), (R + C) * wz
    return spmm


def matrix_bytes_3d(a, n, m, dims, layers):
    """One Â piece per orientation used, plus the gathered block Â[R_x, C_y]."""
    px, py, pz = dims
    return a * (min(layers, 3) if layers else 1) + 12 * m / (px * py) + 8 * n / px


def options_3d(settings, per_group: bool) -> dict:
    """``layers`` (full batch) and the balanced block layout (:func:`blocks.layout_options`)."""
    return {**layers_option(settings, per_group), **layout_options(settings, per_group)}


def candidates_3d(p: int):
    return [(dims, "-") for dims in factorisations(p, 3)]


SPMM_3D = Algorithm(
    name="3d", axes=AXES3, shape=cube, builder=build_3d_ops,
    flags=("grid", "block_layout"),
    option_rule=options_3d, extra_combos=CUBE_PAIRS, group=GroupRule(group_of_grid),
    cost=Cost(exact_3d, estimate_3d, matrix_bytes_3d, candidates_3d, work=cube_work,
              moves=moves_3d, moves_estimate=estimate_moves_3d))
