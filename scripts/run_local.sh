#!/usr/bin/env bash
# gnnpar on one machine, the same knobs as the SLURM templates in scripts/slurm/.
#
#   scripts/run_local.sh                      # 2 local ranks, 1d-halo, 20 epochs
#   MODE=torchrun NPROCS=4 ALGO=2d GRID=2x2 scripts/run_local.sh
#   MODE=pipeline NPROCS=4 DATASET=rmat:scale=12,ef=8 scripts/run_local.sh
#   DRY_RUN=1 MODE=mpirun scripts/run_local.sh   # print, do not run
#
# MODE mirrors a template:
#   spawn     gnnpar-train --nprocs N: the trainer forks its own ranks (no launcher)
#   torchrun  torchrun --standalone --nproc-per-node N   (single_node_gpu.sbatch)
#   mpirun    mpirun -n N, one process per rank, ranks found by gnnpar.launcher.bootstrap
#             (cpu_cluster.sbatch's one-task-per-rank shape; pip install mpi4py mpich)
#   pipeline  gnnpar-partition once into PARTITION_DIR, then N ranks load their shards
#             (partition_then_train.sbatch)
#
# Knobs (environment variables):
#   MODE=spawn            spawn | torchrun | mpirun | pipeline
#   NPROCS=2              ranks
#   ALGO=1d-halo          SpMM algorithm: 1d | 1d-halo | 1.5d | 2d | 3d | 4d
#   GRID=                 process grid for 2d/3d/4d, e.g. 2x2
#   DATASET=              dataset spec (empty: gnnpar-train's default small graph;
#                         pipeline: rmat:scale=12,ef=8)
#   EPOCHS=20             training epochs
#   PARTITION_DIR=        shard folder (pipeline default: ./gnnpar-shards-local)
#   PARTITIONER=metis     block | random | metis | kaminpar (pipeline)
#   LOG_JSON=gnnpar-local.jsonl   per-epoch JSON log
#   BACKEND=gloo          gloo | nccl | auto
#   DEVICE=cpu            cpu | cuda | auto
#   TIMEOUT=300           seconds a collective may wait before every rank fails
#   THREADS=1             torch threads per rank
#   EXTRA_ARGS=           more gnnpar-train flags, appended as is
#   PYTHON=python3        interpreter with gnnpar installed (or run from the checkout)
#   DRY_RUN=0             1: print the commands instead of running them
set -euo pipefail

run() {
  if [ "${DRY_RUN:-0}" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi
}

MODE=${MODE:-spawn}
NPROCS=${NPROCS:-2}
PYTHON=${PYTHON:-python3}
ALGO=${ALGO:-1d-halo}
EPOCHS=${EPOCHS:-20}
LOG_JSON=${LOG_JSON:-gnnpar-local.jsonl}
BACKEND=${BACKEND:-gloo}
DEVICE=${DEVICE:-cpu}
TIMEOUT=${TIMEOUT:-300}
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS

args=(--algo "$ALGO" --epochs "$EPOCHS" --backend "$BACKEND" --device "$DEVICE"
      --timeout "$TIMEOUT" --threads "$THREADS" --log-json "$LOG_JSON" --quiet)
[ -n "${GRID:-}" ] && args+=(--grid "$GRID")
if [ "$MODE" = pipeline ]; then DATASET=${DATASET:-rmat:scale=12,ef=8}; fi
[ -n "${DATASET:-}" ] && args+=(--dataset "$DATASET")
[ -n "${EXTRA_ARGS:-}" ] && { read -r -a extra <<< "$EXTRA_ARGS"; args+=("${extra[@]}"); }

case "$MODE" in
  spawn)
    [ -n "${PARTITION_DIR:-}" ] && args+=(--partition-dir "$PARTITION_DIR")
    run "$PYTHON" -m gnnpar.train --nprocs "$NPROCS" "${args[@]}" ;;
  torchrun)
    [ -n "${PARTITION_DIR:-}" ] && args+=(--partition-dir "$PARTITION_DIR")
    run "$PYTHON" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node="$NPROCS" \
      -m gnnpar.train "${args[@]}" ;;
  mpirun)
    [ -n "${PARTITION_DIR:-}" ] && args+=(--partition-dir "$PARTITION_DIR")
    run mpirun -n "$NPROCS" "$PYTHON" -m gnnpar.train "${args[@]}" ;;
  pipeline)
    PARTITION_DIR=${PARTITION_DIR:-$PWD/gnnpar-shards-local}
    pargs=(--dataset "$DATASET" --parts "$NPROCS" --method "${PARTITIONER:-metis}"
           --out "$PARTITION_DIR" --quiet)
    [ -n "${GRID:-}" ] && pargs+=(--grid "$GRID")
    run "$PYTHON" -m gnnpar.cli.partition_cli "${pargs[@]}"
    run "$PYTHON" -m gnnpar.train --nprocs "$NPROCS" --partition-dir "$PARTITION_DIR" "${args[@]}" ;;
  *) echo "run_local.sh: unknown MODE=$MODE (spawn | torchrun | mpirun | pipeline)" >&2; exit 2 ;;
esac
