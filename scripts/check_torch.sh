#!/usr/bin/env bash
# Run a core part of the test suite under another torch release, in a venv of its own.
#
#   bash scripts/check_torch.sh                 # the oldest torch setup.cfg accepts
#   bash scripts/check_torch.sh 2.4.1           # any release pip can install
#   bash scripts/check_torch.sh 2.4.1 tests/test_models.py -k gcn   # pytest arguments (they
#                                                                  # replace the default subset)
#
# CI tests one torch (the version .ci/run pins). setup.cfg accepts a range; this script is how a
# release checks the range's floor before it is claimed: README says which versions it has passed
# with. The venv is $GNNPAR_TORCH_VENV, default /tmp/gnnpar-torch-VERSION, kept between runs.
# Releases before 2.3 were built against numpy 1, so numpy<2 is installed with them; on Linux
# PyPI's torch wheels before the CPU-only builds carry the CUDA libraries (a few GB), which
# only have to load: the tests run on the CPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
floor=$(sed -n 's/^ *torch>=\([0-9.]*\).*/\1/p' "$root/setup.cfg" | head -1)
version="${1:-$floor}"
[[ $# -gt 0 ]] && shift
[[ "$version" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] || {
    echo "check_torch.sh: the first argument is a torch version such as 2.4.1, not '$version'" >&2
    exit 2
}
if [[ $# -eq 0 ]]; then
    # What every promise rests on: the serial model, each distributed algorithm against it,
    # mini batch, checkpoints and the command line.
    set -- tests/test_models.py tests/test_fullbatch_dist.py tests/test_minibatch.py \
           tests/test_checkpoint.py tests/test_cli.py tests/test_custom_model.py
fi
venv="${GNNPAR_TORCH_VENV:-/tmp/gnnpar-torch-$version}"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
numpy_pin=()
minor=$(echo "$version" | cut -d. -f2)
major=$(echo "$version" | cut -d. -f1)
if (( major < 2 || (major == 2 && minor < 3) )); then numpy_pin=("numpy<2"); fi
"$venv/bin/python" -m pip install -q "torch==$version" "${numpy_pin[@]}"
# The project's own requirements, without letting pip move torch or numpy off what was chosen.
"$venv/bin/python" -m pip install -q -e "$root[test]" "torch==$version" "${numpy_pin[@]}"
"$venv/bin/python" -c 'import torch, numpy; print(f"torch {torch.__version__}, numpy {numpy.__version__}")'
cd "$root"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
