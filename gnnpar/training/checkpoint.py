"""Checkpoints that load safely, survive crashes mid-write, and refuse the wrong run.

File layout (one folder per rank, see :func:`rank_dir`)::

    ckpt-000000012.pt:  b"GNNPARCKPT 1\\n"
                        one JSON line {"step", "nbytes", "sha256", "meta", "torch"}
                        payload: torch.save of the state (plain dicts/lists of tensors, ints,
                        floats, strings, bools, None)

A write goes to a hidden temporary file in the same folder, is fsynced, renamed over the
final name and the folder is fsynced, so a crash leaves either the old set of checkpoints or
the new one, plus at most a temporary file that no reader looks at. The checksum in the
header catches a file damaged afterwards (truncated copy, bad disk): the loader skips it
with a warning and takes the previous good one. The payload is read with
``torch.load(weights_only=True)``, which never runs pickled code.

``meta`` (JSON values: world size, grid, partition fingerprint, algorithm…) sits in the
header, so a checkpoint from a different run is refused before its payload is touched.

Rotation (``keep``) deletes only files it can prove are this run's: the checksum holds and
the header's meta equals the meta being written. A file merely named like a checkpoint, a
damaged one or another run's is never counted and never deleted, nor is the file just
written. :class:`FolderLock` keeps a second run out of a folder.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch
import torch.distributed as dist

from gnnpar.datasets import InputError, owned
from gnnpar.datasets.limits import writing_to
from gnnpar.datasets.owned import LOCK_NAME, FolderBusy  # noqa: F401 - shared with shard folders
from gnnpar.kernels.comm import control_all_reduce

from gnnpar.launcher.scratch import process_start

MAGIC = b"GNNPARCKPT 1\n"
NAME = re.compile(r"^ckpt-(\d{9,})\.pt$")
TMP = re.compile(r"^\.ckpt-\d+\.(\d+)\.tmp$")


class CorruptCheckpoint(ValueError):
    """A checkpoint file whose bytes do not match its header (or have no header)."""


class CheckpointWarning(UserWarning):
    """A damaged checkpoint was skipped."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: its ``step``, the ``state`` saved, the header's ``meta``, and the
    file it came from."""

    step: int
    state: Dict[str, Any]
    meta: Dict[str, Any]
    path: str


def rank_dir(base: str, rank: int) -> str:
    """The folder of one rank's checkpoints under ``--checkpoint-dir``."""
    return os.path.join(base, f"rank-{rank:05d}")


def file_name(step: int) -> str:
    return f"ckpt-{step:09d}.pt"


# ---------------------------------------------------------------- writing
def save_checkpoint(directory: str, state: Mapping[str, Any], step: int, keep: int = 3,
                    meta: Optional[Mapping[str, Any]] = None) -> str:
    """Write ``state`` as checkpoint ``step`` atomically; return the path. Of the other
    intact checkpoints written with the same ``meta``, the ``keep - 1`` newest stay (see the
    module docstring: nothing else is ever deleted). ``state`` may hold only
    weights_only-safe values (TypeError names the first that is not); ``meta`` must be
    JSON-serialisable."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    check_safe(state)
    buf = io.BytesIO()
    torch.save(dict(state), buf)
    payload = buf.getvalue()
    header = {"step": int(step), "nbytes": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest(),
              "meta": json.loads(json.dumps(dict(meta or {}))), "torch": torch.__version__}
    os.makedirs(directory, exist_ok=True)
    _clear_debris(directory)
    final = os.path.join(directory, file_name(step))
    tmp = os.path.join(directory, f".ckpt-{step}.{os.getpid()}.tmp")
    _set_aside_unless_own(final, header["meta"])
    try:
        with writing_to(final), open(tmp, "wb") as fh:
            fh.write(MAGIC)
            fh.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    # rotation: only checkpoints this run can prove it wrote (checksum intact, same meta);
    # junk named like a checkpoint, damaged files and other runs' files are never counted
    # nor deleted, and neither is the file just written
    older = [s for s in own_steps(directory, header["meta"]) if s != step]
    for old in older[keep - 1:]:
        try:
            os.unlink(os.path.join(directory, file_name(old)))
        except FileNotFoundError:
            pass
    return final


def _set_aside_unless_own(path: str, meta: Mapping[str, Any]) -> None:
    """Before ``path`` is replaced: a file there that is not an intact checkpoint with this
    very ``meta`` (damaged, someone else's, junk under a checkpoint's name) is renamed to
    ``NAME.not-overwritten[-N]`` with a warning, never overwritten."""
    if not os.path.lexists(path):
        return
    try:
        header, _ = read_verified(path)
        if header.get("meta") == meta:
            return
    except (CorruptCheckpoint, OSError):
        pass
    aside, n = f"{path}.not-overwritten", 1
    while os.path.lexists(aside):
        n += 1
        aside = f"{path}.not-overwritten-{n}"
    os.rename(path, aside)
    warnings.warn(f"{path} was not written by this run (or is damaged): kept as {aside}",
                  CheckpointWarning, stacklevel=3)


_SAFE_SCALARS = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


def check_safe(obj: Any, path: str = "state") -> None:
    """Raise TypeError at the first value ``torch.load(weights_only=True)`` would refuse."""
    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor and not isinstance(obj, torch.nn.Parameter):
            raise TypeError(f"{path}: tensor subclass {type(obj).__name__} cannot be checkpointed")
        return
    if isinstance(obj, _SAFE_SCALARS) or isinstance(obj, torch.Size):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"{path}: key {k!r} is a {type(k).__name__}; use str or int")
            check_safe(v, f"{path}[{k!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            check_safe(v, f"{path}[{i}]")
        return
    raise TypeError(f"{path} is a {type(obj).__name__}; checkpoints hold only tensors, numbers, "
                    "strings, None and dicts/lists of them (convert numpy arrays with "
                    "torch.from_numpy)")


def _clear_debris(directory: str) -> None:
    """Remove temporary files left by writers that crashed (their process is gone)."""
    for name in os.listdir(directory):
        m = TMP.match(name)
        pid = int(m.group(1)) if m else None
        # a temp file of ours from an earlier failed write is debris too
        if m and (pid == os.getpid() or process_start(pid) is None):
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- reading
def list_steps(directory: str) -> List[int]:
    """Steps of the checkpoint files in ``directory``, newest first (not verified)."""
    if not os.path.isdir(directory):
        return []
    steps = [int(m.group(1)) for m in map(NAME.match, os.listdir(directory)) if m]
    return sorted(steps, reverse=True)


def read_verified(path: str):
    """(header, payload bytes) of a checkpoint file; CorruptCheckpoint if damaged."""
    with open(path, "rb") as fh:
        data = fh.read()
    if not data.startswith(MAGIC):
        raise CorruptCheckpoint(f"{path}: not a gnnpar checkpoint (bad magic)")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise CorruptCheckpoint(f"{path}: header cut short")
    try:
        header = json.loads(data[len(MAGIC):end])
        nbytes, digest = int(header["nbytes"]), str(header["sha256"])
    except (ValueError, KeyError, TypeError):
        raise CorruptCheckpoint(f"{path}: unreadable header")
    payload = data[end + 1:]
    if len(payload) != nbytes:
        raise CorruptCheckpoint(f"{path}: {len(payload)} payload bytes, header says {nbytes} "
                                "(truncated or appended)")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CorruptCheckpoint(f"{path}: checksum mismatch")
    return header, payload


def own_steps(directory: str, meta: Optional[Mapping[str, Any]]) -> List[int]:
    """Steps whose files pass the checksum and were written with exactly ``meta`` (compared
    as JSON), newest first; anything else is skipped silently."""
    want = json.loads(json.dumps(dict(meta or {})))
    out = []
    for step in list_steps(directory):
        try:
            header, _ = read_verified(os.path.join(directory, file_name(step)))
        except (CorruptCheckpoint, OSError):
            continue
        if header.get("meta") == want and header.get("step") == step:
            out.append(step)
    return out


def good_steps(directory: str) -> List[int]:
    """Steps whose files pass the checksum, newest first (damaged ones warned about)."""
    out = []
    for step in list_steps(directory):
        try:
            read_verified(os.path.join(directory, file_name(step)))
            out.append(step)
        except CorruptCheckpoint as e:
            warnings.warn(f"skipping damaged checkpoint: {e}", CheckpointWarning, stacklevel=2)
    return out


def load_step(directory: str, step: int, expect: Optional[Mapping[str, Any]] = None,
              map_location="cpu") -> Checkpoint:
    """Load checkpoint ``step``; CorruptCheckpoint if damaged, InputError if ``expect``
    disagrees with its meta."""
    path = os.path.join(directory, file_name(step))
    header, payload = read_verified(path)
    check_expect(path, header.get("meta", {}), expect)
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - an unsafe or unreadable payload is a bad file
        raise CorruptCheckpoint(f"{path}: payload refused by the safe loader "
                                f"({type(e).__name__}: {str(e).splitlines()[0][:200]})")
    return Checkpoint(int(header["step"]), state, header.get("meta", {}), path)


def load_latest(directory: str, expect: Optional[Mapping[str, Any]] = None,
                map_location="cpu") -> Optional[Checkpoint]:
    """The newest good checkpoint in ``directory``, or None when there is none at all.

    A damaged newer file is skipped with a :class:`CheckpointWarning`. A checkpoint whose
    meta differs from ``expect`` (world size, grid, partition fingerprint, algorithm…) is
    refused with InputError — an older one is not tried, since it is from the same run.
    Files exist but none is readable → InputError.
    """
    steps = list_steps(directory)
    problems = []
    for step in steps:
        try:
            return load_step(directory, step, expect, map_location)
        except CorruptCheckpoint as e:
            problems.append(str(e))
            warnings.warn(f"skipping damaged checkpoint: {e}", CheckpointWarning, stacklevel=2)
    if steps:
        raise InputError(f"no readable checkpoint in {directory}: {'; '.join(problems)}")
    return None


def check_expect(path: str, meta: Mapping[str, Any],
                 expect: Optional[Mapping[str, Any]]) -> None:
    """InputError naming the first setting of ``expect`` that the checkpoint's meta lacks or
    holds differently (values compared as JSON: tuples equal lists)."""
    for key, want in json.loads(json.dumps(dict(expect or {}))).items():
        if key not in meta:
            raise InputError(f"checkpoint {path} does not record {key}; this run has "
                             f"{key}={want!r}: cannot resume it safely")
        if meta[key] != want:
            raise InputError(f"checkpoint {path} was written with {key}={meta[key]!r}, this run "
                             f"has {key}={want!r}; resume with the same settings or use a new "
                             "checkpoint folder")


def agree_on_step(steps: List[int], group=None) -> Optional[int]:
    """The newest step that every rank of ``group`` holds in ``steps`` (its good steps), or
    None. All ranks call it together; each round is two small all-reduces."""
    if not (dist.is_available() and dist.is_initialized()):
        return max(steps) if steps else None
    have = set(int(s) for s in steps)
    bound = None
    while True:
        mine = max((s for s in have if bound is None or s <= bound), default=-1)
        low = int(control_all_reduce(torch.tensor([mine], dtype=torch.int64), "min", group)[0])
        if low < 0:
            return None
        everyone = control_all_reduce(torch.tensor([1 if low in have else 0], dtype=torch.int64),
                                      "min", group)
        if int(everyone[0]) == 1:
            return low
        bound = low - 1


_MESSAGE_BYTES = 2048


def agree_on_error(message: Optional[str], group=None) -> Optional[str]:
    """Every rank of ``group`` learns the message of the lowest rank that has one (None when
    no rank has): ranks that refuse a setting together fail with the same words. All ranks
    call it together; two small all-reduces."""
    agreed = agree_on_failure(None if message is None else (0, message), group)
    return None if agreed is None else agreed[1]


def agree_on_failure(failure, group=None):
    """Like :func:`agree_on_error` for a typed failure ``(kind, message)`` (``kind`` a small
    int ≥ 0 the caller defines): every rank learns the lowest failing rank's pair, carried
    as numbers, never parsed from its text."""
    if not (dist.is_available() and dist.is_initialized()):
        return failure
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    first = int(control_all_reduce(torch.tensor([rank if failure is not None else world],
                                                dtype=torch.int64), "min", group)[0])
    if first >= world:
        return None
    buf = torch.zeros(_MESSAGE_BYTES + 1, dtype=torch.int32)
    if rank == first:
        kind, message = failure
        data = (message or "?").encode("utf-8", "replace")[:_MESSAGE_BYTES].replace(b"\0", b" ")
        buf[0] = int(kind) + 1  # non-zero: the max over ranks keeps the first rank's
        buf[1:1 + len(data)] = torch.tensor(list(data), dtype=torch.int32)
    out = control_all_reduce(buf, "max", group).tolist()
    text = out[1:]
    end = text.index(0) if 0 in text else len(text)
    return out[0] - 1, bytes(text[:end]).decode("utf-8", "replace")


# ---------------------------------------------------------------- folder lock
class FolderLock(owned.FolderLock):
    """The lock every gnnpar folder shares (:class:`gnnpar.datasets.owned.FolderLock`); a
    checkpoint folder's no-lock-support warning is a :class:`CheckpointWarning`."""

    warning = CheckpointWarning


# ---------------------------------------------------------------- random states
def capture_rng(generators: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Every random state as weights_only-safe values: torch CPU, the current CUDA device's
    (when this process uses CUDA), numpy's global generator, Python's ``random``, and any
    named ``torch.Generator`` or ``numpy.random.Generator`` passed in ``generators``
    (samplers)."""
    np_state = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    out: Dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                  "gauss": float(np_state[4])},
        "python": {"version": int(py_version),
                   "internal": torch.tensor(py_internal, dtype=torch.int64), "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # this rank's device only: touching every GPU would open a context on each of them
        out["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    out["generators"] = {name: _gen_state(g) for name, g in (generators or {}).items()}
    return out


def restore_rng(state: Mapping[str, Any], generators: Optional[Mapping[str, Any]] = None) -> None:
    """Put back what :func:`capture_rng` captured (the same ``generators`` names)."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["internal"].tolist()), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        if isinstance(state["cuda"], list):  # written before 2026-11-30: one per device
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            torch.cuda.set_rng_state(state["cuda"], torch.cuda.current_device())
    saved = state.get("generators", {})
    for name, g in (generators or {}).items():
        if name not in saved:
            raise InputError(f"the checkpoint has no state for generator {name!r}")
        _set_gen_state(g, saved[name])


def _gen_state(g) -> Dict[str, Any]:
    if isinstance(g, torch.Generator):
        return {"kind": "torch", "state": g.get_state()}
    if isinstance(g, np.random.Generator):
        # PCG64's 128-bit integers do not fit a tensor: keep them as JSON text
        return {"kind": "numpy", "state": json.dumps(g.bit_generator.state)}
    raise TypeError(f"cannot capture a {type(g).__name__}; pass a torch.Generator or "
                    "numpy.random.Generator")


def _set_gen_state(g, saved) -> None:
    if saved["kind"] == "torch":
        g.set_state(saved["state"])
    else:
        g.bit_generator.state = json.loads(saved["state"])
