"""uvicorn's ``Server`` with a say in its shutdown: it overrides ``shutdown(sockets)`` and
closes the listeners it keeps in ``self.servers`` first (not public API: pyproject.toml
bounds uvicorn, tests/foundation/test_private_apis.py checks both)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which calls ``on_shutdown`` as it begins to shut down, after
    closing its listeners (``serve`` ends the app's SSE responses there: uvicorn alone
    would wait for them until its timeout and then cut them)."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Listeners first, so that a client reconnecting after its SSE response ended
        # finds another replica rather than this one.
        for server in self.servers:
            server.close()
        self._on_shutdown()
        await super().shutdown(sockets)
