#!/usr/bin/env bash
# `make image`: builds the runtime image from uv.lock (deploy/Containerfile).
#
#   IMAGE       tag to build (default localhost/ductor-streams:latest)
#   BASE_IMAGE  an image with CPython 3.11, its venv module and CA certificates
#               (default: the Debian base deploy/build-base.sh makes here, from
#               Debian's packages; with a registry, python:3.11-slim does as well)
#   EXTRAS      extras installed beside the runtime, space-separated (default: gcs;
#               empty for file:// object stores only)
#   ENGINE      podman or docker (deploy/engine.sh)
#   UV          the uv binary (default: .tools/bin/uv that `make install` sets up)
#   WHEEL_CACHE wheels kept between builds (default ~/.cache/ductor-streams/wheels)
#
# The wheels are downloaded on this host, not in the build: pip inside a build may not
# have the host's certificates or network. Each is checked against uv.lock's hashes
# here and again inside the build.
set -euo pipefail
source "$(dirname "$0")/engine.sh"
ROOT="$(cd "$DEPLOY_DIR/.." && pwd)"
cd "$ROOT"

IMAGE="${IMAGE:-localhost/ductor-streams:latest}"
DEFAULT_BASE=localhost/ductor-streams-base:bookworm
BASE_IMAGE="${BASE_IMAGE:-$DEFAULT_BASE}"
EXTRAS="${EXTRAS-gcs}"
UV="${UV:-$ROOT/.tools/bin/uv}"
[ -x "$UV" ] || UV="$(command -v uv)" || { echo "uv is missing: make install" >&2; exit 1; }
PYTHON="${PYTHON:-python3}"

if [ "$BASE_IMAGE" = "$DEFAULT_BASE" ]; then
  "$DEPLOY_DIR/build-base.sh" "$BASE_IMAGE" python3 python3-venv
fi

ctx="$BUILD_DIR/image"
rm -rf "$ctx"
mkdir -p "$ctx/wheels"

extra_args=()
for extra in $EXTRAS; do extra_args+=(--extra "$extra"); done
# The runtime set: the project's dependencies and the chosen extras, pinned, with hashes.
"$UV" export --frozen --no-emit-project --no-header --format requirements-txt \
  "${extra_args[@]}" -o "$ctx/wheels/requirements.txt" >/dev/null
# Binary wheels only, from the index alone: the machine's pip configuration (extra
# indexes, find-links, constraints) must not slip other builds in.
download() {
  env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --require-hashes -r "$ctx/wheels/requirements.txt" "$@"
}
# WHEEL_CACHE keeps the wheels of earlier builds: when it holds every one, they are
# taken from there without asking the index (3 s instead of 18 here), each checked
# against uv.lock's hashes all the same. Otherwise they come from the index, and what
# was missing is kept for the next build.
WHEEL_CACHE="${WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ductor-streams/wheels}"
mkdir -p "$WHEEL_CACHE"
if ! download --no-index --find-links "$WHEEL_CACHE" -d "$ctx/wheels" 2>/dev/null; then
  find "$ctx/wheels" -name '*.whl' -delete
  download -d "$ctx/wheels"
  cp -n "$ctx/wheels"/*.whl "$WHEEL_CACHE"/
fi
"$UV" build --quiet --wheel --out-dir "$ctx/wheels" "$ROOT"

cp "$DEPLOY_DIR/Containerfile" "$DEPLOY_DIR/healthcheck.py" "$ctx/"
format=()
# HEALTHCHECK is part of the docker image format only; podman's default (OCI) drops it.
[ "$ENGINE" = podman ] && format=(--format docker)
digest=$(cd "$ctx/wheels" && sha256sum -- * | sha256sum | cut -d' ' -f1)
$ENGINE build "${format[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
  --build-arg "WHEELS_SHA256=$digest" -t "$IMAGE" \
  -f "$ctx/Containerfile" "$ctx"
echo "built $IMAGE"
