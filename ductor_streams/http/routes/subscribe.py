"""Subscribe: ``GET .../subscribe`` as Server-Sent Events, on top of ``live.Followers``.

Cursor problems (400/410) are ordinary problem responses because the subscription's
first read happens before the response starts. Then: ``record`` events (``id`` = the
sequence), ``: keepalive`` comments while idle, and ``end`` after close or ``error``
(the 410 body) when retention overtakes the subscriber, after which the response ends.
The response also ends with ``event: reconnect`` when the server shuts down
(``"reason":"server_shutdown"``, with ``retry: 1000``) and when the caller's token
expires (``"reason":"token_expired"``): a stream never outlives the token that opened it.

For a reader without redaction, the backfill's (and any catch-up's) pages are written by
Postgres as these record events, one string per page (store/read_frames.py): the same
bytes ``_record_frames`` writes, for a fraction of the server's CPU.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from functools import partial
from typing import Any

import jwt
import msgspec
from litestar import Litestar, Request, get

from ductor_streams.errors import InvalidCursor
from ductor_streams.foundation import metrics
from ductor_streams.http.access import check_egress, principal_of, redaction_for, stream_for
from ductor_streams.http.codecs.json_bodies import encode_record
from ductor_streams.http.codecs.params import parse_cursor
from ductor_streams.http.codecs.problems import problem_response
from ductor_streams.http.codecs.sse_response import (
    DirectWriter,
    SseStream,
    StallGuard,
    connection_abort,
    pieces,
)
from ductor_streams.http.middleware.live_reads import LiveRead, LiveReads
from ductor_streams.http.routes.streams import STREAM
from ductor_streams.http.state import runtime_in
from ductor_streams.live.events import Draining, End, Expired, LiveBatch, TokenExpired
from ductor_streams.live.followers import Followers
from ductor_streams.live.subscription import Subscription
from ductor_streams.store.fingerprint import parse_fingerprint
from ductor_streams.store.read_frames import FramedPage

KEEPALIVE = b": keepalive\n\n"
# The last frame of a response ended by this server's shutdown: `retry` tells an
# EventSource to reconnect after a second (with Last-Event-ID), the event says why.
RECONNECT = b'event: reconnect\nretry: 1000\ndata: {"reason":"server_shutdown"}\n\n'
# The last frame of a response whose bearer token expired: the client reconnects with a
# fresh token (an EventSource's own reconnect with the old one gets 401).
TOKEN_EXPIRED = b'event: reconnect\ndata: {"reason":"token_expired"}\n\n'
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def followers_of(app: Litestar) -> Followers:
    """The process's live delivery (its runtime's followers, ductor_streams/runtime/__init__.py)."""
    return runtime_in(app.state).followers


def live_reads_of(app: Litestar) -> LiveReads | None:
    """The app's count of live reads per tenant (http/middleware/live_reads.py), if it keeps one."""
    live_reads: LiveReads | None = getattr(app, "live_reads", None)
    return live_reads


def subscribe_cursor(request: Request[Any, Any, Any]) -> int:
    """``Last-Event-ID`` when present (it wins), else ``?cursor=``, else 0."""
    last_event_id = request.headers.get("last-event-id")
    if last_event_id is not None:
        if not last_event_id.strip():
            raise InvalidCursor("Last-Event-ID must be a non-negative integer")
        return parse_cursor(last_event_id)
    return parse_cursor(request.query_params.get("cursor"))


@get(STREAM + "/subscribe", opt={"scope": "streams:read"}, media_type="text/event-stream")
async def subscribe(request: Request[Any, Any, Any]) -> SseStream:
    """Follow the stream live from the cursor, as Server-Sent Events; with
    ``fingerprint`` (of the record at the cursor), 409 ``history_diverged`` unless the
    stream's record there matches."""
    cursor = subscribe_cursor(request)
    fingerprint = parse_fingerprint(request.query_params.get("fingerprint"), cursor)
    ref = await stream_for(request, "read")
    check_egress(request, ref)
    principal = principal_of(request)
    redaction = redaction_for(principal, ref)
    followers = followers_of(request.app)
    # A live read of the tenant until the response ends (http/middleware/live_reads.py): given back
    # by the events' end, or by the response if they never start.
    live_reads = live_reads_of(request.app)
    live_read = None if live_reads is None else live_reads.enter(principal.tenant)
    try:
        # Without redaction, Postgres writes the backfill's record events
        # (store/read_frames.py).
        subscription = await followers.subscribe(
            ref.stream_pk, cursor, sse_frames=not redaction, fingerprint=fingerprint
        )
    except BaseException:
        if live_read is not None:
            live_read.close()
        raise
    live = followers.settings
    abort = connection_abort(request.scope)
    guard = StallGuard(abort, live.stall_seconds) if abort is not None else None
    writer = DirectWriter(
        partial(_record_frames, redaction=redaction, memo_key=tuple(redaction)),
        max_bytes=live.write_chunk,
        guard=guard,
        memo_key=tuple(redaction),
    )
    events = _events(
        followers,
        ref.stream_pk,
        subscription,
        redaction,
        writer,
        instance=request.scope.get("path"),
        token_expires_at=_token_expiry(request),
        guard=guard,
        live_read=live_read,
    )
    return SseStream(
        events,
        media_type="text/event-stream",
        headers=SSE_HEADERS,
        writer=writer,
        on_end=None if live_read is None else live_read.close,
    )


async def _events(
    followers: Followers,
    stream_pk: int,
    subscription: Subscription,
    redaction: list[str],
    writer: DirectWriter,
    *,
    instance: str | None,
    token_expires_at: float | None,
    guard: StallGuard | None,
    live_read: LiveRead | None,
) -> AsyncIterator[bytes]:
    keepalive = followers.settings.keepalive_seconds
    chunk = followers.settings.write_chunk
    memo_key = tuple(redaction)
    metrics.SUBSCRIBERS.inc()
    subscription.attach_sink(writer)
    expiry: asyncio.TimerHandle | None = None
    if token_expires_at is not None:
        # A plain read with this token gets 401 from its exp on: so does the stream.
        loop = asyncio.get_running_loop()
        delay = max(0.0, token_expires_at - time.time())
        expiry = loop.call_at(loop.time() + delay, subscription.token_expired)
    try:
        while True:
            item = await subscription.next(keepalive)
            # A direct write that had to wait for the client goes out before this item.
            await writer.drain()
            if item is None:
                stall = guard.arm() if guard is not None else None
                yield KEEPALIVE
                if stall is not None:
                    stall.cancel()
            elif isinstance(item, list | FramedPage):
                frames: Iterable[bytes]
                if isinstance(item, FramedPage):
                    # A backfill page as one string: sliced only past the write bound.
                    metrics.SSE_EVENTS.n += item.count
                    frames = (item.frames,)
                else:
                    metrics.SSE_EVENTS.n += sum(len(batch.records) for batch in item)
                    frames = (_record_frames(batch, redaction, memo_key) for batch in item)
                for piece in pieces(frames, chunk):
                    stall = guard.arm() if guard is not None else None
                    yield piece
                    if stall is not None:
                        stall.cancel()
            else:
                if isinstance(item, End):
                    data = msgspec.json.encode({"last_sequence": item.last_sequence})
                    yield b"event: end\ndata: " + data + b"\n\n"
                elif isinstance(item, Draining):
                    yield RECONNECT
                elif isinstance(item, TokenExpired):
                    yield TOKEN_EXPIRED
                elif isinstance(item, Expired):
                    body = problem_response(item.error, instance).content
                    yield b"event: error\ndata: " + bytes(body) + b"\n\n"
                return
    finally:
        # Runs on normal end and when the client goes away (the generator is cancelled).
        if expiry is not None:
            expiry.cancel()
        metrics.SUBSCRIBERS.dec()
        writer.cancel()
        followers.release(stream_pk, subscription)
        if live_read is not None:
            live_read.close()


def _token_expiry(request: Request[Any, Any, Any]) -> float | None:
    """The ``exp`` of the request's bearer token (the guard has verified it)."""
    _scheme, _, token = request.headers.get("authorization", "").partition(" ")
    try:
        exp = jwt.decode(token.strip(), options={"verify_signature": False}).get("exp")
    except jwt.PyJWTError:
        return None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def _record_frames(batch: LiveBatch, redaction: list[str], memo_key: tuple[str, ...]) -> bytes:
    # Every subscriber of this process shares the batch: encode it once per redaction.
    # records_read_sse_frames writes the same bytes in SQL; a change of the format here
    # is a change there (tests/speed/test_sse_frames.py compares the two).
    frames = batch.memo.get(memo_key)
    if frames is None:
        frames = b"".join(
            b"event: record\nid: %d\ndata: %s\n\n" % (r.sequence, encode_record(r, redaction))
            for r in batch.records
        )
        batch.memo[memo_key] = frames
    return frames


ROUTES = [subscribe]
