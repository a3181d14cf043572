"""Small things the deploy tests share."""

from __future__ import annotations

import socket

JWT_SECRET = "deploy-test-" + "s" * 24
# `serve` and `workers` must exit within this long of SIGTERM (their shutdown timeout).
SIGTERM_BOUND_SECONDS = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
