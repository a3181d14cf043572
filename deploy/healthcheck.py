"""The image's HEALTHCHECK: liveness of whatever `ductor-streams` command the container runs.

`serve`: GET /healthz on the port it listens on (200 while the process is up, even while
Postgres is away, so an engine never restarts a replica for an outage; load balancers
use /readyz). Other commands (`workers`, `migrate`) have no HTTP side: the container
runs while they do, which is their health. Standard library only.
"""

import os
import sys
import urllib.request


def command_line() -> list[str]:
    with open("/proc/1/cmdline", "rb") as f:
        return [part.decode() for part in f.read().split(b"\0") if part]


def serve_port(args: list[str]) -> int:
    for i, arg in enumerate(args):
        if arg == "--port" and i + 1 < len(args):
            return int(args[i + 1])
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
    return int(os.environ.get("DUCTOR_STREAMS_PORT") or 8000)


def main() -> int:
    args = command_line()
    if "serve" not in args:
        return 0
    url = f"http://127.0.0.1:{serve_port(args)}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return 0 if response.status == 200 else 1
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
