"""What tests that run gnnpar's commands as subprocesses share."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_train(*argv, timeout=300, cwd=None, env=None):
    """``python -m gnnpar.train ARGV`` from the checkout (``env``: variables to set beside
    ``PYTHONPATH``, which it may replace); the finished CompletedProcess."""
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-m", "gnnpar.train", *argv], cwd=cwd or ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def run_interpreted(script: str, done: str, timeout=600) -> None:
    """Run ``script`` in a child Python under Triton's interpreter (``TRITON_INTERPRET=1``:
    chosen when a kernel is defined, so a fresh process) and assert it printed ``done``."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=timeout, cwd=ROOT)
    assert res.returncode == 0 and done in res.stdout, res.stderr[-3000:]


def installed(tool: str) -> str:
    """The console script ``tool`` (``gnnpar-train``, …) installed beside this Python."""
    return os.path.join(os.path.dirname(sys.executable), tool)


def run_installed(tool, *argv, cwd, timeout=300, launcher=(), env=None):
    """The installed console script ``tool ARGV`` run from ``cwd`` as a user runs it: no
    ``PYTHONPATH`` (``env``: variables to set besides), optionally under ``launcher``
    (``[mpirun, "-n", "2"]``); the finished CompletedProcess."""
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **(env or {})}
    return subprocess.run([*launcher, installed(tool), *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def doc_text(*names) -> str:
    """README.md and the ``docs/`` pages ``names`` (``"guide.md"``, …), as one text."""
    paths = [os.path.join(ROOT, "README.md")] + [os.path.join(ROOT, "docs", n) for n in names]
    return "\n".join(open(p).read() for p in paths)


def readme_gin() -> str:
    """The README's GIN module, the python block under "## Your own GNN", as printed."""
    readme = doc_text()
    start = readme.index("## Your own GNN")
    end = readme.find("\n## ", start)
    section = readme[start:end if end > 0 else len(readme)]
    return section.split("```python\n", 1)[1].split("```", 1)[0]
