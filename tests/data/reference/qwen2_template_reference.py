#!/usr/bin/env python3
"""Writes qwen2-chat-template.json: the Qwen2 header's chat template (DeepSeek-R1-Distill-Qwen's)
rendered by llama.cpp's server (`POST /apply-template`, `--jinja`) for a few conversations. Run
once by hand; the tests only read its output.

    python3 qwen2_template_reference.py HEADER.gguf LLAMA_BIN_DIR

llama-server needs a loadable model, which the header is not (its tensors lie past its end), so
this writes one: the header's metadata (tokenizer and template byte for byte) with the shape
keys shrunk to one tiny layer and zero weights of those shapes. The server returns the prompt
without the template's leading BOS text (it adds BOS as a token when it tokenizes).
"""
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

CONVERSATIONS = [
    {"messages": [{"role": "system", "content": "You are a careful assistant."},
                  {"role": "user", "content": "What is 2 + 2?"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Name a prime."},
                  {"role": "assistant", "content": "<think>\nSmall ones first.\n</think>\n\n2"},
                  {"role": "user", "content": "Another?"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "Use the tools."},
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "Let me check."},
                  {"role": "tool", "content": "{\"temp_c\": 21}"},
                  {"role": "tool", "content": "{\"sky\": \"clear\"}"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "日本語で答えて。"},
                  {"role": "assistant", "content": "はい。"},
                  {"role": "user", "content": "ありがとう"}],
     "add_generation_prompt": True},
]
# A conversation ending in an assistant message is left out: llama-server then continues that
# message (its `continue_final_message`), which is the server's feature, not the template's.

SHRINK = {"qwen2.block_count": 1, "qwen2.embedding_length": 64,
          "qwen2.feed_forward_length": 128, "qwen2.attention.head_count": 4,
          "qwen2.attention.head_count_kv": 2, "qwen2.context_length": 4096}
SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def tiny_model(header_path, out_path):
    data = open(header_path, "rb").read()
    version, _, n_kv = struct.unpack_from("<IQQ", data, 4)
    pos, kvs, n_vocab = 24, [], None

    def skip(pos, t):
        if t == 8:
            return pos + 8 + struct.unpack_from("<Q", data, pos)[0]
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(n):
                pos = skip(pos, et)
            return pos
        return pos + SIZE[t]

    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8:pos + 8 + n].decode()
        start = pos
        (t,) = struct.unpack_from("<I", data, pos + 8 + n)
        end = skip(pos + 12 + n, t)
        if key in SHRINK:
            raw = data[start:pos + 8 + n] + struct.pack("<II", 4, SHRINK[key])
        else:
            raw = data[start:end]
        if key == "tokenizer.ggml.tokens":
            n_vocab = struct.unpack_from("<Q", data, pos + 12 + n + 4)[0]
        kvs.append(raw)
        pos = end
    e, ff, nh, nkv = 64, 128, 4, 2
    kv_dim = e // nh * nkv
    shapes = [("token_embd.weight", [e, n_vocab]), ("output_norm.weight", [e]),
              ("blk.0.attn_norm.weight", [e]), ("blk.0.attn_q.weight", [e, e]),
              ("blk.0.attn_k.weight", [e, kv_dim]), ("blk.0.attn_v.weight", [e, kv_dim]),
              ("blk.0.attn_q.bias", [e]), ("blk.0.attn_k.bias", [kv_dim]),
              ("blk.0.attn_v.bias", [kv_dim]), ("blk.0.attn_output.weight", [e, e]),
              ("blk.0.ffn_norm.weight", [e]), ("blk.0.ffn_gate.weight", [e, ff]),
              ("blk.0.ffn_up.weight", [e, ff]), ("blk.0.ffn_down.weight", [ff, e])]
    infos, offset = b"", 0
    for name, dims in shapes:
        infos += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", 0, offset)
        count = 1
        for d in dims:
            count *= d
        offset += -(-count * 4 // 32) * 32
    head = b"GGUF" + struct.pack("<IQQ", version, len(shapes), n_kv) + b"".join(kvs) + infos
    with open(out_path, "wb") as f:
        f.write(head + b"\0" * (-len(head) % 32))
        f.truncate(f.tell() + offset)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    header, bin_dir = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny-qwen2.gguf")
        tiny_model(header, model)
        port = free_port()
        server = subprocess.Popen(
            [os.path.join(bin_dir, "llama-server"), "-m", model, "--jinja", "--port", str(port),
             "-c", "512", "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(300):
                try:
                    if urllib.request.urlopen(base + "/health").status == 200:
                        break
                except Exception:
                    time.sleep(0.2)
            out = []
            for conv in CONVERSATIONS:
                req = urllib.request.Request(
                    base + "/apply-template", data=json.dumps(conv).encode(),
                    headers={"Content-Type": "application/json"})
                prompt = json.loads(urllib.request.urlopen(req).read())["prompt"]
                out.append({**conv, "prompt": prompt})
        finally:
            server.terminate()
            server.wait()
    doc = {"source": "llama.cpp llama-server --jinja /apply-template (llama-cpp-python 0.3.36)",
           "conversations": out}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen2-chat-template.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out)} conversations -> {path}")


if __name__ == "__main__":
    main()
