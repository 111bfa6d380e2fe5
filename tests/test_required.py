"""tests/required.py: a part CI installs that is missing skips a test on a developer's
machine but fails it under CI=true (a skipped SLURM or namespace test must not hide a broken
install step)."""
import os
import subprocess
import sys

from .cli_util import ROOT

BODY = '''
from tests.required import missing

def test_needs_a_part():
    missing("frobnicator is not installed")
'''


def _run(tmp_path, ci):
    (tmp_path / "test_part.py").write_text(BODY)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rs", str(tmp_path / "test_part.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_missing_part_skips_outside_ci(tmp_path):
    r = _run(tmp_path, ci=False)
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout
    assert "frobnicator is not installed" in r.stdout


def test_missing_part_fails_under_ci(tmp_path):
    r = _run(tmp_path, ci=True)
    assert r.returncode == 1 and "1 failed" in r.stdout, r.stdout
    assert "frobnicator is not installed" in r.stdout and "CI installs this" in r.stdout
