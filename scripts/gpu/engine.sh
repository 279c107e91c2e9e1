#!/usr/bin/env bash
# GPU engine check: the Llama forward pass on the GPU (crates/model/src/cuda) against llama.cpp's
# reference and the CPU engine, a generation-mismatch step that must fail one sequence of a
# batch, and prefill / decode tok/s at batch 1 and 32 (well under two minutes on an H200).
#
#   scripts/gpu/engine.sh build                          # build machine (NVRTC, no GPU):
#       # release binary -> target-gpu/gpu_engine, model kernel PTX -> target-gpu/ptx-model/
#   scripts/gpu/engine.sh MODEL.gguf REFERENCE.json [cuda:N]   # GPU machine, repo root
#
# The GPU machine needs only the NVIDIA driver: kernels come from target-gpu/ptx (written by
# `scripts/gpu/kernels.sh build`) and target-gpu/ptx-model. REFERENCE.json may also be given
# relative to target-gpu/. Override with GPU_ENGINE_BIN / PAGEWARDEN_PTX_DIR /
# PAGEWARDEN_MODEL_PTX_DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/target-gpu"

if [ "${1:-}" = "build" ]; then
  . "$root/scripts/nvrtc-env.sh"
  cd "$root"
  cargo build --release -p pagewarden-model --features cuda --example gpu_engine
  target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  mkdir -p "$out"
  cp "$target/release/examples/gpu_engine" "$out/gpu_engine"
  rm -rf "$out/ptx-model"
  "$out/gpu_engine" --write-ptx "$out/ptx-model" --arch compute_90
  [ -d "$out/ptx" ] || echo "note: $out/ptx is missing; run 'scripts/gpu/kernels.sh build' too" >&2
  echo "built $out/gpu_engine and $out/ptx-model"
  exit 0
fi

[ $# -ge 2 ] || { echo "usage: $0 build | $0 MODEL.gguf REFERENCE.json [cuda:N]" >&2; exit 2; }
model=$1
reference=$2
[ -f "$reference" ] || [ ! -f "$out/$reference" ] || reference="$out/$reference"
bin="${GPU_ENGINE_BIN:-$out/gpu_engine}"
[ -x "$bin" ] || { echo "no binary at $bin: run '$0 build' first (or set GPU_ENGINE_BIN)" >&2; exit 1; }
if [ -z "${PAGEWARDEN_PTX_DIR:-}" ] && [ -d "$out/ptx" ]; then
  export PAGEWARDEN_PTX_DIR="$out/ptx"
fi
if [ -z "${PAGEWARDEN_MODEL_PTX_DIR:-}" ] && [ -d "$out/ptx-model" ]; then
  export PAGEWARDEN_MODEL_PTX_DIR="$out/ptx-model"
fi
exec timeout 150 "$bin" --model "$model" --reference "$reference" --device "${3:-cuda:0}"
