#!/usr/bin/env bash
# Builds the local compose image from binaries built on this host (no registry, no compiler in
# a container): on the base from Debian's packages (scripts/compose-base.sh: PostgreSQL, curl,
# the `pagewarden` user and the secrets mount points), the five binaries (debug info stripped)
# in /usr/local/bin and PostgreSQL's entry point (deploy/compose/local/postgres.sh) as
# /usr/local/bin/pagewarden-postgres; runs as `pagewarden` in /var/lib/pagewarden. Prints the
# image's name.
#
#   cargo build --workspace --bins && scripts/compose-images.sh [--bin-dir target/debug] [--tag pagewarden-local:dev]
#   PAGEWARDEN_LOCAL_IMAGE=pagewarden-local:dev docker compose -f deploy/compose/docker-compose.yml \
#     -f deploy/compose/local/local-images.yml up --no-build
#
# One `docker create` + `docker cp` + `docker commit` instead of a Dockerfile: the legacy
# builder commits a layer per instruction, several times slower for the same image.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=$root/target/debug
image=pagewarden-local:dev
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --tag) image=$2; shift 2 ;;
    *) echo "usage: $0 [--bin-dir DIR] [--tag IMAGE]" >&2; exit 2 ;;
  esac
done

base=$("$root/scripts/compose-base.sh")
tree=$(mktemp -d "${TMPDIR:-/tmp}/pagewarden-image.XXXXXX")
container=
cleanup() {
  rm -rf "$tree"
  [ -z "$container" ] || docker rm -f "$container" >/dev/null 2>&1 || true
}
trap cleanup EXIT
mkdir -p "$tree/usr/local/bin"
for b in pagewarden pagewarden-router pagewarden-prefill pagewarden-decode pagewarden-auditor; do
  [ -x "$bin_dir/$b" ] || {
    echo "$bin_dir/$b is missing: cargo build --workspace --bins first" >&2
    exit 1
  }
  strip --strip-debug -o "$tree/usr/local/bin/$b" "$bin_dir/$b"
done
install -m 0755 "$root/deploy/compose/local/postgres.sh" "$tree/usr/local/bin/pagewarden-postgres"
echo "== $image: host binaries on $base" >&2
container=$(docker create "$base" true)
# Only /usr/local/bin's contents: a copied directory entry would also bring its mode along.
docker cp "$tree/usr/local/bin/." "$container:/usr/local/bin/"
docker commit \
  --change 'USER pagewarden' \
  --change 'WORKDIR /var/lib/pagewarden' \
  --change 'ENV RUST_LOG=info' \
  --change 'CMD ["pagewarden", "--help"]' \
  "$container" "$image" >/dev/null
echo "$image"
