"""The SSE response: Litestar's ``Stream`` plus a direct writer for the fan-out path.

A subscriber's records normally travel follower -> subscription buffer -> wake of the
response task -> async generator -> ASGI ``send``: one task switch per subscriber per
wake, which dominated the server's CPU with many subscribers. ``DirectWriter`` lets the
follower's fan-out write a batch itself while the response task is idle, so a plain
delivery costs one synchronous write. Under this server's own protocol
(compat/uvicorn_protocol.py) that write is the batch's chunk, framed once for every
subscriber with the same redaction, straight to the transport (``ChunkWriter``);
elsewhere it drives the ASGI ``send``. The generator keeps everything else (backfill,
gaps, overflow, keepalive, end, error) and the disconnect handling stays Litestar's (the
response task is cancelled when the client goes away).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Callable, Coroutine, Hashable, Iterable, Iterator
from typing import Any, cast

from litestar import Request
from litestar.background_tasks import BackgroundTask, BackgroundTasks
from litestar.datastructures import Cookie
from litestar.enums import MediaType
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.types import Send, TypeEncodersMap
from litestar.utils.helpers import get_enum_string_value

from ductor_streams.compat.asyncio_tasks import finish_started
from ductor_streams.compat.litestar import BodyHookedStreamingResponse
from ductor_streams.compat.uvicorn_protocol import CONNECTION_EXTENSION, ChunkWriter, chunk_frame
from ductor_streams.foundation.metrics import SSE_CHUNK_WRITES
from ductor_streams.live.events import LiveBatch
from ductor_streams.live.stats import SLOW_SUBSCRIBER_DISCONNECTS

log = logging.getLogger(__name__)

_Write = Coroutine[Any, Any, None]


class DirectWriter:
    """A subscription's ``Sink``: writes a batch's frames at once, or refuses.

    With a ``ChunkWriter`` (this server's protocol), the batch's frames go to the
    transport as one chunk, framed once per batch and ``memo_key`` (``LiveBatch.memo``:
    subscribers with another redaction have another key, so never the same bytes); it
    refuses whenever uvicorn's ``send`` would wait (flow control) or drop the write, and
    the batch takes the generator's path, whose ``send`` waits. Without one, ``send``
    is driven synchronously: it completes at once unless the server applies flow
    control. Then the rest of that one write runs in a task, later batches take the
    generator's path, and the generator awaits ``drain`` before sending anything, so
    frames never overtake each other.
    """

    def __init__(
        self,
        encode: Callable[[LiveBatch], bytes],
        *,
        max_bytes: int,
        guard: StallGuard | None = None,
        memo_key: Hashable = (),
    ) -> None:
        self._encode = encode
        self._max_bytes = max_bytes
        self._guard = guard
        # ``encode`` keeps its own frames under ``memo_key`` (a tuple of redaction
        # pointers); the framed chunk is kept beside them under a key no tuple of
        # pointers can equal (and whose b"", too large, holds for this bound only).
        self._chunk_key = ("chunk", memo_key, max_bytes)
        self._send: Send | None = None
        self._chunks: ChunkWriter | None = None
        self._inflight: asyncio.Task[None] | None = None
        self._broken = False

    def bind(self, send: Send, chunks: ChunkWriter | None = None) -> None:
        """Start writing directly (the response headers have been sent): through
        ``chunks`` when given, else through ``send``."""
        self._send = send
        self._chunks = chunks

    def __call__(self, batch: LiveBatch) -> bool:
        chunks = self._chunks
        if chunks is not None:
            # Once per subscriber per batch: the first subscriber of a key frames the
            # chunk, the others find it. (Bound with chunks, ``send`` is never used
            # directly, so nothing of it can be in flight.)
            chunk = batch.memo.get(self._chunk_key)
            if chunk is None:
                chunk = self._frame(batch)
            if chunk and chunks.write(chunk):
                SSE_CHUNK_WRITES.n += 1
                return True
            return False
        send = self._send
        if send is None or self._inflight is not None or self._broken:
            return False
        if batch.nbytes > self._max_bytes:
            # Larger writes go through the generator in pieces, so that a slow reader
            # never has more than one piece of them in the server's send buffer (and a
            # batch too large for any buffer is never encoded whole).
            return False
        body = self._encode(batch)
        if len(body) > self._max_bytes:
            return False
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
        self._inflight = asyncio.ensure_future(finish_started(cast(_Write, write), blocked_on))
        if self._guard is not None:
            self._guard.watch(self._inflight)
        return True

    def _frame(self, batch: LiveBatch) -> bytes:
        """The batch's chunk for this key, kept in its memo; b"" when it is too large
        for one write (see ``__call__``), for every subscriber of the key alike."""
        chunk = b""
        if batch.nbytes <= self._max_bytes:
            body = self._encode(batch)
            if body and len(body) <= self._max_bytes:
                chunk = chunk_frame(body)
        batch.memo[self._chunk_key] = chunk
        return chunk

    async def drain(self) -> None:
        """Wait until a direct write that had to wait for the client has finished."""
        if self._inflight is not None:
            await self._inflight
            self._inflight = None

    def cancel(self) -> None:
        """Stop writing directly (the response is ending)."""
        self._send = None
        self._chunks = None
        if self._inflight is not None:
            self._inflight.cancel()


class StallGuard:
    """Cuts the connection of a subscriber whose client accepts no data for
    ``stall_seconds`` while a write to it waits (its socket's buffer is full).

    Memory stays bounded without it (writes are chunked and buffers capped); this frees
    the connection, its task and its place in the fan-out. The client resumes with
    Last-Event-ID and loses nothing: it has every record it read.
    """

    def __init__(self, abort: Callable[[], None], stall_seconds: float) -> None:
        self._abort = abort
        self._stall_seconds = stall_seconds

    def arm(self) -> asyncio.TimerHandle:
        """Start the clock before a write that may wait; cancel the handle after it."""
        return asyncio.get_running_loop().call_later(self._stall_seconds, self._stalled)

    def watch(self, write: asyncio.Future[None]) -> None:
        """Start the clock for a write already waiting (a direct write's remainder)."""
        timer = self.arm()
        write.add_done_callback(lambda _done: timer.cancel())

    def _stalled(self) -> None:
        SLOW_SUBSCRIBER_DISCONNECTS.inc()
        log.info(
            "cut a subscriber that accepted no data", extra={"stall_seconds": self._stall_seconds}
        )
        _cut_soon(self._abort)


# Subscribers that stall together (a network blip, one client with many streams) reach
# their deadlines together: each cut ends a response (task, subscription, follower),
# and a hundred in one turn of the event loop held it ~100 ms. Cut at most this many per
# turn, so that other requests are served in between.
CUTS_PER_TURN = 8
_cuts: collections.deque[Callable[[], None]] = collections.deque()


def _cut_soon(abort: Callable[[], None]) -> None:
    _cuts.append(abort)
    if len(_cuts) == 1:
        asyncio.get_running_loop().call_soon(_cut_some)


def _cut_some() -> None:
    for _ in range(min(CUTS_PER_TURN, len(_cuts))):
        _cuts.popleft()()
    if _cuts:
        asyncio.get_running_loop().call_soon(_cut_some)


def connection_abort(scope: Any) -> Callable[[], None] | None:
    """The server's way to cut this request's connection, if it offers one."""
    connection = scope.get("extensions", {}).get(CONNECTION_EXTENSION)
    return None if connection is None else connection.get("abort")


def connection_chunks(scope: Any) -> ChunkWriter | None:
    """A ``ChunkWriter`` for this request's response, if the server offers one (its
    own protocol, compat/uvicorn_protocol.py) and the response is being sent in chunks."""
    connection = scope.get("extensions", {}).get(CONNECTION_EXTENSION)
    body_writer = None if connection is None else connection.get("body_writer")
    return None if body_writer is None else cast(ChunkWriter | None, body_writer(scope))


def pieces(frames: Iterable[bytes], max_bytes: int) -> Iterator[bytes]:
    """``frames`` as writes of at most ``max_bytes`` each: small frames joined, large
    ones sliced (a slow reader then holds one piece in the send buffer, not the frame)."""
    pending: list[bytes] = []
    size = 0
    for frame in frames:
        if size + len(frame) > max_bytes and pending:
            yield pending[0] if len(pending) == 1 else b"".join(pending)
            pending, size = [], 0
        if len(frame) > max_bytes:
            for start in range(0, len(frame), max_bytes):
                yield frame[start : start + max_bytes]
        else:
            pending.append(frame)
            size += len(frame)
    if pending:
        yield pending[0] if len(pending) == 1 else b"".join(pending)


class _ASGISseResponse(BodyHookedStreamingResponse):
    __slots__ = ("on_end", "scope", "writer")

    def __init__(
        self,
        *,
        writer: DirectWriter,
        scope: Any,
        on_end: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.writer = writer
        self.scope = scope
        self.on_end = on_end

    async def __call__(self, scope: Any, receive: Any, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # The events' generator releases what it holds when it ends; one the client
            # left before it ever started never runs its ``finally``.
            if self.on_end is not None:
                self.on_end()

    def body_starting(self, send: Send) -> None:
        self.writer.bind(send, connection_chunks(self.scope))

    def body_ended(self) -> None:
        self.writer.cancel()


class SseStream(Stream):
    """``Stream`` whose body may also be written by a ``DirectWriter``; ``on_end`` is
    called once the response has ended, however it ended."""

    def __init__(
        self,
        *args: Any,
        writer: DirectWriter,
        on_end: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.writer = writer
        self.on_end = on_end

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
            scope=request.scope,
            on_end=self.on_end,
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
