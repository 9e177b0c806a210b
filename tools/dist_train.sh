#!/usr/bin/env bash
# Distributed training over torchrun.
#   bash tools/dist_train.sh CONFIG GPUS [train.py args...]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT. On a machine without CUDA the
# processes use the gloo backend (CPU), which is how the tests run it. PYTHON picks the
# interpreter of the environment that has the package installed (default: python).
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 CONFIG GPUS [train.py args...]" >&2
    exit 2
fi
CONFIG=$1
GPUS=$2
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
    "$TOOLS/train.py" "$CONFIG" --launcher pytorch "${@:3}"
