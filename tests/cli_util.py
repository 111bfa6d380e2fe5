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




STATE = ("folder", "memory limit", "torch threads", "SIGTERM", "SIGINT")


def _process_state():
    import resource
    import signal

    import torch
    return (os.getcwd(), resource.getrlimit(resource.RLIMIT_AS), torch.get_num_threads(),
            signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))


def run_main(tool, *argv, cwd, env=None):
    """``tool ARGV`` run as its console script runs it — its ``main(argv)`` — but in this
    process, from ``cwd`` with ``env``'s variables set: for the cases a test expects refused
    before training (a new interpreter would spend seconds importing torch to print one
    line). Output is captured as a subprocess's is; the CompletedProcess it returns holds the
    exit code. The environment is put back as it was (a launch sizes numba's pool through
    it); a run that leaves other state of this process changed (its folder, memory limit,
    torch threads, signal handlers) fails the test: such a case belongs in a subprocess
    (:func:`run_installed`). Each test that uses this runs one case through the installed
    script too, so the console script's own path stays checked."""
    import contextlib
    import io
    from importlib.metadata import entry_points
    # the function the installed script calls (setup.cfg's console_scripts)
    main = next(e for e in entry_points(group="console_scripts") if e.name == tool).load()
    before, environ = _process_state(), dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as e:  # argparse's exit
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(before[0])
        os.environ.clear()
        os.environ.update(environ)
    changed = [name for name, a, b in zip(STATE, before, _process_state()) if a != b]
    assert not changed, f"{tool} {argv} changed this process's {changed}: run it as a subprocess"
    return subprocess.CompletedProcess([tool, *argv], code, out.getvalue(), err.getvalue())
