#!/usr/bin/env bash
# GPU checks in one go (at most 8 minutes on a one-GPU H200, 16 cores; no pymetis needed:
# every multi-rank row uses --partitioner random). One table row per check:
#   1. the CUDA tests (tests/test_cuda.py, -m cuda);
#   2. full batch on cuda: serial, then 1d, 1d-halo, 1.5d (c=1), 2d 1x1, 3d 1x1x1, 4d 1x1x1x1 at
#      world size 1 with --backend nccl --checkpoint-dir, each followed by a --resume row with
#      more epochs (it must continue at the checkpoint's epoch + 1 in the appended JSON log);
#   3. every full-batch algorithm at 2 and 4 ranks with --backend gloo on CUDA tensors
#      (1.5d c=1/c=2, 2d 2x1/2x2, 3d 1x2x1/1x2x2, 4d 1x1x2x1/1x1x2x2);
#   4. mini batch on cuda: serial, data parallel on 2 ranks (both sample on the GPU, features
#      there: --sample-on/--features-on auto), 1d-halo groups of 2 on 4 ranks, 4d --grid
#      2x1x2x1 on 4 ranks (grouped: sampled on the host);
#   4b. GAT (--heads 4): full batch serial and 2d 2x1 on 2 ranks, data-parallel mini batch;
#   5. scripts/bench_single.py at scale 20 (GCN, then --model gat: GAT vs PyG GATConv),
#      scripts/bench_minibatch.py (rmat scale 20,
#      3-layer SAGE 15,10,5, batch 1024: end to end vs compute only) and scripts/bench_spmm.py
#      (Triton vs cuSPARSE, fp32 and bf16, every Triton tile: --sweep), each run alone after the
#      rest.
# NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so world >= 2 runs use gloo on
# CUDA tensors and NCCL runs at world size 1 only; the multi-rank NCCL legality is covered on CPU
# by tests/test_comm_rule.py (process groups with a backend per device type: cpu:gloo,cuda:nccl).
#
# Rows run GPU_CHECK_JOBS (4) at a time, so their epoch times (median epoch_s of --log-json
# without the first epoch) are indicative; the benchmark runs alone. Each row has a timeout
# (120 s, tests and bench 240 s) within an overall budget (GPU_CHECK_BUDGET, 450 s); a row the
# budget leaves no time for fails. Exit status 1 when any row fails.
# Output in ${OUT:-/tmp/gnnpar-gpu}: table.txt, gpu_check.log (every row's output, then the
# table), gpu.txt; rows/<row>.log and rows/<row>.jsonl per row.
#   bash scripts/gpu_check.sh             # from anywhere; runs in the repository root
#   bash scripts/gpu_check.sh --dry-run   # (or GPU_CHECK_DRY_RUN=1) print every row's command
#   bash scripts/gpu_check.sh --cpu       # (or GPU_CHECK_DEVICE=cpu) the same rows on CPU with
#                                         # gloo, tests and bench skipped: exercises the machinery
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/gnnpar-gpu} PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" scripts/gpu_check.py "$@"
