"""What tests that run gnnpar's commands as subprocesses share."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_train(*argv, timeout=300, cwd=None):
    """``python -m gnnpar.train ARGV`` from the checkout; the finished CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "gnnpar.train", *argv], cwd=cwd or ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)
