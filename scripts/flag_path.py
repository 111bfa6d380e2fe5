"""How far ``--algo``'s value travels: the calls and files gnnpar-train passes it through
from the command line to the algorithm's builder.

Runs gnnpar-train's ``main`` in this process as rank 0 of a world of one (the environment
torchrun gives a rank), traces every call into the checkout's own files, and counts a call as a
step of the path when one of its arguments is the value or carries it: the string itself, an
object or dict whose ``algo`` is it (or a section of it, as the run spec's ``parallel``), or
the registry entry it names. Tracing stops at the first call of that entry's ``build``. It
prints the steps in order, then the number of steps, of distinct functions and of files.

    python scripts/flag_path.py                          # the installed checkout
    python scripts/flag_path.py --root /tmp/old-checkout # another commit's tree, same method

``--root`` puts that tree first on ``sys.path``, so the same count can be taken at an older
commit (``git worktree add /tmp/old-checkout COMMIT``).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile


def _carries(value, algo: str, entry) -> bool:
    if value is entry:
        return True
    if type(value) is str:
        return value == algo
    if isinstance(value, dict):
        return value.get("algo") == algo
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # the run spec carries it in a section (``spec.parallel.algo``)
        return getattr(value, "algo", None) == algo or any(
            dataclasses.is_dataclass(v) and _carries(v, algo, entry)
            for v in (getattr(value, f.name) for f in dataclasses.fields(value)))
    fields = getattr(value, "__dict__", None)
    return isinstance(fields, dict) and fields.get("algo") == algo


def trace_path(root: str, argv: list, algo: str):
    """The steps (file, line, function) from ``main(argv)`` to ``get(algo).build``."""
    from gnnpar.kernels import algorithms
    from gnnpar.train import main

    entry = algorithms.get(algo)
    build = getattr(entry.build, "__code__", None)
    steps, done = [], []
    homes = tuple(os.path.join(os.path.realpath(root), d) + os.sep
                  for d in ("gnnpar", "kernels", "partitioners", "datasets"))

    def on_call(frame, event, arg):
        if event != "call" or done:
            return None
        code = frame.f_code
        if not os.path.realpath(code.co_filename).startswith(homes):
            return None
        n = code.co_argcount + code.co_kwonlyargcount
        n += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
        names = code.co_varnames[:n]
        local = frame.f_locals
        values = []
        for name in names:
            v = local.get(name)
            if name == "self":
                values.append(v)
                continue
            values.extend(v if isinstance(v, tuple) else (v,))
            if isinstance(v, dict):
                values.extend(v.values())
        if any(_carries(v, algo, entry) for v in values):
            where = os.path.relpath(os.path.realpath(code.co_filename), root)
            steps.append((where, code.co_firstlineno, code.co_qualname))
        if code is build:
            done.append(True)
        return None

    sys.settrace(on_call)
    try:
        main(argv)
    finally:
        sys.settrace(None)
    if not done:
        raise SystemExit(f"flag_path: {algo}'s builder was never called")
    return steps


def main_cli(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=None, help="a checkout to import gnnpar from (default: "
                   "the installed one)")
    p.add_argument("--algo", default="1d-halo")
    p.add_argument("--dataset", default="sbm:n=200,blocks=4,p_in=0.1,p_out=0.01")
    a = p.parse_args(argv)
    if a.root:
        sys.path.insert(0, os.path.realpath(a.root))
    import gnnpar
    root = a.root or os.path.dirname(os.path.dirname(os.path.realpath(gnnpar.__file__)))
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29400 + os.getpid() % 500))
    with tempfile.TemporaryDirectory() as tmp:
        steps = trace_path(root, ["--dataset", a.dataset, "--algo", a.algo, "--epochs", "1",
                                  "--quiet", "--log-json", os.path.join(tmp, "log.jsonl")],
                           a.algo)
    for i, (where, line, name) in enumerate(steps, 1):
        print(f"{i:3d} {where}:{line} {name}")
    functions = {(w, n) for w, _, n in steps}
    files = {w for w, _, _ in steps}
    print(f"steps {len(steps)}, functions {len(functions)}, files {len(files)} "
          f"(gnnpar at {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
