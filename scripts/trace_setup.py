#!/usr/bin/env python3
"""The path one training step's setup takes, measured on real runs (issue 12's before/after).

    python scripts/trace_setup.py [--repo CHECKOUT] [--cases serial,fb-1d-halo,mb-dp] [--json OUT]

Runs ``python -m gnnpar.train`` three times on a tiny SBM graph, 1 epoch:
  serial    : full batch, one process
  fb-1d-halo: --nprocs 2 --algo 1d-halo
  mb-dp     : --nprocs 2 --mode minibatch --fanouts 4,4 --batch-size 32
with tracehook/sitecustomize.py on PYTHONPATH (sys.setprofile in the parent and in every
spawned rank). Tracing of a process stops at the first call of a function named in --stop
(default train_step, train_epoch: the first training step; _collect: a --nprocs parent
waiting for its ranks).

Counting method (repeatable after the refactor; only functions defined in the package
folders gnnpar/, kernels/, partitioners/, datasets/ of --repo; module bodies, lambdas and
comprehensions are ignored; a generator's resume counts as a call, its yield as a return):
  * FOLLOWED path ("following args"): calls whose parameters or closure variables include an
    instance of a class named in --follow (default Namespace,RunSpec: the run's settings).
      - path      : those calls in order (parent until it waits for the ranks, then rank 0)
      - files     : distinct files holding a followed function
      - calls/file: followed calls per file ("dist_train.py entered N times")
      - returns   : return events of followed calls completed before the first step
      - ret_stmts : explicit `return` statements (AST) in the distinct followed functions
  * ALL: every package-function call before the first step (distinct files, functions,
    calls, returns) - the raw size of setup.
Rank 1 is reported too (its path is rank 0's modulo `rank == 0` branches).
"""
from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "sbm:n=200,blocks=4,p_in=0.1,p_out=0.01,feat=8,seed=0"
COMMON = ["--dataset", DATA, "--epochs", "1", "--quiet", "--hidden", "8", "--device", "cpu"]
CASES = {
    "serial": [],
    "fb-1d-halo": ["--nprocs", "2", "--algo", "1d-halo"],
    "mb-serial": ["--mode", "minibatch", "--fanouts", "4,4", "--batch-size", "32"],
    "mb-dp": ["--nprocs", "2", "--mode", "minibatch", "--fanouts", "4,4", "--batch-size", "32"],
}
PKG_DIRS = ("gnnpar", "kernels", "partitioners", "datasets")


def run_case(name, extra, repo, follow, stop, keep):
    out = tempfile.mkdtemp(prefix=f"trace-{name}-", dir=keep)
    env = dict(os.environ)
    env.update(GNNPAR_TRACE_DIR=out, GNNPAR_TRACE_BASE=repo,
               GNNPAR_TRACE_ROOTS=":".join(os.path.join(repo, d) for d in PKG_DIRS),
               GNNPAR_TRACE_FOLLOW=follow, GNNPAR_TRACE_STOP=stop,
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "tracehook"), repo,
                                           env.get("PYTHONPATH", "")]),
               PYTHONPYCACHEPREFIX=os.path.join(keep, "pycache"))
    cmd = [sys.executable, "-m", "gnnpar.train", *COMMON, *extra]
    p = subprocess.Popen(cmd, cwd=keep, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    so, se = p.communicate(timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{name}: exit {p.returncode}\n{se[-3000:]}")
    procs = {}
    for fn in os.listdir(out):
        with open(os.path.join(out, fn)) as f:
            d = json.load(f)
        if d["events"]:
            procs[d["pid"]] = d
    parent = procs.pop(p.pid)
    ranks = {d.get("rank"): d for d in procs.values() if d["ppid"] == p.pid}
    return {"cmd": " ".join(cmd[1:]), "parent": parent, "ranks": ranks}


_AST = {}


def static_returns(repo, rel, qualname, line):
    """Explicit `return` statements in the function (nested defs excluded)."""
    path = os.path.join(repo, rel)
    if path not in _AST:
        _AST[path] = ast.parse(open(path).read())
    short = qualname.split(".")[-1]
    for node in ast.walk(_AST[path]):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == short:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first == line or node.lineno == line:
                n, todo = 0, list(node.body)
                while todo:
                    x = todo.pop()
                    if isinstance(x, ast.Return):
                        n += 1
                    if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                      ast.ClassDef)):
                        continue
                    todo.extend(ast.iter_child_nodes(x))
                return n
    return 0


def measure(events, repo, label):
    calls = [e for e in events if e[0] == "call"]
    rets = [e for e in events if e[0] == "return"]
    fcalls = [e for e in calls if e[4]]
    frets = [e for e in rets if e[4]]
    funcs = sorted({(e[1], e[2], e[3]) for e in fcalls})
    return {
        "path": [f"{label} {e[1]}:{e[2]}" for e in fcalls],
        "files": sorted({e[1] for e in fcalls}),
        "calls_per_file": dict(collections.Counter(e[1] for e in fcalls)),
        "calls": len(fcalls), "returns": len(frets),
        "functions": [f"{f}:{q}" for f, q, _ in funcs],
        "ret_stmts": sum(static_returns(repo, *f) for f in funcs),
        "front_files": sorted({e[1] for e in calls if e[4] or e[5]}),
        "front_calls": sum(1 for e in calls if e[4] or e[5]),
        "front_returns": sum(1 for e in rets if e[4] or e[5]),
        "front_path": [f"{label} {'' if e[4] else '  . '}{e[1]}:{e[2]}" for e in calls
                       if e[4] or e[5]],
        "all_files": sorted({e[1] for e in calls}),
        "all_functions": len({(e[1], e[2]) for e in calls}),
        "all_calls": len(calls), "all_returns": len(rets),
    }


def collapse(path):
    out = []
    for p in path:
        if out and out[-1][0] == p:
            out[-1][1] += 1
        else:
            out.append([p, 1])
    return [p if n == 1 else f"{p}  (x{n})" for p, n in out]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=os.path.dirname(HERE),
                    help="checkout to measure (default: this one; e.g. a `git worktree` of an "
                         "older commit for a before/after)")
    ap.add_argument("--follow", default="Namespace,RunSpec")
    ap.add_argument("--stop", default="train_step,train_epoch,_collect")
    ap.add_argument("--cases", default="serial,fb-1d-halo,mb-dp",
                    help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--json", default=None)
    ap.add_argument("--paths", action="store_true", help="also print the frontier paths")
    ap.add_argument("--keep", default=None, help="folder for raw traces (default: a temp dir)")
    a = ap.parse_args()
    repo = os.path.realpath(a.repo)
    keep = a.keep or tempfile.mkdtemp(prefix="issue12-trace-")
    report = {}
    U = collections.defaultdict(set)
    for name in a.cases.split(","):
        r = run_case(name, CASES[name], repo, a.follow, a.stop, keep)
        parts = [measure(r["parent"]["events"], repo, "parent")]
        if 0 in r["ranks"]:
            parts.append(measure(r["ranks"][0]["events"], repo, "rank0"))
        seen, rs = set(), 0
        for ev in r["parent"]["events"] + (r["ranks"][0]["events"] if 0 in r["ranks"] else []):
            if ev[0] == "call" and ev[4] and (ev[1], ev[2], ev[3]) not in seen:
                seen.add((ev[1], ev[2], ev[3]))
                rs += static_returns(repo, ev[1], ev[2], ev[3])
        cat = lambda k: [x for m in parts for x in m[k]]
        tot = lambda k: sum(m[k] for m in parts)
        files, ffiles, afiles = set(cat("files")), set(cat("front_files")), set(cat("all_files"))
        U["files"] |= files
        U["front"] |= ffiles
        U["all"] |= afiles
        cpf = collections.Counter()
        for m in parts:
            cpf.update(m["calls_per_file"])
        v = report[name] = {
            "cmd": r["cmd"],
            "stops": {"parent": r["parent"]["stop"],
                      **{f"rank{k}": d["stop"] for k, d in r["ranks"].items()}},
            "followed": {"files": len(files), "calls": tot("calls"), "returns": tot("returns"),
                         "distinct_functions": len(seen), "ret_stmts": rs,
                         "calls_per_file": dict(cpf), "file_list": sorted(files),
                         "path": collapse(cat("path"))},
            "frontier": {"files": len(ffiles), "calls": tot("front_calls"),
                         "returns": tot("front_returns"), "file_list": sorted(ffiles),
                         "path": collapse(cat("front_path"))},
            "all": {"files": len(afiles), "calls": tot("all_calls"),
                    "returns": tot("all_returns")},
        }
        if 1 in r["ranks"]:
            m1 = measure(r["ranks"][1]["events"], repo, "rank1")
            v["rank1"] = {"followed": [len(m1["files"]), m1["calls"], m1["returns"]],
                          "frontier": [len(m1["front_files"]), m1["front_calls"],
                                       m1["front_returns"]]}
    cases = [k for k in report]
    report["_total"] = total = {
        "followed": {"files_union": len(U["files"]),
                     "files_sum": sum(report[c]["followed"]["files"] for c in cases),
                     "calls_sum": sum(report[c]["followed"]["calls"] for c in cases),
                     "returns_sum": sum(report[c]["followed"]["returns"] for c in cases),
                     "ret_stmts_sum": sum(report[c]["followed"]["ret_stmts"] for c in cases)},
        "frontier": {"files_union": len(U["front"]),
                     "files_sum": sum(report[c]["frontier"]["files"] for c in cases),
                     "calls_sum": sum(report[c]["frontier"]["calls"] for c in cases),
                     "returns_sum": sum(report[c]["frontier"]["returns"] for c in cases)},
        "all": {"files_union": len(U["all"]),
                "calls_sum": sum(report[c]["all"]["calls"] for c in cases),
                "returns_sum": sum(report[c]["all"]["returns"] for c in cases)},
        "frontier_file_union": sorted(U["front"]),
    }
    for name in cases:
        v = report[name]
        f, fr = v["followed"], v["frontier"]
        print(f"== {name}: {v['cmd']}")
        print(f"   stops: {v['stops']}")
        print(f"   FOLLOWED: files={f['files']} calls={f['calls']} returns={f['returns']} "
              f"distinct_functions={f['distinct_functions']} ret_stmts={f['ret_stmts']}")
        print(f"   FRONTIER: files={fr['files']} calls={fr['calls']} returns={fr['returns']}")
        print(f"   ALL:      files={v['all']['files']} calls={v['all']['calls']} "
              f"returns={v['all']['returns']}")
        if "rank1" in v:
            print(f"   rank1 (files, calls, returns): {v['rank1']}")
        print("   followed calls per file: " + ", ".join(
            f"{k}={n}" for k, n in sorted(f["calls_per_file"].items())))
        print("   frontier files: " + " ".join(fr["file_list"]))
        for line in (fr["path"] if a.paths else f["path"]):
            print("     " + line)
    print("== TOTAL")
    for k in ("followed", "frontier", "all"):
        print(f"   {k}: {json.dumps(total[k])}")
    print(f"   frontier files (union): {' '.join(total['frontier_file_union'])}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=1)
    if not a.keep:
        shutil.rmtree(keep, ignore_errors=True)


if __name__ == "__main__":
    main()
