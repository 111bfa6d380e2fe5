"""Two "hosts" on one machine: two network namespaces joined by a veth pair (10.250.0.1/30
and 10.250.0.2/30, nothing else but loopback inside), one torchrun agent in each meeting
through the c10d rendezvous at 10.250.0.1 — as multi_node_gpu.sbatch does across nodes —
each starting one rank of tests/rank_probe.py (gloo all-reduce + 1D SpMM, gloo bound to the
veth). The result must equal the one-host run bit for bit. Needs root and iproute2
(apt-get install iproute2); skipped with the reason otherwise. Namespaces are removed in a
finally.
"""
import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from gnnpar.launcher.bootstrap import free_port

from .cli_util import ROOT
from .required import missing as missing_part
PROBE = os.path.join(ROOT, "tests", "rank_probe.py")
ADDRS = ("10.250.0.1", "10.250.0.2")


def ip(*args, check=True):
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


class VethPair:
    """Namespaces ns[0], ns[1] with veth ends dev[0], dev[1] holding ADDRS."""

    def __init__(self):
        tag = uuid.uuid4().hex[:6]
        self.ns = (f"gnnpar-{tag}-0", f"gnnpar-{tag}-1")
        self.dev = (f"gp{tag}a", f"gp{tag}b")

    def create(self):
        for ns in self.ns:
            ip("netns", "add", ns)
        ip("link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
        for ns, dev, addr in zip(self.ns, self.dev, ADDRS):
            ip("link", "set", dev, "netns", ns)
            ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def kill_inside(self):
        for ns in self.ns:
            res = ip("netns", "pids", ns, check=False)
            for pid in res.stdout.split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass

    def destroy(self):
        self.kill_inside()
        for ns in self.ns:
            ip("netns", "del", ns, check=False)  # takes its veth end (and the pair) along
        ip("link", "del", self.dev[0], check=False)


def base_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PMI_", "OMPI_", "PMIX_", "MASTER_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    return env


def read(out, world=2):
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


@pytest.fixture
def veth():
    if os.geteuid() != 0:
        missing_part("network namespaces need root")
    if shutil.which("ip") is None:
        missing_part("iproute2 is not installed (apt-get install -y iproute2)")
    pair = VethPair()
    try:
        try:
            pair.create()
        except RuntimeError as e:
            missing_part(f"cannot create network namespaces here: {e}")
        yield pair
    finally:
        pair.destroy()
    leftover = ip("netns", "list").stdout
    assert not any(ns in leftover for ns in pair.ns), leftover


def test_two_namespaces_equal_one_host(veth, tmp_path):
    port = 29000 + int(uuid.uuid4().int % 1000)  # inside fresh namespaces every port is free
    two = tmp_path / "two_hosts"
    procs = []
    try:
        for k in range(2):
            env = {**base_env(), "GLOO_SOCKET_IFNAME": veth.dev[k]}
            cmd = ["ip", "netns", "exec", veth.ns[k], sys.executable, "-m", "torch.distributed.run",
                   "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                   f"--rdzv-endpoint={ADDRS[0]}:{port}", "--rdzv-id=gnnpar-netns",
                   f"--local-addr={ADDRS[k]}", "--max-restarts=0",
                   # the agent in ns0 serves the rendezvous store: its hostname does not
                   # resolve to 10.250.0.1, so torchrun cannot tell by itself
                   f"--rdzv-conf=is_host={int(k == 0)},join_timeout=60", PROBE, "--out", str(two),
                   "--timeout", "60"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    hosts = read(two)
    assert {r["source"] for r in hosts} == {"torchrun"}
    assert {r["all_reduce"] for r in hosts} == {3.0}
    assert {r["master"].split(":")[0] for r in hosts} <= set(ADDRS)
    assert max(r["z_err"] for r in hosts) < 1e-5 and max(r["dh_err"] for r in hosts) < 1e-5

    one = tmp_path / "one_host"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                          f"--master-port={free_port('127.0.0.1')}", PROBE, "--out", str(one),
                          "--timeout", "60"], env=base_env(), capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    local = read(one)
    for a, b in zip(hosts, local):
        assert a["z"] == b["z"] and a["dh"] == b["dh"]  # bit for bit


def test_namespaces_are_isolated(veth):
    """Each namespace sees only loopback and its veth end: no route leaves the pair."""
    for ns, dev, addr in zip(veth.ns, veth.dev, ADDRS):
        links = ip("-n", ns, "-o", "link").stdout
        assert {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()} \
            == {"lo", dev}
        addrs = ip("-n", ns, "-o", "-4", "addr").stdout
        assert f"{addr}/30" in addrs and "127.0.0.1/8" in addrs and len(addrs.splitlines()) == 2
        routes = ip("-n", ns, "route").stdout
        assert "default" not in routes and "10.250.0.0/30" in routes
