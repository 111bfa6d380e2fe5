"""Find this process's place in the world, whoever launched it, and join the process group.

:func:`detect_world` reads, in this order:

1. **torchrun** — ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
   ``MASTER_ADDR``, ``MASTER_PORT`` (also any launcher that sets the same variables);
2. **SLURM** (an ``srun`` task) — ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` (else
   ``SLURM_NTASKS``), ``SLURM_LOCALID``; the master is the first host of
   ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``), expanded without ``scontrol``
   (:mod:`gnnpar.launcher.hostlist`); the port is derived from the job and step ids, so every task
   computes the same one;
3. **MPI** (``mpirun``/``mpiexec``, seen by ``PMI_RANK``, ``OMPI_COMM_WORLD_RANK`` or
   ``PMIX_RANK``) — mpi4py gives rank, size and the ranks on this host; rank 0 opens the
   rendezvous store on a port the kernel picks as it binds (no other process can take it in
   between, as it could a port picked first and bound later) and broadcasts address and
   port. MPI only bootstraps: gloo (or NCCL) communicates;
4. **local** — ``--nprocs N``: this process is the parent that spawns N ranks;
5. **single** — none of the above: one process, world size 1.

``MASTER_ADDR``/``MASTER_PORT`` in the environment override the derived address under SLURM
and MPI. A SLURM batch script that runs the trainer without ``srun`` is not a rank (the batch
step is not a task of a step), and ``mpirun`` inside a SLURM allocation is an MPI launch: its
MPI rank wins over the inherited ``SLURM_PROCID``.

Commands::

    python -m gnnpar.train --algo 1d-halo --nprocs 4            # local
    torchrun --nproc-per-node 4 -m gnnpar.train --algo 1d-halo  # torchrun
    srun -n 4 python -m gnnpar.train --algo 1d-halo             # SLURM
    mpirun -n 4 python -m gnnpar.train --algo 1d-halo           # MPI (pip install mpi4py mpich)
"""
from __future__ import annotations

import datetime
import os
import re
import socket
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist

from gnnpar.cli.cli_common import LostRank
from gnnpar.datasets import InputError
from gnnpar.launcher.hostlist import expand_hostlist, first_host  # noqa: F401 - importable from here
from gnnpar.kernels.comm import import_dynamo_first, init_process_group
from gnnpar.training.adam import optimizer_imports_dynamo

MPI_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
MPI_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
LAUNCHED = ("torchrun", "slurm", "mpi")
# SLURM's step id of a batch script / of the external step (numeric in some versions).
_NON_TASK_STEPS = {"batch", "extern", "interactive", "4294967294", "4294967295", "4294967293"}
SLURM_PORT_BASE, SLURM_PORT_SPAN = 15000, 15000  # below Linux's ephemeral range (32768+)


@dataclass(frozen=True)
class WorldInfo:
    """Where this process stands.

    rank, world_size: global rank and number of ranks (for ``local``: 0 and N — this process
    is the parent, the ranks are its children). local_rank, local_world_size: index and count
    of the ranks on this host (device binding). master_addr, master_port: the rendezvous
    (None for ``local``/``single``, which use a private store). source: ``torchrun``,
    ``slurm``, ``mpi``, ``local`` or ``single``.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: Optional[str]
    master_port: Optional[int]
    source: str
    local_world_size: int = 1

    @property
    def launched(self) -> bool:
        """True when an external launcher started this process as one of the ranks."""
        return self.source in LAUNCHED

    @property
    def init_method(self) -> str:
        """``env://`` under torchrun (its agent already serves the store), else ``tcp://``."""
        if self.source == "torchrun":
            return "env://"
        if self.master_addr is None or self.master_port is None:
            raise ValueError(f"a {self.source} world has no TCP rendezvous address")
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"


def slurm_port(job_id: str, step_id: str = "0") -> int:
    """A port every task of one job step derives alike (two steps of one job differ)."""
    step = int(step_id) if step_id.isdigit() else 0
    return SLURM_PORT_BASE + (int(job_id) * 8 + step % 8) % SLURM_PORT_SPAN


def _tasks_on_node(spec: str, node_id: int) -> Optional[int]:
    """``SLURM_STEP_TASKS_PER_NODE`` like ``"2(x3),1"`` → the count on node ``node_id``."""
    counts: List[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts[node_id] if 0 <= node_id < len(counts) else None


# ---------------------------------------------------------------- detection
def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise InputError(f"environment variable {name}={env[name]!r} is not an integer")


def _from_torchrun(env) -> WorldInfo:
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0
    local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 1
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else None
    return WorldInfo(rank, world, local, env.get("MASTER_ADDR"), port, "torchrun",
                     max(local_world, local + 1))


def _is_slurm_task(env) -> bool:
    if "SLURM_PROCID" not in env or not ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
        return False
    # srun tasks carry a step id; the batch script and an salloc shell carry none
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    return step is not None and step not in _NON_TASK_STEPS


def _from_slurm(env) -> WorldInfo:
    rank = _int(env, "SLURM_PROCID")
    world = _int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS")
    local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    node_id = int(env.get("SLURM_NODEID", "0") or 0)
    local_world = (_tasks_on_node(spec, node_id) if spec else None) or world
    addr = env.get("MASTER_ADDR")
    if not addr:
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") \
            or env.get("SLURM_NODELIST")
        if not nodes:
            raise InputError("SLURM task without SLURM_STEP_NODELIST/SLURM_JOB_NODELIST; "
                             "set MASTER_ADDR")
        addr = first_host(nodes)
    if "MASTER_PORT" in env:
        port = _int(env, "MASTER_PORT")
    elif "SLURM_JOB_ID" in env or "SLURM_JOBID" in env:
        port = slurm_port(env.get("SLURM_JOB_ID") or env["SLURM_JOBID"],
                          env.get("SLURM_STEP_ID", "0"))
    else:
        raise InputError("SLURM task without SLURM_JOB_ID; set MASTER_PORT")
    return WorldInfo(rank, world, local, addr, port, "slurm", max(local_world, local + 1))


def _mpi_env_rank(env) -> Optional[Tuple[int, Optional[int]]]:
    for rv, sv in zip(MPI_RANK_VARS, MPI_SIZE_VARS + (None,)):
        if rv in env:
            size = int(env[sv]) if sv and env.get(sv, "").isdigit() else None
            return _int(env, rv), size
    return None


#: the rendezvous stores of mpirun worlds, by port (:func:`_from_mpi`, :func:`init_distributed`)
_MPI_STORES: dict = {}
_STORE_TIMEOUT = datetime.timedelta(seconds=300)


def free_port(host: str = "") -> int:
    """A TCP port free right now on ``host`` (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return int(s.getsockname()[1])


#: this process's MPI world, by the MASTER_ADDR/MASTER_PORT it was found with: MPI's numbering
#: never changes in a process, and a second detection must not open a second rendezvous
_MPI_WORLDS: dict = {}


def _from_mpi(env) -> WorldInfo:
    key = (env.get("MASTER_ADDR"), env.get("MASTER_PORT"))
    if key not in _MPI_WORLDS:
        _MPI_WORLDS[key] = _find_mpi_world(env)
    return _MPI_WORLDS[key]


def _find_mpi_world(env) -> WorldInfo:
    try:
        from mpi4py import MPI
    except ImportError:
        raise InputError("started by mpirun but mpi4py is not installed: "
                         "pip install mpi4py mpich (or use torchrun/srun/--nprocs)")
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local, local_world = node.Get_rank(), node.Get_size()
    node.Free()
    given = bool(env.get("MASTER_ADDR") and env.get("MASTER_PORT"))
    addr_port = store = None
    if rank == 0:
        if given:
            addr_port = (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
        else:  # rank 0 listens on a port the kernel picks as it binds: nothing can take it
            one_host = local_world == world
            store = dist.TCPStore("127.0.0.1" if one_host else "", 0, world, is_master=True,
                                  wait_for_workers=False, timeout=_STORE_TIMEOUT)
            addr_port = ("127.0.0.1" if one_host else socket.gethostname(), store.port)
    addr, port = comm.bcast(addr_port, root=0)
    if not given:
        if store is None:
            store = dist.TCPStore(addr, int(port), world, is_master=False,
                                  timeout=_STORE_TIMEOUT)
        _MPI_STORES[int(port)] = store  # init_distributed joins through it
    return WorldInfo(rank, world, local, addr, int(port), "mpi", local_world)


def detect_world(nprocs: Optional[int] = None, env: Optional[Mapping[str, str]] = None
                 ) -> WorldInfo:
    """This process's :class:`WorldInfo` (see the module docstring for the order).

    ``nprocs`` is ``--nprocs``: under a launcher that started more than one rank it is a
    contradiction (InputError); under a one-rank launch it asks for a local spawn.
    """
    env = os.environ if env is None else env
    info: Optional[WorldInfo] = None
    mpi = _mpi_env_rank(env)
    if "RANK" in env and "WORLD_SIZE" in env:
        info = _from_torchrun(env)
    elif _is_slurm_task(env) and not _mpi_disagrees(env, mpi):
        info = _from_slurm(env)
    elif mpi is not None:
        info = _from_mpi(env)
    if info is not None:
        _check(info)
        if nprocs and info.world_size > 1:
            raise InputError(f"--nprocs {nprocs} given, but {info.source} already started "
                             f"{info.world_size} ranks; drop --nprocs")
        if not (nprocs and info.world_size == 1):
            return info
    if nprocs is not None and nprocs < 1:
        raise InputError(f"--nprocs must be >= 1, got {nprocs}")
    if nprocs:
        return WorldInfo(0, nprocs, 0, None, None, "local", nprocs)
    return WorldInfo(0, 1, 0, None, None, "single", 1)


def _mpi_disagrees(env, mpi) -> bool:
    """mpirun inside a SLURM allocation: MPI's numbering differs from the inherited task's."""
    if mpi is None:
        return False
    rank, size = mpi
    slurm_size = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    return rank != int(env["SLURM_PROCID"]) or (size is not None and str(size) != slurm_size)


def _check(info: WorldInfo) -> None:
    if info.world_size < 1 or not 0 <= info.rank < info.world_size:
        raise InputError(f"{info.source}: rank {info.rank} is not within world size "
                         f"{info.world_size}")
    if info.launched and info.world_size > 1 and (info.master_addr is None
                                                  or info.master_port is None):
        raise InputError(f"{info.source} launch without MASTER_ADDR/MASTER_PORT")


# ---------------------------------------------------------------- process group
def gpu_for_rank(info: WorldInfo) -> Optional[int]:
    """The CUDA device index this rank owns, or None when ranks cannot each have one.

    A rank owns a GPU when the host shows at least as many GPUs as it runs ranks (device =
    local rank), or when SLURM bound GPUs per task (``--gpus-per-task``: each task sees its
    own, as device 0).
    """
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        return None
    if n >= info.local_world_size:
        return info.local_rank
    if info.source == "slurm" and os.environ.get("SLURM_GPUS_PER_TASK") and n == 1:
        return 0
    return None


@dataclass(frozen=True)
class DistContext:
    """What :func:`init_distributed` settled: ``backend`` and this rank's ``device``."""

    backend: str
    device: "object"


def resolve_backend(choice: str, info: WorldInfo) -> Tuple[str, Optional[int]]:
    """``auto`` → ``nccl`` when each rank owns a GPU, else ``gloo``; check explicit choices."""
    gpu = gpu_for_rank(info)
    if choice == "auto":
        return ("nccl" if gpu is not None else "gloo"), gpu
    if choice == "nccl":
        if gpu is None:
            raise InputError(f"--backend nccl needs one GPU per rank; this host shows "
                             f"{_gpu_count()} GPU(s) for {info.local_world_size} rank(s): "
                             "use --backend gloo")
        return "nccl", gpu
    if choice == "mpi":
        if not dist.is_mpi_available():
            raise InputError("--backend mpi: this torch build has no MPI backend; use gloo "
                             "(mpirun still works: MPI only starts the ranks)")
        return "mpi", gpu
    if choice == "gloo":
        return "gloo", gpu
    raise InputError(f"unknown --backend {choice!r}; choose auto, gloo, nccl or mpi")


def _gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def init_distributed(info: WorldInfo, backend: str = "auto", timeout: float = 300.0
                     ) -> DistContext:
    """Join the process group described by ``info``; bind this rank's GPU when it has one.

    ``timeout`` (seconds) bounds rendezvous and every collective. A ``single`` world gets a
    one-rank group on an in-memory store. ``local`` is the spawning parent, not a rank. A
    peer that dies or never starts before the world is joined is a lost rank
    (:class:`~gnnpar.cli.cli_common.LostRank`: exit 3, one line), as one lost while training is.
    """
    if info.source == "local":
        raise ValueError("a local (--nprocs) world is joined by its spawned children, "
                         "not by the parent")
    name, gpu = resolve_backend(backend, info)
    device = torch.device("cpu")
    if gpu is not None:
        torch.cuda.set_device(gpu)
        device = torch.device("cuda", gpu)
    td = datetime.timedelta(seconds=timeout)
    if optimizer_imports_dynamo(device):  # a launched rank trains: let shutdown free its groups
        import_dynamo_first()
    store = _MPI_STORES.pop(info.master_port, None) if info.source == "mpi" else None
    if info.world_size == 1 and info.master_port is None:
        init_process_group(name, store=dist.HashStore(), rank=0, world_size=1, timeout=td)
        return DistContext(name, device)
    try:
        if store is not None:  # mpirun: the store rank 0 bound while the world was detected
            store.set_timeout(td)
            init_process_group(name, store=store, rank=info.rank, world_size=info.world_size,
                               timeout=td)
        else:
            init_process_group(name, init_method=info.init_method, rank=info.rank,
                               world_size=info.world_size, timeout=td)
    except (RuntimeError, TimeoutError, ConnectionError) as exc:
        if not _rendezvous_failed(exc):
            raise
        raise LostRank(f"rank {info.rank} of {info.world_size} could not join the "
                       f"{info.source} world at {info.master_addr}:{info.master_port} within "
                       f"--timeout {timeout:g} s: a peer died or never started "
                       f"({' '.join(str(exc).split())[:200]})") from exc
    return DistContext(name, device)


#: words of torch's rendezvous errors when a peer is missing: the store's "Timed out after
#: 6 seconds waiting for clients. 1/2 clients joined", a client's "timed out ... trying to
#: connect", gloo's "Connection closed by peer" / "refused" / "reset"
_RENDEZVOUS_WORDS = ("timed out", "timeout", "connect", "closed", "refused", "reset", "joined")


def _rendezvous_failed(exc: BaseException) -> bool:
    """True when joining the process group failed because a peer (or the store's host) is
    missing, rather than for a reason of this process."""
    text = str(exc).lower()
    return any(word in text for word in _RENDEZVOUS_WORDS)


def shutdown() -> None:
    """Leave the process group if this process is in one (safe to call twice)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
