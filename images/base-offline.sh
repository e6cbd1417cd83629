#!/usr/bin/env bash
# Build the offline base image without any container registry:
#   debootstrap --variant=minbase bookworm (python3 + python3-venv) -> images/.build/rootfs
#   tar | docker import -> $TAG (default prime-agent/base-offline:bookworm)
# The rootfs is cached: a second run only re-imports it (seconds). Needs root (debootstrap).
set -euo pipefail

TAG="${1:-prime-agent/base-offline:bookworm}"
HERE="$(cd "$(dirname "$0")" && pwd)"
BUILD="${PRIME_AGENT_IMAGES_BUILD:-$HERE/.build}"
ROOTFS="$BUILD/rootfs"
SUITE=bookworm
# Only what the session image needs: Python 3.11 with venv/ensurepip (pip for the wheel install),
# bash for %%bash (minbase has it), and nothing that listens or phones home.
PACKAGES=python3,python3-venv

mirror() {
  # The machine's configured Debian mirror (deb822 or one-line sources), else the default.
  local url=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    url="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
  fi
  if [ -z "$url" ] && [ -r /etc/apt/sources.list ]; then
    url="$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list)"
  fi
  echo "${url:-http://deb.debian.org/debian}"
}

if ! command -v docker >/dev/null; then
  echo "base-offline: the docker CLI is not installed" >&2; exit 1
fi
if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "base-offline: debootstrap needs root (run: sudo make base-offline)" >&2; exit 1
  fi
  if ! command -v debootstrap >/dev/null; then
    # A fresh machine (CI included) has no debootstrap: install it from Debian's packages.
    if command -v apt-get >/dev/null; then
      echo "base-offline: installing debootstrap (apt-get)" >&2
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
        || { echo "base-offline: could not install debootstrap with apt-get" >&2; exit 1; }
    else
      echo "base-offline: debootstrap is missing (install it from your distribution)" >&2; exit 1
    fi
  fi
  rm -rf "$ROOTFS.tmp"
  mkdir -p "$BUILD"
  echo "base-offline: debootstrap $SUITE from $(mirror) (about a minute)" >&2
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS.tmp" "$(mirror)" >"$BUILD/debootstrap.log" 2>&1 \
    || { tail -n 20 "$BUILD/debootstrap.log" >&2; exit 1; }
  # Size: package caches, docs, man pages and locales are not needed at run time.
  rm -rf "$ROOTFS.tmp"/var/cache/apt/archives/*.deb "$ROOTFS.tmp"/var/lib/apt/lists/* \
         "$ROOTFS.tmp"/usr/share/doc/* "$ROOTFS.tmp"/usr/share/man/* "$ROOTFS.tmp"/usr/share/info/*
  find "$ROOTFS.tmp/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} + 2>/dev/null || true
  mv "$ROOTFS.tmp" "$ROOTFS"
fi
tar -C "$ROOTFS" --numeric-owner -c . \
  | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$TAG" >/dev/null
echo "base-offline: $TAG ($(du -sh "$ROOTFS" | cut -f1) rootfs)" >&2
