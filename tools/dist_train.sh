#!/usr/bin/env bash
# Distributed training over torchrun, with restarts after a lost worker.
#   bash tools/dist_train.sh CONFIG GPUS [train.py args...]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT (the same MASTER_ADDR and PORT on every
# node). On a machine without CUDA the processes use the gloo backend (CPU), which is how
# the tests run it. PYTHON picks the interpreter of the environment that has the package
# installed (default: python).
#
# Restarts: if a worker dies (killed, out of memory, a lost node), torchrun stops the
# others and starts the whole group again, up to MAX_RESTARTS times (default 3). A job
# launched with restarts (MAX_RESTARTS > 0) resumes from the latest checkpoint of its work
# dir whenever there is one, on its first attempt too: rank 0 decides, every rank follows
# and checks that it loaded the same file (the project's runner, runner_type='PolaRunner'
# in the shipped configs). So a restarted group, or a node that replaces a lost one, joins
# the resumed run; start a fresh run in a new work dir (or with MAX_RESTARTS=0). With
# several nodes the work dir (--work-dir) must be on a file system every node mounts at the
# same path. A job that fails for good (a bad config, say) fails MAX_RESTARTS + 1 times
# before torchrun gives up.
#   MAX_RESTARTS > 0: torchrun's c10d rendezvous, hosted at MASTER_ADDR:PORT by the node
#     whose address that is; node ranks are given in the order the nodes join (NODE_RANK is
#     not used) and every attempt gets a fresh store for the process group
#     (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), so a restarted group never reads the addresses
#     of the dead one. RDZV_ID names the job (default polaformerpp); two jobs that share
#     MASTER_ADDR:PORT need different ones (or different ports).
#   MAX_RESTARTS=0: no restarts; the static rendezvous with NODE_RANK, as plain torchrun.
#
# Stalls: a collective that cannot complete (a peer frozen or gone, ranks out of step)
# fails after POLAPP_DIST_TIMEOUT seconds (default 600; env_cfg.dist_cfg.timeout in the
# config or --cfg-options env_cfg.dist_cfg.timeout=N comes first), instead of gloo's and
# NCCL's 30 minutes. The failing rank then says which rank stopped answering
# ("train.py: error: lost peer: rank 1 (host ..., pid ...) stopped answering ..."), also in
# torchrun's failure summary, and with MAX_RESTARTS the group restarts and resumes.
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
MAX_RESTARTS=${MAX_RESTARTS:-3}
RDZV_ID=${RDZV_ID:-polaformerpp}
PYTHON=${PYTHON:-python}
TOOLS=$(cd "$(dirname "$0")" && pwd)

if ! [[ $MAX_RESTARTS =~ ^[0-9]+$ ]]; then
    echo "$0: MAX_RESTARTS must be a whole number (restarts after a lost worker), got '$MAX_RESTARTS'" >&2
    exit 2
fi

if [[ $MAX_RESTARTS -gt 0 ]]; then
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    RENDEZVOUS=(--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$PORT" --rdzv-id="$RDZV_ID")
else
    RENDEZVOUS=(--node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" --master_port="$PORT")
fi

"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --nproc_per_node="$GPUS" \
    --max-restarts="$MAX_RESTARTS" \
    "${RENDEZVOUS[@]}" \
    "$TOOLS/train.py" "$CONFIG" --launcher pytorch "${@:3}"
