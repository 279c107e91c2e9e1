#!/usr/bin/env bash
# Writes reference.json beside this script: for the tiny random model of every architecture
# (crates/model/src/gguf/tiny_arch.rs), what llama.cpp's llama-server computes for a few
# prompts given as token ids: the first step's top log-probabilities (raw logits, before
# sampling) and the greedy continuation. Not run by the tests (they read its output).
#
# usage: make_reference.sh LLAMA_BIN_DIR      (the directory holding llama-server)
set -euo pipefail

bin=${1:?usage: make_reference.sh LLAMA_BIN_DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../../.." && pwd)
work=$(mktemp -d)
trap 'kill "${server:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT

cargo run -q --manifest-path "$root/Cargo.toml" -p pagewarden-model \
    --example write_arch_ggufs -- "$work" >/dev/null

cpu=$(lscpu | sed -n 's/^Model name: *//p')
version=$("$bin/llama-server" --version 2>&1 | grep -m1 version || true)
port=18731
out="$work/models.jsonl"
for gguf in "$work"/*.gguf; do
    "$bin/llama-server" -m "$gguf" --host 127.0.0.1 --port "$port" -c 256 -np 1 -t 2 \
        -fa off --no-warmup >"$work/server.log" 2>&1 &
    server=$!
    python3 - "$gguf" "$port" >>"$out" <<'PY'
import hashlib, json, sys, time, urllib.request

gguf, port = sys.argv[1], sys.argv[2]
url = f"http://127.0.0.1:{port}"
for _ in range(300):
    try:
        if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
            break
    except Exception:
        time.sleep(0.1)
else:
    sys.exit(f"llama-server did not come up for {gguf}")

# Ids of the tiny vocabulary (3 specials, 256 bytes, merges): a short prompt, and one longer
# than the 8-token sliding window some files declare.
prompts = [
    [75, 104, 111, 32, 119, 111, 114],
    [43, 300, 105, 115, 32, 97, 32, 116, 101, 115, 116, 46, 32, 84, 104, 101, 32, 113,
     117, 105, 99, 107, 32, 98],
]
cases = []
for ids in prompts:
    body = {
        "prompt": ids,
        "n_predict": 8,
        "temperature": 0,
        "n_probs": 8,
        "post_sampling_probs": False,
        "cache_prompt": False,
        "return_tokens": True,
    }
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=60))
    steps = r["completion_probabilities"]
    cases.append({
        "prompt_tokens": ids,
        "greedy_tokens": r["tokens"],
        "first_step_top": [{"token": t["id"], "logprob": t["logprob"]}
                           for t in steps[0]["top_logprobs"]],
        "stop_type": r.get("stop_type"),
    })
sha = hashlib.sha256(open(gguf, "rb").read()).hexdigest()
name = gguf.rsplit("/", 1)[-1].removesuffix(".gguf")
print(json.dumps({"name": name, "sha256": sha, "cases": cases}))
PY
    kill "$server"
    wait "$server" 2>/dev/null || true
done

python3 - "$out" "$cpu" "$version" >"$here/reference.json" <<'PY'
import json, sys
models = [json.loads(l) for l in open(sys.argv[1])]
print(json.dumps({
    "reference": "llama-server (llama.cpp), CPU, -fa off, f16 KV, temperature 0, "
                 "prompts as token ids, n_probs with post_sampling_probs false",
    "llama_cpp": sys.argv[3],
    "cpu": sys.argv[2],
    "models": models,
}, indent=1))
PY
echo "wrote $here/reference.json"
