#!/usr/bin/env python3
"""Writes qwen2-tokenizer.json: llama.cpp's token ids for the strings below under the real
Qwen2 vocabulary (the header of DeepSeek-R1-Distill-Qwen-7B Q4_K_M, `tokenizer.ggml.pre =
deepseek-r1-qwen`). Run once by hand; the tests only read its output.

    python3 qwen2_tokenizer_reference.py HEADER.gguf LLAMA_BIN_DIR

HEADER.gguf is `cargo run -p pagewarden -- fetch qwen2-7b-header`; LLAMA_BIN_DIR holds llama.cpp's
`llama-tokenize` (llama-cpp-python 0.3.36's vendored llama.cpp, target llama-tokenize).
llama.cpp will not open a file whose tensors lie past its end, even for its vocabulary, so the
header is rewritten without tensor entries (the metadata bytes are copied as they are).

Strings are split in two: `dev` (even positions) and `heldout` (odd positions, not looked at
while fixing the tokenizer). Each case has `ids` (special tokens parsed, as a prompt) and
`ids_text` (special tokens not parsed, as message content); no BOS.
"""
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

HAND = [
    # English, contractions, case
    "Hello world", "Hello, world!", "I'm here, it's fine, we'll see, they've gone, you'd know",
    "I'M HERE IT'S FINE WE'LL SEE", "don't", "DON'T", "'s 't 're 've 'm 'll 'd", "rock'n'roll",
    "The quick brown fox jumps over the lazy dog.", "  leading spaces", "trailing spaces   ",
    "tabs\tand\ttabs", "mixed \t \n whitespace", "\n", "\n\n", "\n\n\n", " \n ", "\r\n",
    "line1\r\nline2\r\n", "a  b", "a   b", "a    b", "     ", "\t\t", " ", "x\n\ny",
    # numbers
    "12345", "1234567890", "3.14159", "-42", "1,000,000", "2024-02-29", "0x1F", "1e-9",
    "v1.2.3", "abc123def", "x 12", "١٢٣٤", "٣.١٤", "½ ¾", "Ⅻ", "²³", "123abc", "$100.00",
    # code
    "def f(x):\n    return x * 2\n", "fn main() {\n    println!(\"hi\");\n}\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i]; }", "if x == 1 && y != 2 || !z {",
    "const obj = { key: 'value', n: 42 };", "SELECT * FROM users WHERE id = 1;",
    "#include <stdio.h>\nint main(void) { return 0; }", "<div class=\"a\">text</div>",
    "    indented\n        more\n", "x += 1  # comment", "// comment\n/* block */",
    "foo_bar_baz = FooBarBaz()", "camelCaseIdentifier", "snake_case_identifier",
    "path/to/file.rs", "https://example.com/a?b=c&d=e#f", "user@example.com",
    "```python\nprint('hi')\n```", "{\"a\": [1, 2, {\"b\": null}]}", "a->b; c=>d; e::f",
    "!!!???...", "((()))", "[[]]{{}}", "~`@#$%^&*()_+-=", "\\n\\t\\\\", "--flag=value",
    # CJK and other scripts
    "日本語のテキスト。", "你好，世界！", "中文分词测试：今天天气很好。", "한국어 텍스트입니다.",
    "東京都渋谷区", "カタカナとひらがな", "Привет, мир!", "Ελληνικά κείμενα", "مرحبا بالعالم",
    "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Xin chào thế giới", "Zürich Straße Öl",
    "naïve café résumé", "ǅemal", "İstanbul ıi", "ﬁnance ﬂow", "e\u0301 combining",
    "Ａｂｃ１２３", "한글123abc日本", "mixed English 和 中文 and 日本語",
    # emoji and symbols
    "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸🇯🇵", "I ❤️ Rust", "★☆✓✗", "→ ← ↑ ↓", "∑∫√∞≈≠",
    "€£¥₹", "©®™", "•·…", "—–-", "“quoted” ‘single’", "«guillemets»", "¿Qué? ¡Sí!",
    # special-token-looking text
    "<|im_start|>", "<|im_end|>", "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|>", "<｜User｜>hello<｜Assistant｜>", "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>", "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>{}</tool_call>",
    "<|im_end|><|im_start|>system", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "< |im_end| >", "<|im_end", "im_end|>", "<<|im_end|>>", "<|vision_start|><|image_pad|>",
    "<s></s>", "[INST] hi [/INST]", "<start_of_turn>user", "<|eot_id|>", "<|EOT|>",
    # odd bytes and edge cases
    "\u00a0nbsp", "zero\u200bwidth", "\ufeffbom", "a\u2028b", "\u3000ideographic space",
    "\u0085nel", "\x07bell", "\x00nul", "\u00adsoft", "\U0001F600\U0001F601", "\u202e rtl",
    "ÿþý", "\\u0041", "%s %d %%", "a" * 50, "ab" * 30, " " * 20 + "x", "\n" * 8 + "x",
    "-" * 40, "=" * 16, "." * 10, "🙂" * 5,
]

WORDS = ["the", "The", "THE", "hello", "world", "model", "token", "Qwen", "über", "naïve",
         "日本", "中文", "한국", "привет", "γεια", "123", "4567", "3.5", "😀", "👍", "{", "}",
         "(", ")", "=>", "::", "_", "-", "'s", "'LL", "/", "\\", "#", "@", "<|im_end|>",
         "<think>", "\n", "\n\n", " ", "  ", "\t", "\r\n", ".", ",", "!", "?", "…", "—", "x"]


def composed(n, seed=20261202):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(2, 12)
        parts = [rng.choice(WORDS) for _ in range(k)]
        seps = [rng.choice(["", " ", " ", "  ", "\n", ""]) for _ in range(k)]
        out.append("".join(p + s for p, s in zip(parts, seps)))
    return out


def vocab_only(header_path, out_path):
    """The header's metadata with no tensor entries, which llama.cpp loads with vocab_only."""
    with open(header_path, "rb") as f:
        data = f.read()
    assert data[:4] == b"GGUF"
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    pos = 24
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(pos, t):
        if t == 8:
            (n,) = struct.unpack_from("<Q", data, pos)
            return pos + 8 + n
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(n):
                pos = skip(pos, et)
            return pos
        return pos + size[t]

    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        (t,) = struct.unpack_from("<I", data, pos)
        pos = skip(pos + 4, t)
    with open(out_path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", version, 0, n_kv) + data[24:pos])
    return hashlib.sha256(data).hexdigest()


def tokenize(bin_dir, vocab, text, parse_special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        args = [os.path.join(bin_dir, "llama-tokenize"), "-m", vocab, "-f", path, "--ids",
                "--no-bos", "--no-escape", "--log-disable"]
        if not parse_special:
            args.append("--no-parse-special")
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    return json.loads(out.strip().splitlines()[-1])


def main():
    header, bin_dir = sys.argv[1], sys.argv[2]
    strings = HAND + composed(300 - len(HAND))
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "vocab.gguf")
        sha = vocab_only(header, vocab)
        cases = []
        for s in strings:
            cases.append({"text": s, "ids": tokenize(bin_dir, vocab, s, True),
                          "ids_text": tokenize(bin_dir, vocab, s, False)})
    doc = {
        "source": "llama.cpp llama-tokenize (llama-cpp-python 0.3.36), --no-bos, vocab only",
        "header_sha256": sha,
        "dev": cases[0::2],
        "heldout": cases[1::2],
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen2-tokenizer.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} strings -> {out}")


if __name__ == "__main__":
    main()
