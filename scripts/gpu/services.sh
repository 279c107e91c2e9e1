#!/usr/bin/env bash
# The suite on a GPU: pagewarden-prefill and pagewarden-decode with `--device $DEVICE` behind the
# router on 127.0.0.1 (ports picked by the OS), the 10 reference prompts at temperature 0 through
# the router's HTTP API (first 8 greedy tokens against llama.cpp's reference, and the whole
# 24-token text), one over-length prompt (must be 400), a short throughput run at 1, 8 and 32
# streams, then PASS/FAIL and every process killed. Seconds on an H200.
#
# The binaries and PTX come from `scripts/gpu/run.sh bundle` (on the build machine; no GPU
# needed), which also runs this script on the GPU host.
#
# Run (repository root; the GPU machine needs only the NVIDIA driver):
#   DEVICE=cuda:0 scripts/gpu/services.sh MODEL.gguf REFERENCE.json
#   DEVICE=cpu    scripts/gpu/services.sh MODEL.gguf REFERENCE.json   # the same check on CPU
# Env: DEVICE (cuda:0), BIN_DIR (target-gpu/bin), PAGEWARDEN_PTX_DIR (target-gpu/ptx),
# PAGEWARDEN_MODEL_PTX_DIR (target-gpu/ptx-model), LOG_DIR (a temp dir; worker logs),
# STREAMS ("8 32": the throughput runs after one stream), GEN_TOKENS (64), MIN_FIRST8 (9: cases
# whose first 8 tokens must match to PASS; one may leave on a near-tie, as gpu_engine allows),
# PARITY (1; 0 skips the parity and over-length checks),
# WRITE_REFERENCE (a path: this run's greedy texts are written there as the reference of a later
# run, e.g. DEVICE=cpu for a model llama.cpp's reference is not for).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/target-gpu"

[ $# -ge 2 ] || { echo "usage: [DEVICE=cuda:N] $0 MODEL.gguf REFERENCE.json" >&2; exit 2; }
model=$1
reference=$2
device=${DEVICE:-cuda:0}
bin=${BIN_DIR:-$out/bin}
for b in pagewarden-router pagewarden-prefill pagewarden-decode; do
  [ -x "$bin/$b" ] || { echo "no $bin/$b: run 'scripts/gpu/run.sh bundle MODEL' first (or set BIN_DIR)" >&2; exit 1; }
done
[ -f "$model" ] || { echo "no model at $model" >&2; exit 1; }
[ -f "$reference" ] || { echo "no reference at $reference" >&2; exit 1; }
if [ -z "${PAGEWARDEN_PTX_DIR:-}" ] && [ -d "$out/ptx" ]; then export PAGEWARDEN_PTX_DIR="$out/ptx"; fi
if [ -z "${PAGEWARDEN_MODEL_PTX_DIR:-}" ] && [ -d "$out/ptx-model" ]; then export PAGEWARDEN_MODEL_PTX_DIR="$out/ptx-model"; fi
logs=${LOG_DIR:-$(mktemp -d)}
mkdir -p "$logs"
export RUST_LOG=${RUST_LOG:-info} RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0
if [ "$device" != cpu ] && { [ -z "${PAGEWARDEN_PTX_DIR:-}" ] || [ -z "${PAGEWARDEN_MODEL_PTX_DIR:-}" ]; }; then
  echo "warning: no precompiled PTX (target-gpu/ptx, target-gpu/ptx-model): the workers need NVRTC" >&2
fi
echo "== device $device, binaries $bin, logs $logs, PTX ${PAGEWARDEN_PTX_DIR:-nvrtc} / ${PAGEWARDEN_MODEL_PTX_DIR:-nvrtc}"

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Starts $1 with the remaining args; waits for its "listening" line (prints it) or its death.
start() {
  local name=$1; shift
  "$bin/$name" "$@" >"$logs/$name.out" 2>"$logs/$name.err" &
  pids+=($!)
  local pid=$! t=0
  until grep -q "listening" "$logs/$name.out" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name exited during start-up:" >&2; tail -20 "$logs/$name.err" >&2; exit 1
    fi
    t=$((t + 1)); [ $t -lt 600 ] || { echo "$name: no listening line in 60 s" >&2; exit 1; }
    sleep 0.1
  done
  grep "listening" "$logs/$name.out"
}
field() { grep -o "$2=[^ ]*" "$logs/$1.out" | head -1 | cut -d= -f2; }

common=(--model "$model" --device "$device" --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0
        --transfer-addr 127.0.0.1:0 --pool-tokens 65536 --max-concurrency 64)
t0=$(date +%s.%N)
start pagewarden-decode "${common[@]}" --node-id decode-0
start pagewarden-prefill "${common[@]}" --node-id prefill-0
printf '[[tenants]]\nname = "check"\nkey_sha256 = ["%s"]\n' \
  "$(printf %s check-key | sha256sum | cut -d' ' -f1)" >"$logs/tenants.toml"
start pagewarden-router --model "$model" --http-addr 127.0.0.1:0 --tenants "$logs/tenants.toml" \
  --served-model-name m --info-interval 200ms \
  --decode "http://$(field pagewarden-decode grpc)" --prefill "http://$(field pagewarden-prefill grpc)"
url="http://$(field pagewarden-router http)"
echo "started in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
# The workers' own words about where they run (ANSI colours stripped).
grep -h "model on the GPU\|pool sized" "$logs"/pagewarden-{decode,prefill}.err | sed 's/\x1b\[[0-9;]*m//g' || true

set +e
URL=$url REFERENCE=$reference DEVICE=$device STREAMS=${STREAMS:-8 32} GEN_TOKENS=${GEN_TOKENS:-64} \
  MIN_FIRST8=${MIN_FIRST8:-9} PARITY=${PARITY:-1} WRITE_REFERENCE=${WRITE_REFERENCE:-} \
  timeout 240 python3 - <<'EOF'
import json, os, sys, threading, time, urllib.error, urllib.request

url, device = os.environ["URL"], os.environ["DEVICE"]
streams, gen = [int(n) for n in os.environ["STREAMS"].split()], int(os.environ["GEN_TOKENS"])
min8, parity, write_ref = int(os.environ["MIN_FIRST8"]), os.environ["PARITY"] != "0", os.environ["WRITE_REFERENCE"]
cases = json.load(open(os.environ["REFERENCE"]))["cases"]

def post(body, timeout=120):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer check-key"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")

deadline = time.time() + 60
while True:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            if r.status == 200:
                break
    except Exception:
        pass
    if time.time() > deadline:
        sys.exit("router never became healthy")
    time.sleep(0.2)

def parity_check():
  print("== parity: 10 reference prompts at temperature 0 (%s)" % device)
  first8 = full = 0
  written = []
  for i, c in enumerate(cases):
    ref = c.get("greedy_text", "")
    n8 = min(8, c.get("greedy_count", len(c.get("greedy_tokens", []))))
    s8, v8 = post({"model": "m", "prompt": c["prompt_tokens"], "max_tokens": 8, "temperature": 0})
    s24, v24 = post({"model": "m", "prompt": c["prompt_tokens"], "max_tokens": 24, "temperature": 0})
    t8 = v8.get("choices", [{}])[0].get("text") if s8 == 200 else None
    t24 = v24.get("choices", [{}])[0].get("text") if s24 == 200 else None
    k8 = v8.get("usage", {}).get("completion_tokens") if s8 == 200 else None
    # Same first 8 tokens <=> 8 tokens generated whose text starts the reference's 24-token text.
    ok8 = t8 is not None and k8 == n8 and ref.startswith(t8)
    ok24 = t24 == ref
    first8 += ok8
    full += ok24
    print("case %d: prompt %3d tok  first-8 %s  24-token text %s  %r" % (
        i, len(c["prompt_tokens"]), "match" if ok8 else "DIFF ", "match" if ok24 else "diff ",
        (t8 if s8 == 200 else "HTTP %d %s" % (s8, v8))[:60]))
    if write_ref and s24 == 200:
        written.append({"prompt_tokens": c["prompt_tokens"], "greedy_text": t24,
                        "greedy_count": v24["usage"]["completion_tokens"]})
  print("first 8 greedy tokens: %d/%d cases match; whole 24-token text: %d/%d" % (
    first8, len(cases), full, len(cases)))
  if write_ref:
    json.dump({"written_by": "scripts/gpu/services.sh on " + device, "cases": written},
              open(write_ref, "w"))
    print("wrote %d cases to %s" % (len(written), write_ref))

  print("== over-length prompt")
  s, v = post({"model": "m", "prompt": [504] * 9000, "max_tokens": 16, "temperature": 0})
  code = (v.get("error") or {}).get("code") or (v.get("error") or {}).get("type")
  over_ok = s == 400
  print("9000-token prompt: HTTP %d %s => %s" % (s, code, "ok" if over_ok else "WRONG (want 400)"))
  return first8, full, over_ok


def run(n):
    done, lock = [], threading.Lock()
    def one(k):
        c = cases[k % len(cases)]
        s, v = post({"model": "m", "prompt": c["prompt_tokens"], "max_tokens": gen,
                     "temperature": 0}, timeout=180)
        with lock:
            done.append(v.get("usage", {}).get("completion_tokens", 0) if s == 200 else -1)
    t = time.time()
    th = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    [x.start() for x in th]
    [x.join() for x in th]
    dt = time.time() - t
    toks = sum(x for x in done if x > 0)
    fails = sum(1 for x in done if x < 0)
    print("%2d streams x %d tokens: %d tokens in %.2f s = %.1f tok/s total (%d failed)" % (
        n, gen, toks, dt, toks / dt, fails))
    return fails == 0

first8, full, over_ok = parity_check() if parity else (len(cases), len(cases), True)
print("== throughput (prefill + decode through the router; includes HTTP and gRPC)")
thr_ok = all([run(n) for n in [1] + streams])

ok = (bool(write_ref) or first8 >= min8) and over_ok and thr_ok
print("%s: %s, first-8 %d/%d, 24-token %d/%d, over-length %s, throughput runs %s" % (
    "PASS" if ok else "FAIL", device, first8, len(cases), full, len(cases),
    "400" if over_ok else "not 400", "ok" if thr_ok else "had failures"))
sys.exit(0 if ok else 1)
EOF
rc=$?
set -e
if [ "$device" != cpu ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
fi
for n in pagewarden-decode pagewarden-prefill pagewarden-router; do
  if grep -qi "panicked" "$logs/$n.err"; then echo "FAIL: $n panicked:"; grep -i -A3 panicked "$logs/$n.err"; rc=1; fi
done
exit $rc
