"""Training: a rank's setup for every mode (``rank.py``, ``shard_source.py``, ``rows.py``,
``minibatch_setup.py``), the full-batch runtimes (``serial.py``, ``distributed.py``), the one
epoch loop (``epochs.py``) that full batch (``trainer.py``) and mini batch
(``minibatch_loop.py``) hand their step to, and the state a run keeps: the log
(``logged.py``), checkpoints and resumption (``checkpoint.py``, ``resume.py``), memory
records (``memory.py``)."""
