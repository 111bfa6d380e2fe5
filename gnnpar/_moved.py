"""The import paths of modules that moved into gnnpar's rooms (``gnnpar.cli``,
``gnnpar.launcher``, ``gnnpar.nn``, ``gnnpar.training``, ``gnnpar.infer``) keep working:
``import gnnpar.trainer`` gives the module :mod:`gnnpar.training.trainer` itself (the same
object, so a patch through either name is seen through both) with a ``DeprecationWarning``
naming the new path. Installed by ``gnnpar/__init__.py``; imports nothing heavy."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_ROOMS = {
    "cli": "options spec cli_common partition_cli plan_cli report calibrate",
    "launcher": "launch spawn rank_watch rank_start rank_join bootstrap hostlist watchdog "
                "scratch",
    "nn": "models model_registry attention custom_model dropout precision loss product_order",
    "training": "trainer epochs serial distributed rows rank shard_source logged checkpoint "
                "resume memory",
    "infer": "inference prediction predict_files saved_model",
}

#: old module name -> the module's name now
MOVED = {f"gnnpar.{m}": f"gnnpar.{room}.{m}" for room, mods in _ROOMS.items()
         for m in mods.split()}
MOVED.update({"gnnpar.sampling.loop": "gnnpar.training.minibatch_loop",
              "gnnpar.sampling.setup": "gnnpar.training.minibatch_setup"})


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the module under its new name."""

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old name "
                      f"will go)", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # the module ran when its new name was imported


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
