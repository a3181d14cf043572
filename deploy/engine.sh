# Sourced by the deploy scripts: picks the container engine and works around two quirks
# of some machines without touching the system's configuration.
#
#   ENGINE   podman or docker (default: podman when installed, else docker)
#
# With podman, unless CONTAINERS_CONF already names a file, a scratch containers.conf
# under deploy/.build/ is used (podman reads the file CONTAINERS_CONF names instead of
# the system's):
#   - default_ulimits: podman asks for a larger open-file limit than some hosts'
#     hard limit and then fails to start any container; ask for what the host allows.
#   - runtime = "runc": crun refuses hosts with hybrid cgroups (v1 and v2 mounted at
#     once); runc copes. Used only when runc is installed.

DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_DIR="${BUILD_DIR:-$DEPLOY_DIR/.build}"
mkdir -p "$BUILD_DIR"

if [ -z "${ENGINE:-}" ]; then
  if command -v podman >/dev/null; then ENGINE=podman
  elif command -v docker >/dev/null; then ENGINE=docker
  else echo "neither podman nor docker is installed" >&2; exit 1
  fi
fi

if [ "$ENGINE" = podman ] && [ -z "${CONTAINERS_CONF:-}" ]; then
  hard=$(ulimit -Hn)
  nofile=20000
  if [ "$hard" != unlimited ] && [ "$hard" -lt "$nofile" ]; then nofile=$hard; fi
  {
    echo '[containers]'
    echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=4096:4096\"]"
    if command -v runc >/dev/null; then
      echo '[engine]'
      echo 'runtime = "runc"'
    fi
  } > "$BUILD_DIR/containers.conf"
  export CONTAINERS_CONF="$BUILD_DIR/containers.conf"
fi
export ENGINE
