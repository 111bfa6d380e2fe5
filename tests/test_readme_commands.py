"""Every command the README prints, run the way a user runs it (issue 43, item 6): each
```` ```bash ```` block of README.md goes to ``bash -e`` as printed, from an empty folder (the
SLURM block from the checkout, where its template lives), with the installed console scripts
first on ``PATH`` and no ``PYTHONPATH``. A block that names ``my_gnn`` gets the README's GIN
saved as ``my_gnn.py`` beside it, as the README says to do. Each block must exit 0 and leave
every file its commands were told to write (``--out``, ``--log-json``, ``--save-model``).
The user guide's (``docs/guide.md``) blocks on ``sbm:`` graphs run the same way but with
``--epochs`` capped at 2 (:func:`short`: the commands, their flags and the files they leave
are what is checked; 100 epochs of link training would add minutes and check nothing more);
the others need a graph the suite cannot make in minutes (R-MAT at scale 16–23) or a folder
the user has (an OGB download), so each of their commands is parsed by its tool's own parser
instead: a renamed flag or a value out of its choices fails here.

Two kinds of line are checked rather than run: the set-up commands (what ``.ci/run`` does
around this suite: the test command they print must be the one ``.ci/run`` runs) and
``sbatch`` (``tests/test_slurm.py`` submits the template it names to a one-node SLURM)."""
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from .cli_util import ROOT, readme_gin

README = os.path.join(ROOT, "README.md")
GUIDE = os.path.join(ROOT, "docs", "guide.md")
#: flags whose value is a path the command must leave behind
WRITES = ("--out", "--log-json", "--save-model")


def bash_blocks(path: str = README) -> list:
    return [textwrap.dedent(b) for b in
            re.findall(r"```bash\n(.*?)```", open(path).read(), re.S)]


def commands(block: str) -> list:
    """The block's commands: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = (line.split("  #")[0].strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def is_setup(block: str) -> bool:
    return "python3 -m venv" in block


def small(block: str) -> bool:
    """Every graph the block's commands name is a planted-community one (seconds to train)."""
    specs = re.findall(r"--dataset\s+(\S+)", block)
    return bool(specs) and all(spec.startswith("sbm:") for spec in specs)


def short(block: str) -> str:
    """The block with every ``--epochs N`` above 2 made ``--epochs 2``."""
    return re.sub(r"--epochs\s+(\d+)",
                  lambda m: f"--epochs {min(int(m.group(1)), 2)}", block)


RUN = [b for b in bash_blocks() if not is_setup(b)]
GUIDE_RUN = [short(b) for b in bash_blocks(GUIDE) if small(b)]
GUIDE_PARSED = [c for b in bash_blocks(GUIDE) if not small(b) for c in commands(b)]


def test_the_readme_prints_commands_to_run():
    assert len(RUN) >= 7 and len(bash_blocks()) - len(RUN) == 2


def test_the_printed_test_command_is_the_one_ci_runs():
    printed = [b for b in bash_blocks() if is_setup(b)][-1].split(" && ")
    assert "ruff check ." in printed
    test_cmd = shlex.split(printed[-1])
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    ci_cmd = shlex.split(next(line for line in ci.splitlines()
                              if line.startswith("python -m pytest")).split("#")[0])
    assert "ruff check ." in [line.split("#")[0].strip() for line in ci.splitlines()]
    i = ci_cmd.index("-p")  # CI alone keeps no cache in the clean clone
    assert ci_cmd[:i] + ci_cmd[i + 2:] == test_cmd


def written_paths(cmds: list) -> list:
    out = []
    for cmd in cmds:
        words = shlex.split(cmd)
        out += [words[i + 1] for i, w in enumerate(words[:-1]) if w in WRITES]
    return out


def test_the_guide_prints_commands_to_run_and_to_parse():
    assert len(GUIDE_RUN) >= 2 and len(GUIDE_PARSED) >= 6


#: the console scripts, by the module ``python -m`` / ``torchrun -m`` names
TOOLS = {"gnnpar-train": "gnnpar.cli.options", "gnnpar-partition": "gnnpar.cli.partition_cli",
         "gnnpar-plan": "gnnpar.cli.plan_cli", "gnnpar-predict": "gnnpar.predict",
         "gnnpar-report": "gnnpar.cli.report"}
MODULES = {"gnnpar.train": "gnnpar.cli.options", "gnnpar.predict": "gnnpar.predict"}


def tool_argv(cmd: str):
    """(parser module, argv) of a gnnpar command, under any launcher; None for another."""
    words = shlex.split(cmd)
    for i, w in enumerate(words):
        if w in TOOLS:
            return TOOLS[w], words[i + 1:]
        if w == "-m" and i + 1 < len(words) and words[i + 1] in MODULES:
            return MODULES[words[i + 1]], words[i + 2:]
    return None


@pytest.mark.parametrize("cmd", GUIDE_PARSED)
def test_guide_command_parses(cmd):
    import importlib
    found = tool_argv(cmd)
    assert found is not None, f"not a gnnpar command: {cmd}"
    module, argv = found
    try:
        importlib.import_module(module).build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{cmd!r} does not parse (exit {exc.code})")


@pytest.mark.parametrize("block", RUN + GUIDE_RUN,
                         ids=[("readme-" if i < len(RUN) else "guide-") +
                              commands(b)[0].split()[0] + f"-{i}"
                              for i, b in enumerate(RUN + GUIDE_RUN)])
def test_readme_block_runs_as_printed(block, tmp_path):
    cmds = commands(block)
    slurm = [c for c in cmds if c.startswith("sbatch ")]
    for cmd in slurm:
        template = os.path.basename(shlex.split(cmd)[-1])
        assert template in open(os.path.join(ROOT, "tests", "test_slurm.py")).read()
    cmds = [c for c in cmds if c not in slurm]
    cwd = ROOT if slurm else tmp_path
    if "my_gnn" in block:
        (tmp_path / "my_gnn.py").write_text(readme_gin())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    res = subprocess.run(["bash", "-e", "-c", "\n".join(cmds)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{cmds}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    for path in written_paths(cmds):
        assert os.path.exists(os.path.join(cwd, path)), (path, cmds)
