#!/usr/bin/env bash
# A 7B model through the whole suite without its weights: Qwen2-7B in Q4_K_M, the real file's
# header (vocabulary, chat template, hyperparameters, every tensor's name, shape and type) with
# seeded random weights (`crates/model/examples/random_like.rs`, about 4.4 GB, written outside
# the checkout when missing). Starts `pagewarden up` on it, sends one chat request, and prints
# each worker's start-up time and resident memory (VmRSS = RssAnon + RssFile: the KV pool and
# repacked weights are anonymous, file pages are the mapping). With LLAMA_SERVER=path/to/
# llama-server, does the same for llama-server on the same file and context, with `-fa off`
# (the attention arithmetic of the suite's default path; LLAMA_FA=on for llama-server's CPU
# default), so the two replies are comparable token for token.
#   scripts/qwen2-7b-random.sh [OUT.gguf]
# Not run by the test suite (4.4 GB, minutes on two cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/pagewarden/qwen2-7b-random-q4_k_m.gguf}"
ctx="${CONTEXT:-4096}"
threads="${THREADS:-$(nproc)}"
cargo build -q --release --bins -p pagewarden-router -p pagewarden-prefill -p pagewarden-decode \
  -p pagewarden-auditor -p pagewarden
header=$(target/release/pagewarden fetch qwen2-7b-header)
if [ ! -s "$out" ]; then
  mkdir -p "$(dirname "$out")"
  echo "== writing $out (random weights in the layout of $header)"
  /usr/bin/time -f "   %e s" cargo run -q --release -p pagewarden-model --example random_like -- \
    "$header" "$out" 1
fi
ls -l "$out"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rss() { # pid -> "VmRSS a MB (anon b, file c)"
  awk '/^VmRSS/{r=$2} /^RssAnon/{a=$2} /^RssFile/{f=$2} END{printf "VmRSS %d MB (anon %d, file %d)", r/1024, a/1024, f/1024}' "/proc/$1/status"
}
ask() { # url key model -> prints the reply's text and usage, and the wall time
  local t0 t1 body
  body=$(python3 -c 'import json,sys; print(json.dumps({"model": sys.argv[1], "max_tokens": 16, "temperature": 0,
    "messages": [{"role": "user", "content": "Write a haiku about the sea."}]}))' "$3")
  t0=$(date +%s.%N)
  curl -sS --max-time 600 "$1/v1/chat/completions" -H "Authorization: Bearer $2" \
    -H 'Content-Type: application/json' -d "$body" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print("   reply:", json.dumps(r["choices"][0]["message"]["content"])[:120]); print("   usage:", r["usage"])'
  t1=$(date +%s.%N)
  echo "   request took $(python3 -c "print(round($t1 - $t0, 2))") s"
}

dir=$(mktemp -d)
trap 'kill $up_pid 2>/dev/null || true; kill ${ls_pid:-} 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
echo "== pagewarden up (context $ctx)"
t0=$(date +%s.%N)
target/release/pagewarden up --no-build --dir "$dir/pw" --router-addr "127.0.0.1:$(free_port)" \
  --auditor-addr "127.0.0.1:$(free_port)" --probe-interval 0s --model "$out" \
  --context-length "$ctx" >"$dir/up.out" 2>"$dir/up.err" &
up_pid=$!
for _ in $(seq 1200); do
  grep -q 'Ctrl-C stops everything' "$dir/up.out" 2>/dev/null && break
  kill -0 $up_pid 2>/dev/null || { cat "$dir/up.err"; exit 1; }
  sleep 0.5
done
echo "   suite up after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
grep -E 'listening after' "$dir/up.err" | sed 's/: .*//; s/^/   /'
api=$(sed -n 's/.*API (OpenAI-compatible): \(.*\)\/v1/\1/p' "$dir/up.out")
key=$(sed -n "s/.*Bearer \([^']*\)'.*/\1/p" "$dir/up.out")
model=$(sed -n 's/.*"model":"\([^"]*\)".*/\1/p' "$dir/up.out")
for w in prefill decode; do
  echo "   $w after start: $(rss "$(awk -v w=$w '$1 == w && $2 == "pid" {print $3}' "$dir/up.out")")"
done
ask "$api" "$key" "$model"
for w in prefill decode; do
  echo "   $w after a request: $(rss "$(awk -v w=$w '$1 == w && $2 == "pid" {print $3}' "$dir/up.out")")"
done
kill -INT $up_pid; wait $up_pid || true

if [ -n "${LLAMA_SERVER:-}" ]; then
  echo "== llama-server (context $ctx, $threads threads, -fa ${LLAMA_FA:-off})"
  port=$(free_port)
  t0=$(date +%s.%N)
  "$LLAMA_SERVER" -m "$out" -c "$ctx" -t "$threads" -fa "${LLAMA_FA:-off}" --host 127.0.0.1 --port "$port" \
    >"$dir/ls.log" 2>&1 &
  ls_pid=$!
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
    kill -0 $ls_pid 2>/dev/null || { tail "$dir/ls.log"; exit 1; }
    sleep 0.2
  done
  echo "   ready after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
  echo "   after start: $(rss $ls_pid)"
  ask "http://127.0.0.1:$port" none qwen
  echo "   after a request: $(rss $ls_pid)"
fi
