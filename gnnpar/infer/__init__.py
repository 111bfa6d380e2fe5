"""Using a trained model: its forward pass over every row, whole or layer by layer in row
chunks (``inference.py``), one rank's prediction run and ``--save-predictions``
(``prediction.py``), the shared memory-mapped output files in the dataset's order
(``predict_files.py``) and the model file ``--save-model`` writes (``saved_model.py``)."""
