#!/usr/bin/env bash
# Makes a Debian bookworm base image from Debian's packages, for machines that cannot
# pull images from a registry. Needs root, mmdebstrap and a Debian mirror (apt's).
#
#   deploy/build-base.sh NAME:TAG PACKAGE...
#
# e.g. deploy/build-base.sh localhost/ductor-streams-base:bookworm python3 python3-venv
# The image is a plain root filesystem (no CMD, no user); Containerfiles build on it.
set -euo pipefail
source "$(dirname "$0")/engine.sh"

name=$1; shift
packages=$(IFS=,; echo "ca-certificates,$*")
if [ "${REBUILD_BASE:-0}" != 1 ] && $ENGINE image inspect "$name" >/dev/null 2>&1; then
  echo "base image $name exists (REBUILD_BASE=1 to make it again)"
  exit 0
fi
command -v mmdebstrap >/dev/null || {
  echo "mmdebstrap is missing (apt-get install mmdebstrap), or give BASE_IMAGE=python:3.11-slim" >&2
  exit 1
}
# minbase: essential packages and apt only. Docs, man pages and apt lists are left out.
mmdebstrap --variant=minbase --include="$packages" \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm - | $ENGINE import - "$name" >/dev/null
echo "made base image $name"
