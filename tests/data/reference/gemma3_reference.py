#!/usr/bin/env python3
"""Writes a Gemma 3 reference file in the format of gemma3-270m-q4_k_m.json: llama-server's
prompt ids (BOS added as the GGUF asks, special tokens parsed), the first step's top-5
log-probabilities and 24 greedy tokens (temperature 0, top_k 1) for each prompt. Run once by
hand; the tests only read its output.

    python3 gemma3_reference.py MODEL.gguf LLAMA_BIN_DIR OUT.json [--flash-attn on|off|auto]

The prompts are PROMPTS below: the held-out set of gemma3-270m-q4_k_m-heldout.json, written
after the parity work and never used to tune it (`--prompts-from gemma3-270m-q4_k_m.json` re-runs
the development prompts). The committed files were made with `--flash-attn off`; without it
llama-server runs with its default (`-fa auto`, which resolves to flash attention on the CPU).
"""
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

PROMPTS = [
    "The best way to learn a new language is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n    return",
    "Ein Hund und eine Katze",
    "My favourite season is winter because",
    "Table of contents:\n1. Introduction\n2.",
    "The chemical symbol for gold is",
    "{\"name\": \"Alice\", \"age\": 30, \"city\": \"",
    "Yesterday I went to the market and bought",
    "The 10 most populous countries in the world are China, India,",
    "Roses are red,\nViolets are blue,\n",
]


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    model, bin_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
    fa = sys.argv[sys.argv.index("--flash-attn") + 1] if "--flash-attn" in sys.argv else "auto"
    prompts = PROMPTS
    if "--prompts-from" in sys.argv:
        src = json.load(open(sys.argv[sys.argv.index("--prompts-from") + 1]))
        prompts = [c["prompt"] for c in src["cases"]]
    port = free_port()
    server = subprocess.Popen(
        [os.path.join(bin_dir, "llama-server"), "-m", model, "--port", str(port), "-c", "2048",
         "-fa", fa] + (["-t", os.environ["LLAMA_THREADS"]] if os.environ.get("LLAMA_THREADS") else []), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(base + "/health").status == 200:
                    break
            except Exception:
                time.sleep(0.2)
        cases = []
        for p in prompts:
            ids = post(base, "/tokenize", {"content": p, "add_special": True,
                                           "parse_special": True})["tokens"]
            r = post(base, "/completion", {
                "prompt": ids, "n_predict": 24, "temperature": 0, "top_k": 1, "n_probs": 5,
                "cache_prompt": False, "return_tokens": True, "samplers": ["top_k"]})
            probs = r["completion_probabilities"]
            cases.append({
                "prompt": p,
                "prompt_tokens": ids,
                "greedy_tokens": r["tokens"],
                "greedy_text": r["content"],
                "first_step_top5": [{"token": t["id"], "logprob": round(t["logprob"], 4)}
                                    for t in probs[0]["top_logprobs"]],
            })
    finally:
        server.terminate()
        server.wait()
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    doc = {
        "model": os.path.basename(model),
        "model_sha256": sha,
        "reference": "llama.cpp (llama-server from the llama-cpp-python 0.3.36 sdist), CPU, "
                     f"-fa {fa}, greedy (temperature 0, top_k 1), BOS added as the GGUF says, "
                     "special tokens parsed",
        "cases": cases,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main()
