"""The command line: the flags and the frozen run spec (``options.py``, ``spec.py``,
``cli_common.py``: shared flags, output-folder rules, exit codes), and the tools other than
training and prediction (``gnnpar-partition``: ``partition_cli.py``; ``gnnpar-plan`` and
``--calibrate``: ``plan_cli.py``, ``calibrate.py``; ``gnnpar-report``: ``report.py``).
``gnnpar-train`` and ``gnnpar-predict`` are :mod:`gnnpar.train` and :mod:`gnnpar.predict`,
so that ``python -m gnnpar.train`` stays what launchers run."""
