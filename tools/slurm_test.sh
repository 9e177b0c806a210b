#!/usr/bin/env bash
# Evaluation on a Slurm cluster: one srun task per GPU, each running tools/test.py --launcher slurm.
#   bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]
# Environment:
#   GPUS           tasks in all (default 8)          GPUS_PER_NODE  tasks (GPUs) per node (default 8)
#   CPUS_PER_TASK  CPU cores per task (default 5)    SRUN_ARGS      more srun options, e.g. "--time=1:00:00"
#   PYTHON         interpreter of the environment that has the package installed (default: python)
#   MASTER_PORT    rendezvous port (default 29500); srun passes the environment on to the tasks
# Without CUDA the tasks use the gloo backend (CPU).
set -euo pipefail
if [[ $# -lt 4 ]]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
PYTHON=${PYTHON:-python}
read -r -a EXTRA_SRUN <<< "${SRUN_ARGS:-}"
TOOLS=$(cd "$(dirname "$0")" && pwd)

srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    "${EXTRA_SRUN[@]}" \
    "$PYTHON" -u "$TOOLS/test.py" "$CONFIG" "$CHECKPOINT" --launcher="slurm" "${@:5}"
