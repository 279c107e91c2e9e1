#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what the tests need when missing
# (PostgreSQL server binaries, ibverbs headers and clang for the rdma feature, Chromium and
# ChromeDriver for the auditor UI test, debootstrap for the compose test's base image, NVRTC
# for the CUDA compile test, Python's Prometheus text parser for the metrics scrape test,
# kubernetes-validate for the Kubernetes manifests' schema test), then checks
# formatting, lints every feature, builds every binary, fetches the models the tests run, and
# runs every test of the workspace. The compose test also
# needs Docker Engine with Compose, which it does not install.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# The repository is self-contained: nothing it builds or tests may read a directory beside it
# (a workspace may keep one, `../shared`). When one is there, the suite re-runs itself in a mount
# namespace where that directory is an empty, read-only tmpfs, so a stray read fails here too.
if [ -z "${PW_SELF_CONTAINED:-}" ] && [ -d "$root/../shared" ]; then
  if unshare --mount --propagation private true 2>/dev/null; then
    echo "== hiding $root/../shared for the whole run (self-containment)"
    exec unshare --mount --propagation private env PW_SELF_CONTAINED=1 bash -c \
      'mount -t tmpfs -o ro,size=1m none "$1/../shared" && exec "$1/scripts/test.sh"' _ "$root"
  fi
  echo "== warning: cannot make a mount namespace here; ../shared stays visible" >&2
fi

need_apt=()
for pkg in postgresql libibverbs-dev librdmacm-dev clang libclang-dev pkg-config chromium chromium-driver debootstrap; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# NVRTC (for compiling the CUDA kernels to PTX without a GPU) comes from PyPI.
if ! python3 -c 'import nvidia.cuda_nvrtc' >/dev/null 2>&1; then
  echo "== installing NVRTC (nvidia-cuda-nvrtc-cu12)"
  python3 -m pip install -q --no-deps 'nvidia-cuda-nvrtc-cu12==12.*'
fi
. scripts/nvrtc-env.sh

# The metrics scrape test parses every service's /metrics with Prometheus' Python parser.
if ! python3 -c 'import prometheus_client' >/dev/null 2>&1; then
  echo "== installing prometheus-client (Python), the metrics test's parser"
  python3 -m pip install -q --no-deps 'prometheus-client==0.26.0'
fi

# The API test drives the suite with the official OpenAI SDK and LangChain, as applications do
# (pinned; their own dependencies as pip resolves them).
if ! python3 -c 'import openai, langchain_openai; assert openai.__version__ == "3.60.0"' >/dev/null 2>&1; then
  echo "== installing openai and langchain-openai (Python), the SDK test's clients"
  python3 -m pip install -q 'openai==3.60.0' 'langchain-openai==1.8.1' 'langchain-core==1.8.3'
fi

# The API test also runs lm-evaluation-harness (its `local-completions` model, the `api` extra;
# no torch) on a small local task.
if ! python3 -c 'import lm_eval; assert lm_eval.__version__ == "0.4.13"' >/dev/null 2>&1; then
  echo "== installing lm-eval (Python), the scoring test's harness"
  python3 -m pip install -q 'lm-eval[api]==0.4.13'
fi

# The Kubernetes manifests' schema test runs kubernetes-validate, which carries the API's schemas
# and needs no network; each of its imports is installed (pinned) only when missing.
kv_need=()
python3 -c 'import kubernetes_validate.version as v; assert v.__version__ == "1.37.0"' \
  >/dev/null 2>&1 || kv_need+=('kubernetes-validate==1.37.0')
for dep in packaging:packaging==26.3 importlib_resources:importlib-resources==7.1.0 \
  yaml:PyYAML==6.0.3 jsonschema:jsonschema==4.26.0 referencing:referencing==0.37.0 \
  jsonschema_specifications:jsonschema-specifications==2025.9.1 rpds:rpds-py==0.30.0 \
  attrs:attrs==26.1.0 typing_extensions:typing-extensions==4.15.0; do
  python3 -c "import ${dep%%:*}" >/dev/null 2>&1 || kv_need+=("${dep#*:}")
done
if [ ${#kv_need[@]} -gt 0 ]; then
  echo "== installing ${kv_need[*]} (Python), the Kubernetes manifests' schema check"
  python3 -m pip install -q --no-deps "${kv_need[@]}"
fi

# A one-off build (CI's fresh clone) gains nothing from incremental caches, which double the
# size of target/; keep them for developers' repeated runs.
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL=0
fi

echo "== cargo fmt --check"
cargo fmt --all --check
# Every shipping feature (CUDA through NVRTC, RDMA through ibverbs) is built, linted and tested;
# the test-only defense switches are enabled by dev-dependencies and by the separate build of
# scripts/build-switched.sh alone, never here.
features=pagewarden-kernels/cuda,pagewarden-model/cuda,pagewarden-prefill/cuda,pagewarden-decode/cuda,pagewarden-transfer/rdma
echo "== cargo clippy (all targets, features $features)"
cargo clippy --workspace --all-targets --features "$features" -- -D warnings
# The incident replay (tests/tests/incident_real_services.rs) runs router, prefill and decode
# built with the test-only defense switches; they are built first, into
# target/debug/unsafe-test-switches/, so the normal build below links the normal binaries last.
scripts/build-switched.sh "$features"
echo "== cargo build (every binary: the system tests start them)"
cargo build --workspace --bins --features "$features"
# The models the tests run (fetched into models/ when missing, sha256-checked), by the
# launcher just built: the one fetch `pagewarden up` uses too.
PAGEWARDEN_MODEL=$(target/debug/pagewarden fetch smollm2)
PAGEWARDEN_GEMMA_MODEL=$(target/debug/pagewarden fetch gemma3-270m)
PAGEWARDEN_QWEN2_HEADER=$(target/debug/pagewarden fetch qwen2-7b-header)
export PAGEWARDEN_MODEL PAGEWARDEN_GEMMA_MODEL PAGEWARDEN_QWEN2_HEADER
echo "== cargo test"
cargo test --workspace --features "$features"
