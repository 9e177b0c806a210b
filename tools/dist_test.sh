#!/usr/bin/env bash
# Distributed evaluation over torchrun.
#   bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py args...]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT; gloo on a machine without CUDA.
# PYTHON picks the interpreter of the environment that has the package installed.
# The ranks gather their results through files under the work dir (--work-dir; on several
# nodes, a folder every node mounts); POLAPP_DIST_TIMEOUT bounds a collective that cannot
# complete (seconds, default 600), as in dist_train.sh.
set -euo pipefail
if [[ $# -lt 3 ]]; then
    echo "usage: $0 CONFIG CHECKPOINT GPUS [test.py args...]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
PYTHON=${PYTHON:-python}
TOOLS=$(cd "$(dirname "$0")" && pwd)

"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$TOOLS/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
