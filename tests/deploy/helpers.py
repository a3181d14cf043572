"""Small things the deploy tests share."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

JWT_SECRET = "deploy-test-" + "s" * 24
# `serve` and `workers` shut down within this long of SIGTERM (their shutdown timeout);
# the tests wait longer than this for the exit, to catch a hang, not to time it.
SIGTERM_BOUND_SECONDS = 10.0
# What uvicorn logs when requests outlive the shutdown budget and are cancelled.
FORCED_SHUTDOWN = "timeout graceful shutdown exceeded"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def reachable_from_a_container(dsn: str) -> str:
    """``dsn`` as a container on the host's network can use it.

    The embedded Postgres (when DUCTOR_STREAMS_TEST_DATABASE_URL is unset) listens only
    on a Unix socket inside its data folder, which a container cannot reach: its /tmp is
    a tmpfs of its own, and its user may not enter the folder. A TCP port on loopback is
    forwarded to that socket for the rest of the test session, and the DSN names it."""
    parts = urlsplit(dsn)
    query = parse_qsl(parts.query)
    socket_dir = next((v for k, v in query if k == "host" and v.startswith("/")), None)
    if socket_dir is None:
        return dsn
    path = f"{socket_dir}/.s.PGSQL.{parts.port or 5432}"
    port = _forwarders.get(path) or _forward(path)
    _forwarders[path] = port
    user = parts.username or "postgres"
    rest = urlencode([(k, v) for k, v in query if k != "host"])
    return urlunsplit((parts.scheme, f"{user}@127.0.0.1:{port}", parts.path, rest, ""))


_forwarders: dict[str, int] = {}


def _forward(unix_path: str) -> int:
    """A loopback TCP port whose connections are piped to ``unix_path`` (daemon threads)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            server = socket.socket(socket.AF_UNIX)
            try:
                server.connect(unix_path)
            except OSError:
                client.close()
                server.close()
                continue
            threading.Thread(target=pipe, args=(client, server), daemon=True).start()
            threading.Thread(target=pipe, args=(server, client), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])
