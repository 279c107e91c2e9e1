#!/usr/bin/env bash
# Builds the base image the local compose images stand on, from Debian's packages only (no image
# is pulled): `debootstrap --variant=minbase` of the host's own Debian release, from the mirror
# the host's apt is configured with, then `docker import`. Prints the image's name.
#
#   scripts/compose-base.sh            # -> pagewarden-base:<tag>
#
# The tag is a digest of this recipe (this file, the release, the architecture), so a second
# run finds the image and returns at once; delete it (`docker rmi`) to build anew.
#
# What is in it: PostgreSQL's server and client (the local stand-in for the `postgres` image),
# curl (the compose health checks), the `pagewarden` user (uid 10001) and the mount points of
# the compose secrets volumes.
set -euo pipefail

# The service binaries link only glibc and libgcc_s (minbase has both); CUDA and ibverbs are
# loaded at run time, when a device asks for them.
packages=postgresql,curl

. /etc/os-release
suite=${VERSION_CODENAME:?/etc/os-release names no VERSION_CODENAME}
arch=$(dpkg --print-architecture)

# The host's Debian mirror, as its apt configuration names it: the first `deb` source that
# serves this release (deb822 `.sources` files first, then one-line `sources.list` files).
mirror_of_host() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$suite" '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && enabled != "no" && uri != "") {
          print uri; found = 1; exit
        }
        types = ""; suites = ""; uri = ""; enabled = ""
      }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]*#/ { next }
      tolower($1) == "types:" { $1 = ""; types = $0 }
      tolower($1) == "suites:" { $1 = ""; suites = $0 }
      tolower($1) == "uris:" { uri = $2 }
      tolower($1) == "enabled:" { enabled = tolower($2) }
      END { if (!found) flush() }
    ' "$f" | head -n1
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    # deb [options] URI SUITE COMPONENTS...
    sed -e 's/\[[^]]*\]//' "$f" | awk -v suite="$suite" '$1 == "deb" && $3 == suite { print $2; exit }'
  done
}

tag=$( { cat "$0"; echo "$suite $arch $packages"; } | sha256sum | cut -c1-16)
image=pagewarden-base:$tag
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi

command -v debootstrap >/dev/null || {
  echo "debootstrap is not installed (apt-get install debootstrap)" >&2
  exit 1
}
mirror=$(mirror_of_host | head -n1)
[ -n "$mirror" ] || {
  echo "no deb source for $suite in /etc/apt/sources.list*: cannot pick a mirror" >&2
  exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/pagewarden-base.XXXXXX")
# --one-file-system: never follow a mount debootstrap may have left in the tree into the host.
trap 'rm -rf --one-file-system "$work"' EXIT
root=$work/root
echo "== debootstrap $suite ($arch) from $mirror with $packages" >&2
debootstrap --variant=minbase --arch="$arch" --include="$packages" \
  "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
}
# The cluster the package's postinst made, caches and docs: not needed in an image.
rm -rf "$root"/var/lib/postgresql/* "$root"/etc/postgresql/* \
  "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
# The services' user, and the mount points of compose's per-role secrets volumes: a fresh
# volume takes its owner from the directory it is mounted on, so what `init` draws there (as
# this user, mode 0600) is readable by the services (this user) and by no one else. The same
# for PostgreSQL's data volume.
chroot "$root" useradd --system --uid 10001 --home-dir /var/lib/pagewarden --create-home \
  pagewarden 2>/dev/null
for d in admin router prefill decode auditor; do
  chroot "$root" install -d -o pagewarden -g pagewarden -m 0700 "/etc/pagewarden/$d"
done
# The workers' metrics token for Prometheus, which runs as a user of its own: its volume is
# written by `init` and readable by that user (the volume is mounted by Prometheus alone).
chroot "$root" install -d -o pagewarden -g pagewarden -m 0755 /etc/pagewarden/prometheus
chroot "$root" install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data
echo "== docker import $image" >&2
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
echo "$image"
