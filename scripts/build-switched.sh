#!/usr/bin/env bash
# Builds the router, prefill and decode binaries WITH the test-only defense switches (feature
# `unsafe-test-switches`, dev profile only: a release build with it does not compile) and puts
# them in target/debug/unsafe-test-switches/, where the system test that replays the incident
# (tests/tests/incident_real_services.rs) finds them. Then rebuilds the same binaries without the
# feature, so target/debug/ holds the normal ones again (cargo links the last build there).
#
# Usage: scripts/build-switched.sh [FEATURES]   (FEATURES: the normal build's, e.g. CUDA's.)
# Both builds select the whole workspace's binaries, as scripts/test.sh's normal build does: the
# same selection and features resolve every dependency the same way, so only workspace crates
# build twice (a build of three packages alone would resolve some dependencies' features
# differently and rebuild them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
base=${1:-}
bins=(pagewarden-router pagewarden-prefill pagewarden-decode)
switches=pagewarden-router/unsafe-test-switches,pagewarden-prefill/unsafe-test-switches,pagewarden-decode/unsafe-test-switches
features=$switches${base:+,$base}
echo "== cargo build ${bins[*]} with the test-only defense switches"
cargo build --workspace --bins --features "$features"
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
out=$target/debug/unsafe-test-switches
mkdir -p "$out"
for b in "${bins[@]}"; do
  cp -f "$target/debug/$b" "$out/$b"
done
echo "== cargo build ${bins[*]} again without them (target/debug/ holds the normal binaries)"
if [ -n "$base" ]; then
  cargo build --workspace --bins --features "$base"
else
  cargo build --workspace --bins
fi
for b in "${bins[@]}"; do
  if cmp -s "$target/debug/$b" "$out/$b"; then
    echo "error: target/debug/$b is still the switched build" >&2
    exit 1
  fi
done
