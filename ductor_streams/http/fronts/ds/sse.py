"""``live=sse`` of the DS endpoint: the protocol's framing over the stream follower.

The subscription is native SSE's (live/followers.py: registered before its first read,
gaps repaired, duplicates dropped), only the frames differ: every ``event: data``
(a JSON array for JSON streams, the text for ``text/*``, base64 for other types, with
``stream-sse-data-encoding: base64``) is followed by an ``event: control`` carrying
``streamNextOffset``, ``streamCursor``, ``upToDate`` and, at the end of a closed
stream, ``streamClosed``, after which the response ends. Every data line is prefixed
``data:``, and carriage returns and line feeds split lines, so no payload can inject an
event. The response also ends after ``ds_sse_seconds`` (the client reconnects from its
last ``streamNextOffset``), when the token expires, when the server shuts down, and when
retention overtakes the reader: DS has no error event, so its reconnect gets the 410.
As in native SSE, a client that accepts no data for ``sse_stall_seconds`` is cut, and
large frames are written in pieces.
"""

from __future__ import annotations

import asyncio
import base64
import re
import time

import jwt
import msgspec

from ductor_streams.errors import ClientGone, InvalidInput
from ductor_streams.foundation import metrics
from ductor_streams.http.access import egress_check, redaction_for
from ductor_streams.http.codecs.sse_response import StallGuard, connection_abort, pieces
from ductor_streams.http.fronts.ds import media
from ductor_streams.http.fronts.ds.offsets import NOW, format_offset, parse_offset, response_cursor
from ductor_streams.http.fronts.ds.protocol import Request, Send, response_start
from ductor_streams.http.fronts.ds.reads import readable_stream
from ductor_streams.http.middleware.disconnect import until_disconnect
from ductor_streams.live.events import End, LiveBatch
from ductor_streams.store import StreamRef, ds

_LINES = re.compile(r"\r\n|\r|\n")


async def stream(request: Request, send: Send) -> None:
    """Answer a ``live=sse`` read; errors before the response starts propagate (the
    caller answers them as problems), after it they end the response."""
    given = request.param("offset")
    if given is None:
        raise InvalidInput("a live read needs an offset")
    offset = parse_offset(given)
    principal, ref = await readable_stream(request, "streams:read", "GET")
    egress_check(principal, request.runtime.settings.region, ref)
    redaction = redaction_for(principal, ref)
    mode = media.mode_of(ref.definition.media_type)
    # A live read of the tenant from here to the response's end (http/middleware/live_reads.py).
    live_read = request.live_read(principal)
    try:
        await _stream(request, send, ref, offset, mode, redaction)
    finally:
        if live_read is not None:
            live_read.close()


async def _stream(
    request: Request,
    send: Send,
    ref: StreamRef,
    offset: int | str | None,
    mode: media.Mode,
    redaction: list[str],
) -> None:
    """The response after the checks (``stream``)."""
    runtime = request.runtime
    if offset == NOW or offset is None:
        tail = await ds.head(runtime.pool, ref.stream_pk)
        after = tail.latest_sequence if offset == NOW else tail.earliest_sequence - 1
    else:
        assert not isinstance(offset, str)
        after = offset
    followers = runtime.followers
    subscription = await followers.subscribe(ref.stream_pk, after)
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    headers["X-Accel-Buffering"] = "no"
    if mode == "bytes":
        headers["stream-sse-data-encoding"] = "base64"
    client_cursor = request.param("cursor")
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + _lifetime(request, runtime.settings.ds_sse_seconds)
    keepalive = followers.settings.keepalive_seconds
    # As native SSE: a client that accepts no data for stall_seconds is cut, and large
    # frames go out in pieces (a slow reader holds one in the server's send buffer).
    abort = connection_abort(request.scope)
    guard = StallGuard(abort, followers.settings.stall_seconds) if abort is not None else None
    chunk = followers.settings.write_chunk

    async def write(frames: bytes) -> None:
        for piece in pieces((frames,), chunk):
            stall = guard.arm() if guard is not None else None
            try:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            finally:
                if stall is not None:
                    stall.cancel()

    metrics.SUBSCRIBERS.inc()
    try:
        await send(response_start(200, headers, None))
        last = after
        item = await until_disconnect(request.receive, subscription.next(0))
        if item is None:
            # At the tail: say so at once (upToDate), then wait.
            await write(_control(last, client_cursor, up_to_date=True, closed=False))
        while True:
            if isinstance(item, list):
                records = [r for batch in item for r in batch.records]
                if records:
                    last = records[-1].sequence
                final: LiveBatch = item[-1]
                at_tail = last >= final.latest_sequence
                closed = at_tail and final.closed
                frames = _data(mode, records, redaction) if records else b""
                frames += _control(last, client_cursor, up_to_date=at_tail, closed=closed)
                await write(frames)
                if closed:
                    break
            elif isinstance(item, End):
                await write(_control(last, client_cursor, up_to_date=True, closed=True))
                break
            elif item is not None:
                break  # expired, gone, draining, token expired, database away
            remaining = ends_at - loop.time()
            if remaining <= 0:
                break
            item = await until_disconnect(
                request.receive, subscription.next(min(keepalive, remaining))
            )
            if item is None:
                if loop.time() >= ends_at:
                    break
                await write(_control(last, client_cursor, up_to_date=True, closed=False))
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except ClientGone:
        pass
    finally:
        metrics.SUBSCRIBERS.dec()
        followers.release(ref.stream_pk, subscription)


def _lifetime(request: Request, seconds: float) -> float:
    """``seconds``, or less when the bearer token expires sooner."""
    _, _, token = (request.header("authorization") or "").partition(" ")
    try:
        exp = jwt.decode(token.strip(), options={"verify_signature": False}).get("exp")
    except jwt.PyJWTError:
        return seconds
    if isinstance(exp, int | float) and not isinstance(exp, bool):
        return max(0.0, min(seconds, float(exp) - time.time()))
    return seconds


def _data(mode: media.Mode, records: list, redaction: list[str]) -> bytes:  # type: ignore[type-arg]
    if mode == "json":
        text = b"[" + b",".join(media.json_texts(records, redaction)) + b"]"
        return b"event: data\ndata:" + text + b"\n\n"
    raw = b"".join(media.chunks_of(mode, records))
    if mode == "bytes":
        return b"event: data\ndata:" + base64.b64encode(raw) + b"\n\n"
    lines = _LINES.split(raw.decode("utf-8", errors="replace"))
    return b"event: data\n" + "".join(map(_data_line, lines)).encode() + b"\n"


def _data_line(line: str) -> str:
    # A reader drops one space after "data:": a line that starts with one gets another.
    return f"data: {line}\n" if line.startswith(" ") else f"data:{line}\n"


def _control(last: int, client_cursor: str | None, *, up_to_date: bool, closed: bool) -> bytes:
    control: dict[str, object] = {"streamNextOffset": format_offset(last)}
    if closed:
        control["streamClosed"] = True
        control["upToDate"] = True
    else:
        control["streamCursor"] = response_cursor(client_cursor)
        if up_to_date:
            control["upToDate"] = True
    return b"event: control\ndata:" + msgspec.json.encode(control) + b"\n\n"
