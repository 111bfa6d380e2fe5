"""Setup-path tracer for issue 12 (loaded by trace_setup.py through PYTHONPATH).

Active only when GNNPAR_TRACE_DIR is set. Records, per process, every call/return of a
Python function defined in the package folders (GNNPAR_TRACE_ROOTS, ':'-separated absolute
folders) until the first call of a function named in GNNPAR_TRACE_STOP; then writes
GNNPAR_TRACE_DIR/<pid>.json and stops tracing. A call is "followed" when one of its
parameters or closure variables is an instance of a class named in GNNPAR_TRACE_FOLLOW
(default: Namespace,RunSpec) - i.e. the function receives the run's settings.
"""
import json
import os
import sys

_DIR = os.environ.get("GNNPAR_TRACE_DIR")
if _DIR:
    _ROOTS = tuple(os.path.realpath(r) + os.sep for r in
                   os.environ.get("GNNPAR_TRACE_ROOTS", "").split(":") if r)
    _BASE = os.environ.get("GNNPAR_TRACE_BASE", "")
    _STOP = set(os.environ.get("GNNPAR_TRACE_STOP", "train_step,train_epoch,_collect").split(","))
    _FOLLOW = set(os.environ.get("GNNPAR_TRACE_FOLLOW", "Namespace,RunSpec").split(","))
    _events = []          # [kind, file, qualname, line, followed, depth]
    _open = {}            # id(frame) -> (file, qualname, line, followed)
    _filecache = {}
    _state = {"done": False, "depth": 0, "stop": None}

    def _rel(fn):
        r = _filecache.get(fn)
        if r is None:
            real = os.path.realpath(fn)
            r = ""
            if real.startswith(_ROOTS):
                r = os.path.relpath(real, _BASE) if _BASE else real
            _filecache[fn] = r
        return r

    def _followed(frame):
        co = frame.f_code
        n = co.co_argcount + co.co_kwonlyargcount + bool(co.co_flags & 4) + bool(co.co_flags & 8)
        names = co.co_varnames[:n] + co.co_freevars
        loc = frame.f_locals
        for nm in names:
            v = loc.get(nm)
            if v is not None and type(v).__name__ in _FOLLOW:
                return nm
        return ""

    def _dump():
        if _state["done"]:
            return
        _state["done"] = True
        sys.setprofile(None)
        os.makedirs(_DIR, exist_ok=True)
        with open(os.path.join(_DIR, f"{os.getpid()}.json"), "w") as f:
            json.dump({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv,
                       "stop": _state["stop"], "rank": _state.get("rank"), "events": _events}, f)

    def _prof(frame, event, arg):
        if event == "call":
            co = frame.f_code
            name = co.co_name
            if name.startswith("<"):
                return
            rel = _rel(co.co_filename)
            if not rel:
                return
            if name in _STOP:
                _state["stop"] = [rel, co.co_qualname, co.co_firstlineno]
                _dump()
                return
            fol = _followed(frame)
            if _state.get("rank") is None and "rank" in co.co_varnames[:co.co_argcount]:
                r = frame.f_locals.get("rank")
                if isinstance(r, int):
                    _state["rank"] = r
            up = _open.get(id(frame.f_back)) if frame.f_back is not None else None
            pfol = bool(up and up[3])
            _open[id(frame)] = (rel, co.co_qualname, co.co_firstlineno, fol, pfol)
            _events.append(["call", rel, co.co_qualname, co.co_firstlineno, fol, pfol])
        elif event == "return":
            key = _open.pop(id(frame), None)
            if key is not None:
                _events.append(["return", *key])

    import atexit
    atexit.register(_dump)
    sys.setprofile(_prof)
