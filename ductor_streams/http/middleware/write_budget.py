"""The write budget of catch-up responses: large bodies go out a piece at a time, and a
client that takes no piece in time is cut.

A native page, a DS catch-up page or an object download can be megabytes. Written whole,
a body waits in the server's send buffer for as long as its client takes to read it: a
hundred sockets that sent a GET and never read held a gigabyte of the server's memory,
for good (docs/security.md, "Tenant isolation"). Here such a body is an async iterator
of pieces (at most ``DUCTOR_STREAMS_READ_PIECE_BYTES`` of payload each, read from
Postgres or the object store one at a time) wrapped in ``BudgetedBody``:

- **Backpressure.** After each piece an empty write waits until the piece has left the
  server's send buffer (uvicorn's flow control waits before every write), and the next
  piece is read only then: a reader holds about one piece of memory however large its
  body is.
- **Stall budget.** Each write, the empty ones included, must complete within
  ``stall_seconds``: a client that has not taken the last piece by then has its
  connection cut (through the connection guard's extension,
  compat/uvicorn_protocol.py), counted in ``ductor_streams_read_stall_cuts_total``.
- **End.** However the body ends (sent, cut, client gone, error), the piece source is
  closed and ``on_end`` runs once: the read's tenant slot is given back
  (runtime/tenant_reads.py).

A body of one piece keeps the fast path: it is sent whole with its Content-Length.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any

from ductor_streams.compat.uvicorn_protocol import CONNECTION_EXTENSION
from ductor_streams.foundation import heap, metrics

log = logging.getLogger(__name__)

Send = Callable[[MutableMapping[str, Any]], Any]


class BodyCut(Exception):
    """A response's body could not be read to its end: its connection was cut."""


class BudgetedBody:
    """A response body's pieces under the write budget (see the module docstring).

    Iterate it and send each piece as a body message with ``more_body`` (an ASGI
    sender, or Litestar's ``Stream``); call ``aclose`` when done, whether iterated or
    not. Without the connection guard's extension (another server, the in-process test
    client) nothing can be cut: pieces are just passed on."""

    __slots__ = (
        "_abort",
        "_closed",
        "_closing",
        "_cut",
        "_on_end",
        "_pieces",
        "_probed",
        "_route",
        "_stall_seconds",
        "_timer",
    )

    def __init__(
        self,
        pieces: AsyncIterator[bytes],
        scope: Any,
        *,
        stall_seconds: float,
        route: str,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        connection = scope.get("extensions", {}).get(CONNECTION_EXTENSION) or {}
        self._abort: Callable[[], None] | None = connection.get("abort")
        self._closing: Callable[[], bool] | None = connection.get("closing")
        self._pieces = pieces
        self._stall_seconds = stall_seconds
        self._route = route
        self._on_end = on_end
        self._timer: asyncio.TimerHandle | None = None
        self._cut = False
        self._probed = True  # no piece written yet
        self._closed = False

    def __aiter__(self) -> BudgetedBody:
        return self

    async def __anext__(self) -> bytes:
        # The consumer asks for the next piece once the last one is written.
        self._stop_clock()
        if self._closed or self._cut or (self._closing is not None and self._closing()):
            await self.aclose()
            raise StopAsyncIteration
        if not self._probed:
            # An empty write after each piece: it returns once that piece has left the
            # send buffer (uvicorn waits for its flow control before a write), so the
            # next piece is read only then, and a stalled reader holds one piece.
            self._probed = True
            self._start_clock()
            return b""
        try:
            piece = await self._pieces.__anext__()
        except StopAsyncIteration:
            await self.aclose()
            raise
        except Exception as exc:
            # The rest of the body cannot be read (the database went away, retention
            # removed the page's records): the client must see a broken response, never
            # a short one that looks whole, so the connection is cut.
            await self.aclose()
            log.warning(
                "cut a catch-up response short: its body could not be read",
                extra={"route": self._route, "error_type": type(exc).__name__},
            )
            if self._abort is not None:
                self._abort()
            raise BodyCut() from exc
        except BaseException:
            await self.aclose()
            raise
        self._probed = self._abort is None  # nothing to wait for without a guard
        self._start_clock()
        return piece

    async def aclose(self) -> None:
        """Stop: close the piece source and run ``on_end`` (once)."""
        self._stop_clock()
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._pieces, "aclose", None)
            if close is not None:
                await close()
        finally:
            if self._on_end is not None:
                self._on_end()

    def _start_clock(self) -> None:
        if self._abort is not None:
            self._timer = asyncio.get_running_loop().call_later(self._stall_seconds, self._stalled)

    def _stop_clock(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _stalled(self) -> None:
        self._timer = None
        if self._cut or self._abort is None:
            return
        self._cut = True
        metrics.READ_STALL_CUTS.labels(self._route).inc()
        log.info(
            "cut a catch-up reader that took no data",
            extra={"route": self._route, "stall_seconds": self._stall_seconds},
        )
        self._abort()
        heap.trim_soon()


async def send_pieces(send: Send, body: BudgetedBody) -> None:
    """Send ``body`` (the response has started, without a Content-Length) and end the
    response; ``body`` is closed however this ends."""
    try:
        async for piece in body:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except BodyCut:
        pass  # the response is over: its connection is cut (logged)
    finally:
        await body.aclose()
