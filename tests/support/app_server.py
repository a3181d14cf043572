"""The product's HTTP server in the test process: ``serve``'s uvicorn configuration (the
connection guard, the lifespan, the draining shutdown) on a real loopback socket, run on
the session's event loop instead of in a subprocess.

For tests of what the app answers (auth, problems, headers) over real HTTP, SSE
included, without the cost of a process: they stay in the ``fast`` tier. Tests of the
process itself (signals, restarts, logs, limits, several replicas) use
``tests.support.server.ServerProcess``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

from ductor_streams.compat.uvicorn_server import DrainingServer
from ductor_streams.config import Settings
from ductor_streams.http import create_app
from ductor_streams.process.serve import uvicorn_config
from tests.support.server import free_port


class _InProcessServer(DrainingServer):
    """uvicorn's server without its signal handlers: in a test process SIGINT stays
    pytest's (uvicorn would swallow Ctrl-C for as long as the session lasts)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AppServer:
    """A running in-process server; ``url`` is its root, like ``ServerProcess.url``."""

    def __init__(self, port: int) -> None:
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def app_server(settings: Settings, start_within: float = 30.0) -> AsyncIterator[AppServer]:
    """Serve ``create_app(settings)`` on a free port until the block ends."""
    settings = settings.with_overrides(host="127.0.0.1", port=free_port())
    app = create_app(settings)
    server = _InProcessServer(uvicorn_config(settings, app, loop="none"), app.begin_shutdown)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(start_within):
            while not server.started:
                if task.done():
                    task.result()  # its exception
                    raise RuntimeError("the in-process server stopped while starting")
                await asyncio.sleep(0.01)
        yield AppServer(settings.port)
    finally:
        server.should_exit = True
        await task
