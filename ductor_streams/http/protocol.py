"""uvicorn's httptools protocol, with a response's head and body sent in one write.

uvicorn writes the status line and headers as soon as the app sends
``http.response.start`` and the body separately: two ``send`` syscalls per response, and
the client wakes for a head it cannot use yet. Here the head is held until the next
write on the connection (the body follows at once, in the same turn of the event loop)
or, at the latest, the end of that turn (a streamed response such as SSE still gets its
head promptly). Nothing else of the protocol changes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeadHoldingTransport:
    """Delegates to the real transport; joins a held response head to the next write."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:  # uvicorn writes bytes
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data.startswith(b"HTTP/") and data.endswith(b"\r\n\r\n"):
            self._held = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HeadHoldingHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` over a transport that sends a response's head with its body."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(
            _HeadHoldingTransport(transport, self.loop)  # type: ignore[arg-type]
        )
