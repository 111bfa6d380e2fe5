#!/usr/bin/env bash
# GPU checks in one go (under 5 minutes on one H200): the CUDA tests (serial CUDA == CPU, every
# algorithm at world size 1 with NCCL and at 2/4 with gloo on CUDA tensors), then the
# single-process benchmark at scale 20 on the GPU. Output lands in ${OUT:-/tmp/gnnpar-gpu}.
#   bash scripts/gpu_check.sh            # from the repository root
set -uo pipefail
OUT=${OUT:-/tmp/gnnpar-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
python -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py 2>&1 | tee "$OUT/cuda_tests.log"
tests=${PIPESTATUS[0]}
python scripts/bench_single.py --dataset "${GPU_BENCH_DATASET:-rmat:scale=20,ef=16}" --device cuda \
    --warmup 3 --repeats 7 2>&1 | tee "$OUT/bench_single_cuda.log"
bench=${PIPESTATUS[0]}
echo "cuda tests rc=$tests bench rc=$bench"
exit $(( tests != 0 || bench != 0 ))
