"""A provider's failover endpoint in miniature: one TCP address on loopback that
forwards every connection to the current primary, and that a test moves to another
node, as Cloud SQL, RDS Multi-AZ or a Patroni HAProxy move their DNS name or virtual IP.

``TcpProxy(("127.0.0.1", port)).start()`` listens on a free loopback port (``port``,
``dsn(...)``) in an event loop of its own, on a thread, so that the test's loop and
its load do not slow the forwarding. ``move(target)`` points new connections at
``target`` and resets every connection still open to the old one (``SO_LINGER`` 0: an
RST, as the old address answers once a virtual IP has moved), including one whose
upstream connect was under way. ``stop()`` closes everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading

from tests.support.server import free_port

CHUNK = 65536


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close the connection with an RST (not a FIN): nothing sent is flushed."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class TcpProxy:
    """One listening address; ``target`` is where new connections go."""

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port()
        self.target = target
        self.accepted = 0  # connections taken, over the proxy's life
        self.reset = 0  # connections reset by ``move``
        self._generation = 0  # bumped by each move
        self._pairs: dict[tuple[asyncio.StreamWriter, asyncio.StreamWriter], int] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None

    def dsn(self, database: str, user: str = "postgres") -> str:
        """A Postgres DSN whose only host is this address."""
        return f"postgresql://{user}@{self.host}:{self.port}/{database}"

    # -- the thread's loop ------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> TcpProxy:
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the TCP proxy did not start listening")
        if self._failed is not None:
            raise RuntimeError("the TCP proxy could not listen") from self._failed
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, self.host, self.port)
            )
        except BaseException as exc:  # handed to start()
            self._failed = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        self.accepted += 1
        generation = self._generation
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)  # nothing listens there (the node is down): a refused connect
            return
        if generation != self._generation:
            # Moved while this connect was under way: it reached the old node.
            _reset(up_writer)
            _reset(writer)
            self.reset += 1
            return
        pair = (writer, up_writer)
        self._pairs[pair] = generation
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer)),
            asyncio.ensure_future(self._pipe(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            if self._pairs.pop(pair, None) is not None:
                # One side ended: end the other (a FIN, as a proxy passes it on).
                for side in pair:
                    side.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()

    async def _move(self, target: tuple[str, int]) -> int:
        self.target = target
        self._generation += 1
        old = list(self._pairs)
        self._pairs.clear()
        for pair in old:
            for side in pair:
                _reset(side)
        self.reset += len(old)
        return len(old)

    # -- from the test's thread -------------------------------------------------------

    def move(self, target: tuple[str, int]) -> int:
        """Send new connections to ``target`` and reset every open one; returns how
        many were reset."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._move(target), self._loop)
        return future.result(10)

    def open_connections(self) -> int:
        assert self._loop is not None

        async def count() -> int:
            return len(self._pairs)

        return asyncio.run_coroutine_threadsafe(count(), self._loop).result(10)

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None or not self._thread.is_alive():
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            await self._move(self.target)
            for handler in list(self._handlers):
                handler.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
