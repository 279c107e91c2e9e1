#!/usr/bin/env bash
# GPU check of the CUDA kernels: every kernel against the CPU reference on random inputs, the
# attention generation-mismatch check, and decode-shaped matvec benchmarks (about a minute).
#
#   scripts/gpu/kernels.sh build        # on a build machine (no GPU needed): builds the release
#                                     # binary and the PTX files into target-gpu/
#   scripts/gpu/kernels.sh [cuda:N]     # on the GPU machine, from the repository root
#
# The GPU machine needs only the NVIDIA driver: the binary loads libcuda at run time and, when
# target-gpu/ptx exists, takes the kernels from those PTX files (the driver JIT-compiles them)
# instead of compiling them with NVRTC. Override with GPU_CHECK_BIN / PAGEWARDEN_PTX_DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/target-gpu"

if [ "${1:-}" = "build" ]; then
  . "$root/scripts/nvrtc-env.sh"
  cd "$root"
  rm -rf "$out/ptx"
  PAGEWARDEN_PTX_DIR="$out/ptx" cargo test -p pagewarden-kernels --features cuda --test cuda_ptx
  cargo build --release -p pagewarden-kernels --features cuda --example gpu_check
  target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  mkdir -p "$out"
  cp "$target/release/examples/gpu_check" "$out/gpu_check"
  echo "built $out/gpu_check and $(ls "$out/ptx" | wc -l) PTX files in $out/ptx"
  exit 0
fi

bin="${GPU_CHECK_BIN:-$out/gpu_check}"
[ -x "$bin" ] || { echo "no binary at $bin: run '$0 build' first (or set GPU_CHECK_BIN)" >&2; exit 1; }
if [ -z "${PAGEWARDEN_PTX_DIR:-}" ] && [ -d "$out/ptx" ]; then
  export PAGEWARDEN_PTX_DIR="$out/ptx"
fi
exec timeout 300 "$bin" "${1:-cuda:0}"
