#!/usr/bin/env bash
# Training on a Slurm cluster: one srun task per GPU, each running tools/train.py --launcher slurm.
#   bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]
# Environment:
#   GPUS           tasks in all (default 8)          GPUS_PER_NODE  tasks (GPUs) per node (default 8)
#   CPUS_PER_TASK  CPU cores per task (default 5)    SRUN_ARGS      more srun options, e.g. "--time=2-00:00:00"
#   PYTHON         interpreter of the environment that has the package installed (default: python)
#   MASTER_PORT    rendezvous port (default 29500); srun passes the environment on to the tasks
# Without CUDA the tasks use the gloo backend (CPU).
set -euo pipefail
if [[ $# -lt 4 ]]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
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
    "$PYTHON" -u "$TOOLS/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher="slurm" "${@:5}"
