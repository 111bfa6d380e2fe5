"""Launch and liveness: find the world (serial, ``--nprocs``, torchrun, srun, mpirun:
``launch.py``, ``bootstrap.py``, ``hostlist.py``), start local ranks and watch them
(``spawn.py``, ``rank_start.py``, ``rank_join.py``, ``rank_watch.py``), the watchdog that
turns a lost peer or SIGTERM into an exit code (``watchdog.py``), and private scratch
folders (``scratch.py``)."""
