"""A one-node SLURM cluster on localhost for tests: munge, slurmctld and slurmd in the
foreground as children of the test process, private ports, key, state and spool folders.

Needs Debian's ``slurmctld slurmd slurm-client munge`` and root (SlurmUser=root); the
:func:`slurm_cluster` fixture skips with the reason otherwise. No systemd, no cgroups
(proctrack/linuxproc, task/none). Stopping cancels every job, stops the daemons, and kills
any process that still carries this cluster's token in its environment (a ``slurmstepd`` or
job task outliving slurmd), so nothing is left running.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from typing import Dict, List, Optional

import pytest

from .required import missing as missing_part

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo")


def missing_tools() -> List[str]:
    return [t for t in DAEMONS if shutil.which(t) is None
            and not os.path.exists(os.path.join("/usr/sbin", t))]


def _tool(name: str) -> str:
    return shutil.which(name) or os.path.join("/usr/sbin", name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """One-node cluster under ``root``; ``env`` is what clients (sbatch, srun) need."""

    def __init__(self, root: str, cpus: int = 8):
        self.root = root
        self.cpus = cpus
        self.token = uuid.uuid4().hex
        self.conf = os.path.join(root, "slurm.conf")
        self.procs: Dict[str, subprocess.Popen] = {}
        self.host = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        for k in list(self.env):
            if k.startswith("SLURM_") and k != "SLURM_CONF":
                del self.env[k]

    # ------------------------------------------------------------ start
    def start(self, wait_s: float = 60.0) -> "SlurmCluster":
        munge = os.path.join(self.root, "munge")
        for d in (munge, os.path.join(self.root, "state"), os.path.join(self.root, "spool")):
            os.makedirs(d, exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(munge, 0o700)
        key = os.path.join(munge, "munge.key")
        with open(key, "wb") as fh:
            fh.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.socket = os.path.join(munge, "munge.socket")
        daemon_env = {**self.env, "GNNPAR_SLURM_FIXTURE": self.token}
        self._spawn("munged", [_tool("munged"), "--foreground", "--force", f"--key-file={key}",
                               f"--socket={self.socket}",
                               f"--pid-file={munge}/munged.pid",
                               f"--log-file={munge}/munged.log",
                               f"--seed-file={munge}/munged.seed"], daemon_env)
        self._wait(lambda: os.path.exists(self.socket), 20, "munged socket")
        self._write_conf()
        self._spawn("slurmctld", [_tool("slurmctld"), "-D", "-c", "-f", self.conf], daemon_env)
        self._spawn("slurmd", [_tool("slurmd"), "-D", "-f", self.conf], daemon_env)
        self._wait(self._idle, wait_s, "an idle node in sinfo")
        return self

    def _spawn(self, name: str, argv: List[str], env) -> None:
        log = open(os.path.join(self.root, f"{name}.stdout"), "wb")
        self.procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def _write_conf(self) -> None:
        with open("/proc/meminfo") as fh:
            mem_mb = int(fh.readline().split()[1]) // 1024
        r = self.root
        text = f"""ClusterName=gnnpartest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=30
KillWait=10
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={max(mem_mb - 1024, 1024)} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
        with open(self.conf, "w") as fh:
            fh.write(text)

    def _idle(self) -> bool:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}: {self.logs()}")
        res = subprocess.run([_tool("sinfo"), "-h", "-o", "%T"], env=self.env,
                             capture_output=True, text=True)
        return res.returncode == 0 and "idle" in res.stdout.split()

    def _wait(self, cond, limit: float, what: str) -> None:
        deadline = time.monotonic() + limit
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"SLURM fixture: no {what} after {limit:.0f} s: {self.logs()}")
            time.sleep(0.3)

    def logs(self, tail: int = 15) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "munge/munged.log", "slurmctld.stdout",
                     "slurmd.stdout", "munged.stdout"):
            path = os.path.join(self.root, name)
            if os.path.exists(path):
                with open(path, errors="replace") as fh:
                    lines = fh.read().splitlines()[-tail:]
                out.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(out)

    # ------------------------------------------------------------ jobs
    def sbatch_wait(self, script: str, options: List[str], env: Optional[dict] = None,
                    cwd: Optional[str] = None, timeout: float = 300.0):
        """Submit ``script`` with ``sbatch --wait`` and return (exit code, job id, output)."""
        out = os.path.join(self.root, f"job-{uuid.uuid4().hex[:8]}.out")
        run_env = {**self.env, **(env or {})}
        res = subprocess.run([_tool("sbatch"), "--wait", "--parsable", f"--output={out}",
                              *options, script], env=run_env, cwd=cwd, capture_output=True,
                             text=True, timeout=timeout)
        job = res.stdout.strip().split(";")[0]
        text = open(out, errors="replace").read() if os.path.exists(out) else ""
        return res.returncode, job, text + res.stderr

    # ------------------------------------------------------------ stop
    def stop(self) -> List[str]:
        """Cancel jobs, stop the daemons, kill stragglers; return what had to be killed."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run([_tool("scancel"), "--quiet", "--full", "--partition=debug"],
                           env=self.env, capture_output=True, timeout=30)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                res = subprocess.run([_tool("squeue"), "-h"], env=self.env, capture_output=True,
                                     text=True, timeout=30)
                if res.returncode != 0 or not res.stdout.strip():
                    break
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        killed = []
        for _ in range(3):
            strays = self.stragglers()
            if not strays:
                break
            for pid, name in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(f"{pid} {name}")
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        return killed

    def stragglers(self) -> List[tuple]:
        """(pid, name) of live processes carrying this cluster's token in their environment."""
        needle = f"GNNPAR_SLURM_FIXTURE={self.token}".encode()
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    if needle not in fh.read().split(b"\0"):
                        continue
                with open(f"/proc/{pid}/stat") as fh:
                    stat = fh.read()
                if stat.rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                found.append((int(pid), stat.split("(", 1)[1].rsplit(")", 1)[0]))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        return found


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A running one-node cluster for the module's tests; stopped (and checked) afterwards."""
    missing = missing_tools()
    if missing:
        missing_part(f"SLURM is not installed (missing {', '.join(missing)}): "
                    "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client "
                    "munge")
    if os.geteuid() != 0:
        missing_part("the local SLURM fixture runs its daemons as root (SlurmUser=root)")
    root = str(tmp_path_factory.mktemp("slurm"))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        left = cluster.stragglers() + [(p.pid, n) for n, p in cluster.procs.items()
                                       if p.poll() is None]
    assert not left, f"SLURM processes left behind: {left}"
