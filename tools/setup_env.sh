#!/usr/bin/env bash
# Create the project's virtual environment with the full OpenMMLab stack.
#
#   bash tools/setup_env.sh            # idempotent; a no-op when nothing changed
#
# mmcv 2.1.0 ships only as a source release and mmdet/mmseg need its compiled
# ops, so it is built once (CPU ops; about 40 min on 2 cores) and the wheel is
# kept in a cache outside the repository; later installs reuse it. The
# package's own compiled kernels (one extension, polaformerpp/ops/csrc/<op>/) are compiled
# in place at the end (about a minute).
#
# Environment variables:
#   POLAPP_VENV         where the environment lives      (default: <repo>/.venv)
#   POLAPP_WHEEL_CACHE  where the built mmcv wheel lives (default: ~/.cache/polaformerpp/wheels)
#   POLAPP_BASE_PYTHON  interpreter used to create the venv (default: python3)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${POLAPP_VENV:-$ROOT/.venv}
CACHE=${POLAPP_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/polaformerpp/wheels}
BASE_PYTHON=${POLAPP_BASE_PYTHON:-python3}
MMCV_VERSION=2.1.0

stamp_of() {
    cat "$ROOT"/requirements/*.txt "$ROOT/setup.py" "$ROOT/tools/setup_env.sh" \
        "$ROOT"/polaformerpp/ops/csrc/*.cpp "$ROOT"/polaformerpp/ops/csrc/*/* | sha256sum | cut -d' ' -f1
}
STAMP_FILE=$VENV/.polaformerpp-stamp
if [[ -f $STAMP_FILE && "$(cat "$STAMP_FILE")" == "$(stamp_of)" ]]; then
    exit 0
fi

log() { echo "[setup_env] $*" >&2; }

if [[ ! -x $VENV/bin/python ]]; then
    log "creating virtual environment in $VENV"
    "$BASE_PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# torch first: the local torch 2.14.1/torchvision 0.29.1 pair (see requirements/runtime.txt).
"${PIP[@]}" install -q wheel "torch>=2.1,<=2.14.1" "torchvision>=0.16,<=0.29.1"

mkdir -p "$CACHE"
if ! ls "$CACHE"/mmcv-$MMCV_VERSION-*.whl >/dev/null 2>&1; then
    log "building mmcv $MMCV_VERSION with its ops (one time; wheel cached in $CACHE)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # mmcv's setup.py needs pkg_resources and the pre-70 setuptools build
    # machinery (torch asks for a newer one: pip's conflict notice is expected
    # here); the run-time requirements below restore setuptools < 82.
    "${PIP[@]}" install -q "setuptools>=64,<70" 2>&1 | grep -v "dependency conflicts\|requires setuptools" || true
    "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation \
        -d "$work" "mmcv==$MMCV_VERSION"
    tar -xzf "$work"/mmcv-$MMCV_VERSION.tar.gz -C "$work"
    src=$work/mmcv-$MMCV_VERSION
    # torch >= 2.14 headers require C++20; mmcv's setup.py hard-codes C++17.
    if "$VENV/bin/python" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(0 if v >= (2, 14) else 1)'; then
        sed -i 's/-std=c++17/-std=c++20/g' "$src/setup.py"
    fi
    MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} \
        "${PIP[@]}" wheel -q --no-build-isolation --no-deps -w "$work/dist" "$src"
    mv "$work"/dist/mmcv-$MMCV_VERSION-*.whl "$CACHE/"
fi

log "installing runtime and test requirements"
"${PIP[@]}" install -q --find-links "$CACHE" \
    -r "$ROOT/requirements/runtime.txt" -r "$ROOT/requirements/tests.txt" -r "$ROOT/requirements/optional.txt"
"${PIP[@]}" install -q --no-build-isolation --no-deps -e "$ROOT"
# The fused CPU attention kernels, compiled next to their sources (about a
# minute); the editable install above does not build them with setuptools >= 80.
log "building the fused CPU kernels"
(cd "$ROOT" && "$VENV/bin/python" setup.py -q build_ext --inplace 2>&1 | grep -v "CUDA_HOME\|Deprecat\|^\s*\*\*\*\|^\s*$" >&2 || true)

"$VENV/bin/python" -c 'import mmcv.ops, mmdet.models, mmseg.models, mmpretrain.models, polaformerpp' \
    || { log "the environment does not import"; exit 1; }
"$VENV/bin/python" -c 'import sys; from polaformerpp.ops import available_backends; sys.exit("cpu" not in available_backends())' \
    || { log "the fused CPU kernels did not build (see the compiler output above)"; exit 1; }
stamp_of > "$STAMP_FILE"
log "environment ready: $VENV"
