"""One rank of the watchdog tests: a loop of small all-reduces under gnnpar.watchdog.

    python tests/watchdog_worker.py RANK WORLD INIT_METHOD DIR MODE [TIMEOUT]

MODE: ``loop`` (runs until killed or a peer is lost), ``finish`` (5 epochs then a clean
stop; rank 0 lingers past the timeout first), ``hang1`` (rank 1 stops making progress in
epoch 2 while staying alive), ``sigterm`` (runs until SIGTERM reaches some rank, then every
rank writes ``DIR/preempted-<rank>`` naming its epoch and exits 143).
Each rank touches ``DIR/ready-<rank>`` after its second epoch.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gnnpar.watchdog import Watchdog, on_sigterm  # noqa: E402


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
    wd = Watchdog(rank, world, timeout=timeout, interval=0.25,
                  stall_timeout=timeout if mode == "hang1" else None).start()
    try:
        with wd.guard():
            while mode != "finish" or epoch < 5:
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
        if mode == "finish" and rank == 0:
            time.sleep(timeout + 1.5)  # peers are done and gone: no false alarm
    finally:  # as gnnpar's ranks do: stop beating and leave the group on every way out
        wd.stop()
        dist.destroy_process_group()
    print(f"rank {rank} finished after {epoch} epochs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
