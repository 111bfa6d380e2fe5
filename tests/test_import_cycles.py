"""No import cycle anywhere in gnnpar (gnnpar/, kernels/, partitioners/, datasets/), counting
imports inside functions too: a function-local import hides a cycle, it does not remove it.

The modules are found where Python imports them from (each package's ``__path__``), and each
file's ``import`` statements are read from its syntax tree: module level, class bodies and
function bodies alike; only ``if TYPE_CHECKING:`` blocks are left out (never executed).
"""
import ast
import importlib
import os

PACKAGES = ("gnnpar", "gnnpar.kernels", "gnnpar.partitioners", "gnnpar.datasets")


def package_modules():
    """{module name: source file} of every module of :data:`PACKAGES` (sub-packages too)."""
    out = {}
    for pkg in PACKAGES:
        base = os.path.dirname(importlib.import_module(pkg).__file__)
        for root, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if os.path.isfile(os.path.join(root, d, "__init__.py"))]
            rel = os.path.relpath(root, base)
            prefix = pkg if rel == "." else pkg + "." + rel.replace(os.sep, ".")
            for f in files:
                if f.endswith(".py"):
                    out[prefix if f == "__init__.py" else f"{prefix}.{f[:-3]}"] = \
                        os.path.join(root, f)
    return out


def _type_checking(node) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: str, known):
    """[(target module, line)] of every executed import in the file, resolved to ``known``
    modules (``from a import b`` is a.b when that is a module, else a)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if sub in known else base, child.lineno))
            else:
                visit(child)
    visit(ast.parse(open(path).read(), path))
    return [(t, line) for t, line in found if t in known and t != name]


def find_cycles(graph):
    """Cycles of ``graph`` ({module: {target: line}}) met by a depth-first search, each as a
    module list: at least one in every group of modules that import each other, none when
    there is no cycle."""
    cycles, state, stack = [], {}, []

    def walk(v):
        state[v] = "open"
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == "open":
                cycles.append(stack[stack.index(w):] + [w])
            elif w not in state:
                walk(w)
        stack.pop()
        state[v] = "done"
    for v in sorted(graph):
        if v not in state:
            walk(v)
    return cycles


def test_modules_are_found():
    mods = package_modules()
    for name in ("gnnpar.train", "gnnpar.training.minibatch_loop", "gnnpar.kernels.comm",
                 "gnnpar.partitioners.shards", "gnnpar.datasets.graph"):
        assert name in mods


def test_finder_sees_a_function_level_cycle(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import pkg.b\n")
    b.write_text("def f():\n    from . import a\n")
    known = {"pkg.a": str(a), "pkg.b": str(b)}
    graph = {m: dict(imports_of(m, p, known)) for m, p in known.items()}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_no_import_cycles():
    mods = package_modules()
    graph = {m: dict(imports_of(m, p, mods)) for m, p in mods.items()}
    cycles = find_cycles(graph)
    shown = [" -> ".join(f"{v} ({os.path.relpath(mods[v])}:{graph[v][w]})"
                         for v, w in zip(c, c[1:])) + f" -> {c[-1]}" for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(shown)


#: third-party modules imported where they are used: optional extras (mpi4py, kaminpar, dgl)
#: or heavy ones most runs never touch (plotting, PyG interop, scipy's sparse constructors,
#: METIS, the progress bar, the kernel compilers numba and Triton), so ``gnnpar-train --help``
#: and a rank's start stay fast
LOCAL_OK = ("mpi4py", "kaminpar", "dgl", "matplotlib", "torch_geometric", "scipy", "pymetis",
            "tqdm", "ctypes", "torch", "numba", "triton")


def test_function_local_imports_only_for_optional_or_heavy_dependencies():
    """gnnpar's own modules are imported at module level (no hidden dependencies)."""
    bad = []
    for name, path in package_modules().items():
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and (sub.level or (sub.module or "")
                                                        .startswith("gnnpar")):
                    bad.append(f"{os.path.relpath(path)}:{sub.lineno}")
                elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                    mods = ([a.name for a in sub.names] if isinstance(sub, ast.Import)
                            else [sub.module])
                    bad += [f"{os.path.relpath(path)}:{sub.lineno} ({m})" for m in mods
                            if m.split(".")[0] not in LOCAL_OK]
    assert not bad, "function-local imports:\n" + "\n".join(bad)
