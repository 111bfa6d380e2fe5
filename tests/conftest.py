"""Suite-wide settings, inherited by every rank and command the tests start.

``GNNPAR_COMM_STRICT=1``: a gnnpar module that calls a ``torch.distributed`` collective itself
(instead of going through ``gnnpar.kernels.comm``) fails the test that reaches it.
"""
import os

os.environ["GNNPAR_COMM_STRICT"] = "1"
