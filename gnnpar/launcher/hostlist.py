"""SLURM host lists, read without ``scontrol``: the master of an ``srun`` step is the first
host of its node list (:mod:`gnnpar.launcher.bootstrap`)."""
from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from typing import List

from gnnpar.datasets import InputError


def expand_hostlist(text: str) -> List[str]:
    """Expand a SLURM host list: ``"node[01-03,7],login"`` → node01 node02 node03 node7 login.

    Several bracket groups in one name expand as a product (``r[1-2]n[1-2]`` → r1n1 r1n2
    r2n1 r2n2); a range keeps the zero padding of its lower bound. Raises ValueError on
    malformed text.
    """
    out: List[str] = []
    for item in _split_top(text.strip()):
        if item:
            out.extend(_expand_item(item))
    if not out:
        raise ValueError(f"empty host list {text!r}")
    return out


def _split_top(text: str) -> List[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in host list {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return parts


def _expand_item(item: str) -> List[str]:
    pieces: List[List[str]] = []
    for literal, body in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
        if literal:
            pieces.append([literal])
        if body:
            pieces.append(_expand_ranges(body, item))
    return ["".join(p) for p in itertools.product(*pieces)]


def _expand_ranges(body: str, item: str) -> List[str]:
    out = []
    for r in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", r.strip())
        if not m:
            raise ValueError(f"bad range {r!r} in host list item {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {r!r} in host list item {item!r}")
        out.extend(str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1))
    return out


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list; ``scontrol show hostnames`` only if the text is
    beyond this parser."""
    try:
        return expand_hostlist(nodelist)[0]
    except ValueError:
        if shutil.which("scontrol"):
            res = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                                 capture_output=True, text=True, timeout=30)
            names = res.stdout.split()
            if res.returncode == 0 and names:
                return names[0]
        raise InputError(f"cannot read the SLURM node list {nodelist!r}; set MASTER_ADDR")
