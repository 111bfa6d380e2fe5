#!/usr/bin/env bash
# gnnpar vs DGL 2.1.0 on CPU (issue 14). DGL lives only in a side venv, never in gnnpar's.
#
#   bash scripts/bench_dgl.sh --setup [--venv PATH]   # build the side venv (torch 2.2.1 + dgl 2.1.0)
#   bash scripts/bench_dgl.sh [bench_dgl.py flags]    # run the benchmark in the current python
#   bash scripts/bench_dgl.sh --measures train         # mini-batch GraphSAGE epochs, end to end
#
# The side venv defaults to /tmp/gnnpar-dgl-venv (or $GNNPAR_DGL_VENV). It needs a CPython 3.11
# ($PYTHON, default python3.11): dgl 2.1.0's wheels are per-version and it supports torch <= 2.2.1.
# torch 2.2.1 from PyPI is the CUDA build; its nvidia-* libraries come as pip dependencies and
# are installed too (import torch needs them), so the venv is a few GB. DGL runs on the CPU.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ "${1:-}" != "--setup" ]]; then
    exec "${PY:-python}" "$here/bench_dgl.py" "$@"
fi
shift
venv="${GNNPAR_DGL_VENV:-/tmp/gnnpar-dgl-venv}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --venv) venv="$2"; shift 2 ;;
        --venv=*) venv="${1#--venv=}"; shift ;;
        *) echo "bench_dgl.sh --setup: unknown flag $1 (only --venv PATH)" >&2; exit 2 ;;
    esac
done
base="${PYTHON:-python3.11}"
if ! "$base" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
    echo "bench_dgl.sh: need CPython 3.11 for dgl 2.1.0's wheel; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
[[ -x "$venv/bin/python" ]] || "$base" -m venv "$venv"
# torchdata 0.7.1 is the release paired with torch 2.2.1 (an unpinned one would pull a newer torch);
# import dgl also needs pandas, pydantic and pyyaml (graphbolt), which its wheel does not declare.
"$venv/bin/python" -m pip install --upgrade-strategy only-if-needed \
    "torch==2.2.1" "dgl==2.1.0" "torchdata==0.7.1" "numpy<2" scipy "pandas<2.3" pydantic pyyaml
# Use the CPU only (the CUDA libraries merely have to load).
DGLBACKEND=pytorch CUDA_VISIBLE_DEVICES= "$venv/bin/python" -c '
import torch, dgl
g = dgl.graph(([0, 1], [1, 2]))
assert dgl.__version__.startswith("2.1.0"), dgl.__version__
print(f"side venv OK: torch {torch.__version__}, dgl {dgl.__version__}, {g}".replace("\n", " "))'
echo "run: python scripts/bench_dgl.py --venv $venv   (or bash scripts/bench_dgl.sh --venv $venv)"
