"""The SSE response: Litestar's ``Stream`` plus a direct writer for the fan-out path.

A subscriber's records normally travel follower -> subscription buffer -> wake of the
response task -> async generator -> ASGI ``send``: one task switch per subscriber per
wake, which dominated the server's CPU with many subscribers. ``DirectWriter`` lets the
follower's fan-out call the ASGI ``send`` itself while the response task is idle, so a
plain delivery costs one synchronous write. The generator keeps everything else
(backfill, gaps, overflow, keepalive, end, error) and the disconnect handling stays
Litestar's (the response task is cancelled when the client goes away).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, cast

from litestar import Request
from litestar.background_tasks import BackgroundTask, BackgroundTasks
from litestar.datastructures import Cookie
from litestar.enums import MediaType
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Send, TypeEncodersMap
from litestar.utils.helpers import get_enum_string_value

from ductor_streams.live.events import LiveBatch

_Write = Coroutine[Any, Any, None]


class DirectWriter:
    """A subscription's ``Sink``: writes a batch's frames through the ASGI ``send``.

    ``send`` is driven synchronously: it completes at once unless the server applies
    flow control (the client reads slowly). Then the rest of that one write runs in a
    task, later batches take the generator's path, and the generator awaits ``drain``
    before sending anything, so frames never overtake each other.
    """

    def __init__(self, encode: Callable[[LiveBatch], bytes]) -> None:
        self._encode = encode
        self._send: Send | None = None
        self._inflight: asyncio.Task[None] | None = None
        self._broken = False

    def bind(self, send: Send) -> None:
        """Start writing directly (the response headers have been sent)."""
        self._send = send

    def __call__(self, batch: LiveBatch) -> bool:
        send = self._send
        if send is None or self._inflight is not None or self._broken:
            return False
        body = self._encode(batch)
        write = send({"type": "http.response.body", "body": body, "more_body": True})
        try:
            blocked_on = cast(_Write, write).send(None)
        except StopIteration:
            return True
        except BaseException:
            # Leave this and later batches to the generator, whose send raises the same
            # error through Litestar's handling.
            self._broken = True
            cast(_Write, write).close()
            return False
        self._inflight = asyncio.ensure_future(_finish(cast(_Write, write), blocked_on))
        return True

    async def drain(self) -> None:
        """Wait until a direct write that had to wait for the client has finished."""
        if self._inflight is not None:
            await self._inflight
            self._inflight = None

    def cancel(self) -> None:
        """Stop writing directly (the response is ending)."""
        self._send = None
        if self._inflight is not None:
            self._inflight.cancel()


async def _finish(write: _Write, blocked_on: Any) -> None:
    """Drive a started ``send`` coroutine to its end, as a task would have."""
    try:
        while True:
            if isinstance(blocked_on, asyncio.Future):
                blocked_on._asyncio_future_blocking = False
                await asyncio.wait([blocked_on])
            else:
                await asyncio.sleep(0)
            blocked_on = write.send(None)
    except StopIteration:
        pass
    finally:
        write.close()


class _ASGISseResponse(ASGIStreamingResponse):
    __slots__ = ("writer",)

    def __init__(self, *, writer: DirectWriter, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.writer = writer

    async def _stream(self, send: Send) -> None:
        self.writer.bind(send)
        try:
            await super()._stream(send)
        finally:
            self.writer.cancel()


class SseStream(Stream):
    """``Stream`` whose body may also be written by a ``DirectWriter``."""

    def __init__(self, *args: Any, writer: DirectWriter, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writer = writer

    def to_asgi_response(
        self,
        app: Any,
        request: Request[Any, Any, Any],
        *,
        background: BackgroundTask | BackgroundTasks | None = None,
        cookies: Iterable[Cookie] | None = None,
        encoded_headers: Iterable[tuple[bytes, bytes]] | None = None,
        headers: dict[str, str] | None = None,
        is_head_response: bool = False,
        media_type: MediaType | str | None = None,
        status_code: int | None = None,
        type_encoders: TypeEncodersMap | None = None,
    ) -> ASGIResponse:
        # As Stream.to_asgi_response (without its deprecated ``app``), with our class.
        headers = {**headers, **self.headers} if headers is not None else self.headers
        cookies = self.cookies if cookies is None else itertools.chain(self.cookies, cookies)
        return _ASGISseResponse(
            writer=self.writer,
            background=self.background or background,
            content_length=0,
            cookies=cookies,
            encoded_headers=encoded_headers,
            encoding=self.encoding,
            headers=headers,
            is_head_response=is_head_response,
            iterator=self.iterator,
            media_type=get_enum_string_value(media_type or self.media_type or MediaType.JSON),
            status_code=self.status_code or status_code,
        )
