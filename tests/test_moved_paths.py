"""gnnpar's folders are its architecture's rooms (docs/architecture.md, "Layers"): the top
level keeps only the entry points and the contracts, and every module that moved into a room
still imports under its old name, as the very same module, with a warning naming the new."""
import json
import os
import subprocess
import sys

from gnnpar._moved import MOVED

from .cli_util import ROOT

TOP_LEVEL = {"__init__.py", "_moved.py", "interfaces.py", "predict.py", "train.py"}


def test_the_top_level_holds_only_entry_points_and_contracts():
    top = {f for f in os.listdir(os.path.join(ROOT, "gnnpar")) if f.endswith(".py")}
    assert top == TOP_LEVEL


def test_old_module_paths_import_the_moved_modules_with_a_warning():
    code = """
import importlib, json, warnings
from gnnpar._moved import MOVED
out = {}
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mod = importlib.import_module(old)
    out[old] = [mod is importlib.import_module(new), mod.__name__,
                [str(w.message) for w in seen if w.category is DeprecationWarning]]
from gnnpar import trainer  # the from-import form, once the old name is known
out["from"] = trainer is importlib.import_module("gnnpar.training.trainer")
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out.pop("from") is True
    assert set(out) == set(MOVED)
    for old, (same, name, warned) in out.items():
        assert same and name == MOVED[old], old
        assert warned == [f"{old} moved to {MOVED[old]}; import it from there (the old name "
                          f"will go)"], old
