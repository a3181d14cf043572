"""GET (catch-up and long-poll) and HEAD of the DS endpoint.

A catch-up read is one page read from the offset: up to ``PAGE_RECORDS`` records and
about ``PAGE_BYTES`` of payload. Long-poll at the tail waits on the process's stream
follower (the machinery of native SSE, live/followers.py) up to the configured timeout.
Caching follows the protocol for per-user data: catch-up answers ``private, max-age=60,
stale-while-revalidate=300`` with ``Vary: Authorization`` (never ``public``: an answer
depends on the token's redaction rights) and an ETag; HEAD and ``offset=now``
``no-store``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ductor_streams import metrics
from ductor_streams.auth import Principal
from ductor_streams.errors import ClientGone, DatabaseUnavailable, InvalidInput, NotFound
from ductor_streams.http.access import egress_check, redaction_for, resolve_stream
from ductor_streams.http.disconnect import until_disconnect
from ductor_streams.http.ds import media
from ductor_streams.http.ds.front import NO_STORE, Reply, Request
from ductor_streams.http.ds.offsets import NOW, format_offset, parse_offset, response_cursor
from ductor_streams.live.events import End, Expired, Gone, Interrupted, LiveBatch
from ductor_streams.store import StreamRef, ds
from ductor_streams.store.models import Record

PAGE_RECORDS = 1000
PAGE_BYTES = 8 * 1024 * 1024
CATCH_UP_CACHE = "private, max-age=60, stale-while-revalidate=300"


async def readable_stream(
    request: Request, access_scope: str, method: str
) -> tuple[Principal, StreamRef]:
    """The caller and the stream, if the token has ``access_scope`` and may read it."""
    principal = request.authenticate(access_scope)
    ref = await resolve_stream(
        request.runtime.store, principal, request.run_id, request.stream_id, "read", method
    )
    return principal, ref


async def head(request: Request) -> Reply:
    """HEAD: the stream's media type, tail and closed state (metadata: no egress check)."""
    _, ref = await readable_stream(request, "streams:read", "HEAD")
    tail = await ds.head(request.runtime.pool, ref.stream_pk)
    headers = {
        "Content-Type": ref.definition.media_type,
        "Stream-Next-Offset": format_offset(tail.latest_sequence),
        "Cache-Control": NO_STORE,
    }
    if tail.closed:
        headers["Stream-Closed"] = "true"
    return Reply(200, headers)


async def read(request: Request) -> Reply:
    """GET without ``live=sse``: a catch-up page, or a long-poll."""
    live = request.param("live")
    if live not in (None, "long-poll"):
        raise InvalidInput("live is long-poll or sse")
    given = request.param("offset")
    offset = parse_offset(given)
    if live is not None and given is None:
        raise InvalidInput("a live read needs an offset")
    principal, ref = await readable_stream(request, "streams:read", "GET")
    settings = request.runtime.settings
    egress_check(principal, settings.region, ref)
    pool = request.runtime.pool
    mode = media.mode_of(ref.definition.media_type)
    redaction = redaction_for(principal, ref)
    cursor = request.param("cursor")
    if offset == NOW:
        tail = await ds.head(pool, ref.stream_pk)
        if live is None or tail.closed:
            return _tail_reply(ref, tail.latest_sequence, tail.closed, live is not None)
        return await _long_poll(request, principal, ref, tail.latest_sequence, mode, redaction)
    assert not isinstance(offset, str)
    page = await ds.read(pool, ref.stream_pk, offset, PAGE_RECORDS, PAGE_BYTES)
    if live is not None and not page.records:
        if page.closed:
            return _tail_reply(ref, page.latest_sequence, True, True)
        return await _long_poll(request, principal, ref, page.next_cursor, mode, redaction)
    reply = _page_reply(ref, page.records, page.latest_sequence, page.closed, mode, redaction)
    if live is not None:
        reply.headers["Stream-Cursor"] = response_cursor(cursor)
    etag = f'"{ref.stream_pk}:{given or "-1"}:{reply.headers["Stream-Next-Offset"]}'
    etag += ':c"' if "Stream-Closed" in reply.headers else '"'
    reply.headers["ETag"] = etag
    if request.header("if-none-match") == etag:
        return Reply(304, {"ETag": etag, "Cache-Control": CATCH_UP_CACHE, "Vary": "Authorization"})
    return reply


def _tail_reply(ref: StreamRef, latest: int, closed: bool, live: bool) -> Reply:
    """At the tail: ``[]`` or an empty body (200), or 204 for long-poll."""
    headers = {
        "Content-Type": ref.definition.media_type,
        "Stream-Next-Offset": format_offset(latest),
        "Stream-Up-To-Date": "true",
        "Cache-Control": NO_STORE,
    }
    if closed:
        headers["Stream-Closed"] = "true"
    if live:
        return Reply(204, headers)
    mode = media.mode_of(ref.definition.media_type)
    return Reply(200, headers, b"[]" if mode == "json" else b"")


def _page_reply(
    ref: StreamRef,
    records: Sequence[Record],
    latest: int,
    closed: bool,
    mode: media.Mode,
    redaction: list[str],
) -> Reply:
    next_cursor = records[-1].sequence if records else None
    at_tail = next_cursor is None or next_cursor >= latest
    headers = {
        "Content-Type": ref.definition.media_type,
        "Stream-Next-Offset": format_offset(latest if next_cursor is None else next_cursor),
        "Cache-Control": CATCH_UP_CACHE,
        # A browser's cache is keyed by URL: the token picks the redaction.
        "Vary": "Authorization",
    }
    if at_tail:
        headers["Stream-Up-To-Date"] = "true"
        if closed:
            headers["Stream-Closed"] = "true"
    return Reply(200, headers, media.body_of(mode, records, redaction))


async def _long_poll(
    request: Request,
    principal: Principal,
    ref: StreamRef,
    after: int,
    mode: media.Mode,
    redaction: list[str],
) -> Reply:
    """Wait at the tail (``after``) for records, up to the long-poll timeout: a live
    read of the principal's tenant while it waits (http/live_reads.py)."""
    followers = request.runtime.followers
    cursor = response_cursor(request.param("cursor"))
    live_read = request.live_read(principal)
    waiting = metrics.REQUESTS_WAITING.labels(reason="long_poll")
    try:
        subscription = await followers.subscribe(ref.stream_pk, after)
        waiting.inc()
        try:
            item = await until_disconnect(
                request.receive, subscription.next(request.runtime.settings.ds_long_poll_seconds)
            )
        except ClientGone:
            metrics.WAITS_ABANDONED.labels(reason="long_poll").inc()
            raise
        finally:
            waiting.dec()
            followers.release(ref.stream_pk, subscription)
    finally:
        if live_read is not None:
            live_read.close()
    if isinstance(item, list) and item:
        batches: list[LiveBatch] = item
        records = [r for batch in batches for r in batch.records]
        last = batches[-1]
        reply = _page_reply(ref, records, last.latest_sequence, last.closed, mode, redaction)
        reply.headers["Stream-Cursor"] = cursor
        reply.headers["Cache-Control"] = CATCH_UP_CACHE
        return reply
    if isinstance(item, Expired):
        raise item.error
    if isinstance(item, Gone):
        raise NotFound("stream does not exist")
    if isinstance(item, Interrupted):
        raise DatabaseUnavailable()
    reply = _tail_reply(ref, after, isinstance(item, End), True)
    if not isinstance(item, End):
        reply.headers["Stream-Cursor"] = cursor
    return reply
