"""`dev` decides whether its port is free as the servers it starts will bind it."""

from __future__ import annotations

import socket

from ductor_streams.process.dev import _port_free


def test_a_listening_port_is_in_use() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert _port_free(server.getsockname()[1]) is False


def test_a_port_left_in_time_wait_by_the_last_run_is_free() -> None:
    """Ctrl-C closes the server's accepted connections first: those sockets sit in
    TIME_WAIT for a minute, and a restart must not call the port in use."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end goes to TIME_WAIT
    client.recv(1)
    client.close()
    server.close()
    assert _port_free(port) is True
