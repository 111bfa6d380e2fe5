"""Models: the ``GNN`` stack and its layers (``models.py``: GCN, SAGE, GIN-style user layers
through ``register_layer``; ``attention.py``: GAT), the model registry every tool reads by name
(``model_registry.py``), a user's ``--model module:factory`` (``custom_model.py``), the fused
bias+ReLU+dropout epilogue (``dropout.py``), ``--precision`` (``precision.py``) and its CPU bf16
dense products (``bf16_dense.py``), the loss (``loss.py``) and the order a layer multiplies in
(``product_order.py``)."""
