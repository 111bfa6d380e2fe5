"""Reading large input files a block at a time: gzip'd CSV tables and ``.npz`` members.

Both kinds of reader yield blocks of rows, so an input larger than memory can be streamed
into a cache (:mod:`.ingest`): :func:`iter_csv_gz` decompresses and parses a bounded number of
bytes per step and says at which line a block starts (errors name the file and line);
:func:`iter_npz_rows` and :func:`iter_npz_edges` read one array of an ``.npz`` (stored or
deflated) straight from its zip member, never the whole array (a deflated Fortran-ordered
feature array through a scratch copy on disk). :func:`npz_headers` reads
only the ``.npy`` headers, to judge sizes before anything is loaded.
"""
from __future__ import annotations

import gzip
import math
import os
import struct
import zipfile
import zlib
from typing import Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

from .errors import InputError
from .limits import check_memory, format_bytes

#: bytes decompressed or read per step (when a call gives no ``block``)
BLOCK_BYTES = 1 << 24


# ---------------------------------------------------------------- gzip'd CSV
def _bad_line(lines, dtype, ncols: int, first_line: int):
    """Line number and text of the first line that does not hold ``ncols`` numbers of ``dtype``."""
    parse = int if np.issubdtype(dtype, np.integer) else float
    for i, line in enumerate(lines):
        fields = line.split(b",")
        try:
            ok = len(fields) == ncols
            if ok:
                for f in fields:
                    parse(f)
        except ValueError:
            ok = False
        if not ok:
            return first_line + i, line.decode(errors="replace")[:60]
    return first_line, "?"  # pragma: no cover - np.fromstring and Python agree on what parses


def _csv_blocks(path: str, dtype, block: int, held: int, row_bytes: int,
                kept: int) -> Iterator[Tuple[int, np.ndarray]]:
    """``(first line number, rows)`` per decompressed block; ``kept`` bytes are counted per
    parsed byte the caller keeps (see :func:`read_csv_gz`)."""
    if not os.path.isfile(path):
        raise InputError(f"file not found: {path}")
    block = block or BLOCK_BYTES
    ncols, lines_done, tail, parsed, inflated = None, 0, b"", 0, 0
    try:
        with gzip.open(path, "rb") as f:
            while True:
                chunk = f.read(block)
                inflated += len(chunk)
                check_memory(held + kept * parsed + lines_done * row_bytes + 2 * len(tail)
                             + 4 * len(chunk),
                             f"{path} (inflated to {format_bytes(inflated)} so far, "
                             f"{lines_done:,} rows)")
                data = tail + chunk
                if chunk:
                    cut = data.rfind(b"\n") + 1
                    data, tail = data[:cut], data[cut:]
                data = data.replace(b"\r", b"").rstrip(b"\n")
                if data:
                    if ncols is None:
                        ncols = (data[: data.find(b"\n") if b"\n" in data else len(data)]
                                 .count(b",") + 1)
                    nlines = data.count(b"\n") + 1
                    try:
                        vals = np.fromstring(data.replace(b"\n", b","), dtype=dtype, sep=",")
                    except ValueError:
                        vals = None
                    if vals is None or vals.size != nlines * ncols:
                        no, text = _bad_line(data.split(b"\n"), dtype, ncols, lines_done + 1)
                        raise InputError(f"{path} line {no}: expected {ncols} comma-separated "
                                         f"{np.dtype(dtype).name} value(s), got '{text}'")
                    yield lines_done + 1, vals.reshape(nlines, ncols)
                    lines_done += nlines
                    parsed += vals.nbytes
                if not chunk:
                    break
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"cannot decompress {path} (after line {lines_done:,}): {exc}") from None
    if ncols is None:
        yield 1, np.zeros((0, 0), dtype=dtype)


def iter_csv_gz(path: str, dtype, block: Optional[int] = None, held: int = 0,
                row_bytes: int = 0, kept: int = 0) -> Iterator[Tuple[int, np.ndarray]]:
    """``(first line number, rows (k, cols))`` of a gzip'd comma-separated numeric table,
    ``block`` decompressed bytes at a time (whole lines only; an empty file gives one
    (0, 0) block). Every line must have the same number of fields; the first bad line is
    reported with its number, and a damaged or truncated file with the last good line.

    After every block, ``held`` (bytes the caller holds) plus ``row_bytes`` per row read so
    far (what the caller keeps of each row) and the block's own copies are judged by
    :func:`check_memory`, so a small file that inflates beyond the limit is refused early;
    ``kept`` counts that many bytes per parsed byte (2 when the caller keeps the blocks and
    then concatenates them).
    """
    return _csv_blocks(path, dtype, block, held, row_bytes, kept)


def read_csv_gz(path: str, dtype, block: Optional[int] = None, held: int = 0,
                row_bytes: int = 0) -> np.ndarray:
    """A gzip'd comma-separated numeric table as one (rows, cols) array (:func:`iter_csv_gz`,
    counting the rows parsed twice: the pieces and their concatenation)."""
    parts = [rows for _, rows in _csv_blocks(path, dtype, block, held, row_bytes, kept=2)]
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


# ---------------------------------------------------------------- npz
_NPZ_ERRORS = (ValueError, OSError, zlib.error, EOFError, zipfile.BadZipFile, KeyError,
               NotImplementedError, RuntimeError)


def npz_headers(path: str) -> Dict[str, Tuple[tuple, np.dtype, int]]:
    """``key -> (shape, dtype, nbytes)`` of every array in an ``.npz``, read from the ``.npy``
    headers alone (nothing is loaded). Raises :class:`InputError` when the file is no zip of
    ``.npy`` arrays, holds pickled objects, or a header claims more data than its member holds
    (a damaged file: loading it would allocate what the header claims)."""
    def bad(why: str) -> InputError:
        return InputError(f"cannot read {path} as .npz: {why}")
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as exc:
        raise bad(str(exc)) from None
    if magic.startswith(b"\x93NUMPY"):
        raise bad("it is a single .npy array (np.save); an npz graph is np.savez's zip of arrays")
    if not magic.startswith(b"PK"):
        raise bad("it is not a zip archive (an npz graph is np.savez's zip of .npy arrays)")
    out = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                key = info.filename[:-len(".npy")]
                with zf.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                    else:  # a newer format: np.load judges it
                        continue
                    header = member.tell()
                if dtype.hasobject:
                    raise bad(f"'{key}' holds Python objects (pickled data); only numeric arrays "
                              "are read")
                nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
                held = max(info.file_size - header, 0)
                if nbytes > held:
                    raise bad(f"the header of '{key}' claims shape {tuple(shape)} {dtype} "
                              f"({format_bytes(nbytes)}) but the file holds {format_bytes(held)} "
                              "of it: the file is damaged")
                out[key] = (tuple(int(d) for d in shape), dtype, nbytes)
    except InputError:
        raise
    except _NPZ_ERRORS as exc:
        raise bad(f"the zip archive is damaged or truncated ({exc})"
                  if isinstance(exc, (zipfile.BadZipFile, EOFError, zlib.error))
                  else str(exc)) from None
    return out


def load_npz_arrays(path: str, keys: Sequence[str], optional: Sequence[str] = (),
                    extra_bytes=None, what: Optional[str] = None,
                    heads=None) -> Dict[str, np.ndarray]:
    """Load ``keys`` (all required) and ``optional`` arrays of an ``.npz`` after checking, from
    the headers alone (``heads``: :func:`npz_headers`, read here when not given), that they
    exist and that their bytes plus ``extra_bytes(heads)`` (what building the graph from them
    needs) fit :func:`gnnpar.datasets.graph.check_memory`."""
    heads = npz_headers(path) if heads is None else heads
    missing = [k for k in keys if k not in heads]
    if missing:
        raise InputError(f"{path} is missing key '{missing[0]}' (it needs {', '.join(keys)})")
    wanted = [k for k in list(keys) + list(optional) if k in heads]
    need = sum(heads[k][2] for k in wanted) + (extra_bytes(heads) if extra_bytes else 0)
    check_memory(need, what or path)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in wanted}
    except _NPZ_ERRORS as exc:
        why = (f"the zip archive is damaged or truncated ({exc})"
               if isinstance(exc, (zipfile.BadZipFile, EOFError, zlib.error)) else str(exc))
        raise InputError(f"cannot read {path} as .npz: {why}") from None


def _damaged(path: str, exc: BaseException) -> InputError:
    why = (f"the zip archive is damaged or truncated ({exc})"
           if isinstance(exc, (zipfile.BadZipFile, EOFError, zlib.error)) else str(exc))
    return InputError(f"cannot read {path} as .npz: {why}")


def _member_header(f):
    """(shape, fortran_order, dtype) from an open ``.npy`` member, positioned at its data."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    raise ValueError(f".npy format version {version} is not read in blocks")


def _read(f, nbytes: int, dtype, what: str) -> np.ndarray:
    data = f.read(nbytes)
    if len(data) != nbytes:
        raise EOFError(f"'{what}' ends {nbytes - len(data)} bytes early")
    return np.frombuffer(data, dtype=dtype)


def iter_npz_rows(path: str, key: str, block: Optional[int] = None,
                  scratch: Optional[str] = None) -> Iterator[Tuple[int, np.ndarray]]:
    """``(first row, rows)`` of array ``key`` of an ``.npz``, about ``block`` bytes at a time.

    A C-ordered array is read from its zip member in order. A Fortran-ordered one holds each
    column (each index of the trailing dims) whole, one after another, so a block of rows is a
    piece of every column: read by offset from the zip file itself when the member is stored
    (``np.savez``), else from a copy of the member written to ``scratch`` in one sequential
    pass (deflated, ``np.savez_compressed``: a deflated stream cannot be read from the middle)
    and deleted once read. Without ``scratch`` a deflated Fortran-ordered array is loaded
    whole (for a build that holds every array in memory anyway)."""
    block = block or BLOCK_BYTES
    try:
        with zipfile.ZipFile(path) as zf, zf.open(f"{key}.npy") as f:
            shape, fortran, dtype = _member_header(f)
            if fortran and len(shape) > 1:
                info = zf.getinfo(f"{key}.npy")
                if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
                    yield from _fortran_rows(path, _stored_data_offset(path, info) + f.tell(),
                                             shape, dtype, block, key)
                elif scratch is not None:
                    yield from _fortran_rows_via(f, scratch, shape, dtype, block, key)
                else:
                    with np.load(path, allow_pickle=False) as z:
                        arr = z[key]
                    step = max(1, block // max(1, arr[:1].nbytes))
                    for start in range(0, arr.shape[0], step):
                        yield start, arr[start:start + step]
                return
            tail = tuple(shape[1:])
            row = dtype.itemsize * math.prod(tail)
            step = max(1, block // max(1, row))
            for start in range(0, shape[0], step):
                k = min(step, shape[0] - start)
                yield start, _read(f, k * row, dtype, key).reshape((k,) + tail)
    except InputError:
        raise
    except _NPZ_ERRORS as exc:
        raise _damaged(path, exc) from None


def _stored_data_offset(path: str, info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes start in the zip file: after its local header (whose
    name and extra field may differ in length from the central directory's)."""
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        local = fh.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"no local header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _fortran_rows(path: str, offset: int, shape, dtype, block: int, key: str):
    """Row blocks of a Fortran-ordered ``shape`` array whose data start at ``offset`` in the
    file ``path``: each block one read per column, transposed into C order."""
    n, tail = int(shape[0]), tuple(int(d) for d in shape[1:])
    cols, size = math.prod(tail), dtype.itemsize
    step = max(1, block // max(1, cols * size))
    fd = os.open(path, os.O_RDONLY)
    try:
        for start in range(0, n, step):
            k = min(step, n - start)
            by_col = np.empty((cols, k), dtype)
            for c in range(cols):
                data = os.pread(fd, k * size, offset + (c * n + start) * size)
                if len(data) != k * size:
                    raise EOFError(f"'{key}' ends early")
                by_col[c] = np.frombuffer(data, dtype)
            # element (i, j0, j1, ...) is column j0 + j1·d1 + ...: the tail in Fortran order
            yield start, np.ascontiguousarray(by_col.T.reshape((k,) + tail, order="F"))
    finally:
        os.close(fd)


def _fortran_rows_via(member, scratch: str, shape, dtype, block: int, key: str):
    """:func:`_fortran_rows` of a deflated member (positioned at its data): its bytes are
    first copied to ``scratch`` in one pass, ``block`` bytes at a time."""
    nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
    try:
        with open(scratch, "wb") as out:
            left = nbytes
            while left:
                data = member.read(min(block, left))
                if not data:
                    raise EOFError(f"'{key}' ends {left} bytes early")
                out.write(data)
                left -= len(data)
        yield from _fortran_rows(scratch, 0, shape, dtype, block, key)
    finally:
        try:
            os.unlink(scratch)
        except OSError:
            pass


def iter_npz_edges(path: str, key: str, block: Optional[int] = None
                   ) -> Iterator[Tuple[int, np.ndarray, np.ndarray]]:
    """``(first edge, src, dst)`` of a (2, E) array ``key`` of an ``.npz``, a block of edges
    at a time: two readers of the member, one at each row (C order), or one reading the
    interleaved pairs (Fortran order)."""
    block = block or BLOCK_BYTES
    try:
        with zipfile.ZipFile(path) as zf, zf.open(f"{key}.npy") as f:
            shape, fortran, dtype = _member_header(f)
            edges = int(shape[1])
            step = max(1, block // (2 * dtype.itemsize))
            if fortran:
                for start in range(0, edges, step):
                    k = min(step, edges - start)
                    pairs = _read(f, 2 * k * dtype.itemsize, dtype, key).reshape(k, 2)
                    yield start, pairs[:, 0], pairs[:, 1]
                return
            with zf.open(f"{key}.npy") as g:
                _member_header(g)
                g.seek(g.tell() + edges * dtype.itemsize)
                for start in range(0, edges, step):
                    k = min(step, edges - start)
                    yield (start, _read(f, k * dtype.itemsize, dtype, key),
                           _read(g, k * dtype.itemsize, dtype, key))
    except InputError:
        raise
    except _NPZ_ERRORS as exc:
        raise _damaged(path, exc) from None
