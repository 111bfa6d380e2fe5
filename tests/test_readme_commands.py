"""Every command the README prints, run the way a user runs it (issue 43, item 6): each
```` ```bash ```` block of README.md goes to ``bash -e`` as printed, from an empty folder (the
SLURM block from the checkout, where its template lives), with the installed console scripts
first on ``PATH`` and no ``PYTHONPATH``. A block that names ``my_gnn`` gets the README's GIN
saved as ``my_gnn.py`` beside it, as the README says to do. Each block must exit 0 and leave
every file its commands were told to write (``--out``, ``--log-json``, ``--save-model``).

Two kinds of line are checked rather than run here: the set-up commands (what ``.ci/run``
does around this suite: the test command they print must be the one ``.ci/run`` runs) and
``sbatch`` (``tests/test_slurm.py`` submits the template it names to a one-node SLURM)."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from .cli_util import ROOT, readme_gin

README = os.path.join(ROOT, "README.md")
#: flags whose value is a path the command must leave behind
WRITES = ("--out", "--log-json", "--save-model")


def bash_blocks() -> list:
    return re.findall(r"```bash\n(.*?)```", open(README).read(), re.S)


def commands(block: str) -> list:
    """The block's commands: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = (line.split("  #")[0].strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def is_setup(block: str) -> bool:
    return "python3 -m venv" in block


RUN = [b for b in bash_blocks() if not is_setup(b)]


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


@pytest.mark.parametrize("block", RUN, ids=[commands(b)[0].split()[0] + f"-{i}"
                                            for i, b in enumerate(RUN)])
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
