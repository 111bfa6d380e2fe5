"""How the local ranks of :func:`gnnpar.launcher.spawn.spawn` join their process group, and agree
that all of them did before any runs its work.

Gloo's listener routes a connection to a pair by a small sequence number alone, so a
connection from another world on the host (a rank retrying towards a peer that died, whose
port this world's listener now holds) can take a pair's place, and the rank left with the
real peer reads "Connection closed by peer" while the world connects. Such a failure is the
host's, not the run's: nothing of the work ran yet, so the world can simply be started again.

:func:`join` makes that decision safe. After its own attempt to join, each rank writes the
outcome to a second file store in the rendezvous folder and waits for every rank's; only
when all joined does any rank start its work. Otherwise every rank raises
:class:`JoinFailure` (the one that could not join, with its own error), and the parent sees a
world in which no rank ran anything (:func:`gnnpar.launcher.spawn.spawn` retries it once).
"""
from __future__ import annotations

import contextlib
import datetime

import torch.distributed as dist

from gnnpar.kernels.comm import init_process_group

from gnnpar.launcher.rank_watch import JoinFailure


def join(backend: str, store_path: str, rank: int, world: int, timeout_s: float) -> None:
    """Join the world's process group through the file store at ``store_path``; return once
    every rank has joined, or raise :class:`JoinFailure` on every rank."""
    timeout = datetime.timedelta(seconds=timeout_s)
    agree = dist.FileStore(store_path + ".joined", world) if world > 1 else None
    try:
        init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                           world_size=world, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - told to the peers, then raised as the cause
        if agree is not None:
            agree.set(f"rank{rank}", "0")
        raise JoinFailure(f"rank {rank} could not join: {type(e).__name__}: "
                          f"{' '.join(str(e).split())}") from e
    if agree is None:
        return
    agree.set(f"rank{rank}", "1")
    keys = [f"rank{r}" for r in range(world)]
    agree.wait(keys, timeout)
    failed = [r for r, k in enumerate(keys) if agree.get(k) != b"1"]
    if failed:
        with contextlib.suppress(Exception):  # the group is broken: leaving must not mask why
            dist.destroy_process_group()
        raise JoinFailure(f"rank {failed[0]} could not join the process group")
