#!/usr/bin/env bash
# The one script a lent GPU host runs: every GPU check in one go, each step bounded in time and
# run whether or not the one before it passed, with a summary line per step at the end.
#
#   scripts/gpu/run.sh bundle MODEL.gguf   # build machine (no GPU; NVRTC from pip for the PTX):
#       # one release build of every GPU binary, the PTX, and into target-gpu/: bundle.tar.xz
#       # (binaries + PTX), real-5l.gguf (MODEL's first 5 blocks, real weights: the whole
#       # SmolLM2 file does not fit a 64 MiB transfer) and (in the tarball) like.gguf (MODEL's header, from which
#       # the host writes a full-size random-weight model of MODEL's shapes).
#   scripts/gpu/run.sh [LOG_DIR]           # GPU host, repository root, target-gpu/ carried;
#       # every step's output and the workers' logs land in LOG_DIR (default $OUT or a temp dir)
#
# Steps on the GPU host:
#   1. kernels  every CUDA kernel against the CPU reference, the attention kernel's generation
#               check, decode-shaped matvec speed (gpu_check); then the model's device tests
#               (the forward pass's `device_test!` bodies on cuda:0)
#   2. engine   the GPU forward pass against the CPU engine on the real-weight model (logits,
#               greedy tokens), a revoked page failing one sequence of a batch, prefill and
#               decode tok/s at batch 1, 8, 32 on the full-size random-weight model
#   3. services the suite (router, prefill, decode) on the CPU then on the GPU: the GPU's greedy
#               texts against the CPU run's, an over-length prompt (400), tok/s at 1, 8, 32
#               streams on both devices
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/target-gpu"
keep_blocks=5

if [ "${1:-}" = "bundle" ]; then
  set -e
  model=${2:?usage: $0 bundle MODEL.gguf}
  . "$root/scripts/nvrtc-env.sh"
  cd "$root"
  cargo build --release \
    -p pagewarden-router -p pagewarden-prefill -p pagewarden-decode -p pagewarden-kernels -p pagewarden-model \
    --features pagewarden-prefill/cuda,pagewarden-decode/cuda,pagewarden-kernels/cuda,pagewarden-model/cuda \
    --bin pagewarden-router --bin pagewarden-prefill --bin pagewarden-decode \
    --example gpu_check --example gpu_engine --example random_like --example truncate_layers
  target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  rm -rf "$out" && mkdir -p "$out/bin"
  for b in pagewarden-router pagewarden-prefill pagewarden-decode; do cp "$target/release/$b" "$out/bin/"; done
  for b in gpu_check gpu_engine random_like; do cp "$target/release/examples/$b" "$out/bin/"; done
  # The model's device tests (`device_test!`): the same bodies the CPU runs, on cuda:0.
  cargo test --release --no-run -p pagewarden-model --features cuda --test forward --test arch_device \
    --message-format=json | python3 -c 'import json, shutil, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        shutil.copy(m["executable"], sys.argv[1] + "/device_" + m["target"]["name"])' "$out/bin"
  strip "$out"/bin/*
  PAGEWARDEN_PTX_DIR="$out/ptx" cargo test --release -p pagewarden-kernels --features cuda --test cuda_ptx
  "$out/bin/gpu_engine" --write-ptx "$out/ptx-model" --arch compute_90
  "$target/release/examples/truncate_layers" "$model" "$out/real-5l.gguf" "$keep_blocks"
  # The header and tensor entries end well inside the first 4 MiB of a model this size; a
  # header read stops at the entries and ignores what follows.
  head -c $((4 << 20)) "$model" >"$out/like.gguf"
  cp tests/data/reference/smollm2-135m-instruct-q4_1.json "$out/prompts.json"
  (cd "$out" && tar -cJf bundle.tar.xz bin ptx ptx-model like.gguf && rm -rf bin ptx ptx-model like.gguf)
  du -sh "$out"/*
  echo "carry target-gpu (the working tree travels beside it; 64 MiB in all)"
  exit 0
fi

logs=${1:-${OUT:-$(mktemp -d)}}
mkdir -p "$logs"
cd "$root"
[ -f "$out/bundle.tar.xz" ] && (cd "$out" && tar -xJf bundle.tar.xz)
export PAGEWARDEN_PTX_DIR="$out/ptx" PAGEWARDEN_MODEL_PTX_DIR="$out/ptx-model"
declare -A verdict
step() { # NAME SECONDS COMMAND...: runs it under a time limit, output to the log and LOG_DIR/NAME.log
  local name=$1 secs=$2; shift 2
  echo "==== $name (limit ${secs}s) $(date +%T)"
  local t0=$SECONDS
  timeout --kill-after=10 "$secs" "$@" 2>&1 | tee "$logs/$name.log"
  local rc=${PIPESTATUS[0]}
  verdict[$name]="rc=$rc in $((SECONDS - t0)) s"
  echo "==== $name: ${verdict[$name]}"
}

echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
step kernels 90 "$out/bin/gpu_check" cuda:0
step device-forward 60 "$out/bin/device_forward" --ignored --test-threads 1
step device-arch 60 "$out/bin/device_arch_device" --ignored --test-threads 1
step random-model 30 "$out/bin/random_like" "$out/like.gguf" "$out/random-full.gguf" 7
step engine-real 90 "$out/bin/gpu_engine" --model "$out/real-5l.gguf" --prompts "$out/prompts.json"
step engine-full 75 "$out/bin/gpu_engine" --model "$out/random-full.gguf" --prompts "$out/prompts.json"
export BIN_DIR="$out/bin"
step services-cpu 60 env DEVICE=cpu LOG_DIR="$logs/services-cpu" WRITE_REFERENCE="$logs/cpu-reference.json" \
  scripts/gpu/services.sh "$out/real-5l.gguf" "$out/prompts.json"
if [ -f "$logs/cpu-reference.json" ]; then
  step services-gpu 75 env DEVICE=cuda:0 LOG_DIR="$logs/services-gpu" scripts/gpu/services.sh "$out/real-5l.gguf" "$logs/cpu-reference.json"
fi
step services-gpu-full 60 env DEVICE=cuda:0 LOG_DIR="$logs/services-gpu-full" PARITY=0 scripts/gpu/services.sh "$out/random-full.gguf" "$out/prompts.json"
step services-cpu-full 60 env DEVICE=cpu LOG_DIR="$logs/services-cpu-full" PARITY=0 scripts/gpu/services.sh "$out/random-full.gguf" "$out/prompts.json"
echo "==== summary"
for k in kernels device-forward device-arch random-model engine-real engine-full services-cpu services-gpu services-gpu-full services-cpu-full; do
  echo "$k: ${verdict[$k]:-not run}"
done
