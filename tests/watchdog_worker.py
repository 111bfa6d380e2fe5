"""One rank of the watchdog tests: a loop of small all-reduces under gnnpar.launcher.watchdog.

    python tests/watchdog_worker.py RANK WORLD INIT_METHOD DIR MODE [TIMEOUT]

MODE: ``loop`` (runs until killed or a peer is lost), ``finish`` (5 epochs then a clean
stop; rank 0 lingers past the timeout first), ``finish-inflight`` (as ``finish``, but every
other rank stops while a heartbeat of its watchdog thread is in flight: see
:class:`BeatInFlight`), ``hang1`` (rank 1 stops making progress in
epoch 2 while staying alive), ``sigterm`` (runs until SIGTERM reaches some rank, then every
rank writes ``DIR/preempted-<rank>`` naming its epoch and exits 143).
Each rank touches ``DIR/ready-<rank>`` after its second epoch.
"""
import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gnnpar.launcher.watchdog import Watchdog, on_sigterm  # noqa: E402


class BeatInFlight:
    """The default store, except that once armed, the next heartbeat of this rank's watchdog
    thread is held in flight until the main thread's ``done`` beat has landed (at most 1 s):
    the interleaving, seen under load, in which a "run" beat built just before ``stop()``
    landed after the "done" beat, so the finished rank looked silent and was reported lost."""

    def __init__(self, store, key):
        self.underlying_store = store  # gnnpar.launcher.watchdog finds the TCPStore's owner through it
        self.key = key
        self.armed, self.in_flight, self.done_landed = (threading.Event() for _ in range(3))

    def set(self, key, value):
        main = threading.current_thread() is threading.main_thread()
        if key == self.key and not main and self.armed.is_set() \
                and not self.in_flight.is_set():
            self.in_flight.set()
            self.done_landed.wait(1.0)
        self.underlying_store.set(key, value)
        if key == self.key and main and ":done:" in value:
            self.done_landed.set()

    def check(self, keys):
        return self.underlying_store.check(keys)

    def get(self, key):
        return self.underlying_store.get(key)


def main() -> int:
    rank, world, init, out, mode = sys.argv[1:6]
    rank, world = int(rank), int(world)
    timeout = float(sys.argv[6]) if len(sys.argv) > 6 else 4.0
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    epoch = 0
    hook = None
    if mode == "sigterm":
        def write_checkpoint():
            with open(os.path.join(out, f"preempted-{rank}"), "w") as fh:
                fh.write(str(epoch))
        hook = on_sigterm(write_checkpoint)
    finish = mode.startswith("finish")
    store = None
    if mode == "finish-inflight" and rank != 0:
        store = BeatInFlight(dist.distributed_c10d._get_default_store(), f"gnnpar/watchdog/{rank}")
    wd = Watchdog(rank, world, store=store, timeout=timeout, interval=0.25,
                  stall_timeout=timeout if mode == "hang1" else None).start()
    try:
        with wd.guard():
            while not finish or epoch < 5:
                for phase in ("forward", "backward"):
                    wd.set_phase(f"epoch {epoch}/{phase}")
                    if mode == "hang1" and rank == 1 and epoch == 2:
                        while True:  # alive (the heartbeat thread runs) but stuck
                            time.sleep(0.1)
                    t = torch.full((64,), float(rank))
                    with wd.collective():
                        dist.all_reduce(t)
                    assert float(t[0]) == world * (world - 1) / 2
                    time.sleep(0.02)
                if epoch == 1:
                    open(os.path.join(out, f"ready-{rank}"), "w").close()
                if hook is not None:
                    hook.check()  # SystemExit(143) on every rank once one was signalled
                epoch += 1
        if finish and rank == 0:
            time.sleep(timeout + 1.5)  # peers are done and gone: no false alarm
        if store is not None:
            store.armed.set()
            store.in_flight.wait(5)  # stop() below races this beat
    finally:  # as gnnpar's ranks do: stop beating and leave the group on every way out
        wd.stop()
        dist.destroy_process_group()
    print(f"rank {rank} finished after {epoch} epochs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
