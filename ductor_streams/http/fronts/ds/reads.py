"""GET (catch-up and long-poll) and HEAD of the DS endpoint.

A catch-up read is one page read from the offset: up to ``PAGE_RECORDS`` records and
about ``PAGE_BYTES`` of payload. Long-poll at the tail waits on the process's stream
follower (the machinery of native SSE, live/followers.py) up to the configured timeout.
Caching follows the protocol for per-user data: catch-up answers ``private, max-age=60,
stale-while-revalidate=300`` with ``Vary: Authorization`` (never ``public``: an answer
depends on the token's redaction rights) and an ETag that differs per redaction view
and names no internal key (http/codecs/etags.py); HEAD and ``offset=now`` ``no-store``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import asyncpg

from ductor_streams.auth import Principal
from ductor_streams.errors import ClientGone, DatabaseUnavailable, InvalidInput, NotFound
from ductor_streams.foundation import metrics
from ductor_streams.http.access import egress_check, redaction_for, resolve_stream
from ductor_streams.http.codecs.etags import catch_up_etag
from ductor_streams.http.codecs.record_pages import check_dense
from ductor_streams.http.fronts.ds import media
from ductor_streams.http.fronts.ds.offsets import NOW, format_offset, parse_offset, response_cursor
from ductor_streams.http.fronts.ds.protocol import NO_STORE, Reply, Request
from ductor_streams.http.middleware.disconnect import caller_gone, until_disconnect
from ductor_streams.live.events import End, Expired, Gone, Interrupted, LiveBatch
from ductor_streams.store import StreamRef, ds
from ductor_streams.store.models import Record
from ductor_streams.store.read import read_range

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
    """GET without ``live=sse``: a catch-up page, or a long-poll.

    A read from an offset takes one of its tenant's read slots (runtime/tenant_reads.py: 429
    ``too_many_reads`` when none comes free in time), held until its body is written; a
    long-poll gives it back before it waits at the tail. A page larger than
    ``DUCTOR_STREAMS_READ_PIECE_BYTES`` is read and sent a piece at a time
    (http/middleware/write_budget.py)."""
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
    slot = await request.runtime.reads.admit(principal.tenant, caller_gone(request.receive))
    try:
        page = await ds.read(
            pool, ref.stream_pk, offset, PAGE_RECORDS, PAGE_BYTES, settings.read_piece_bytes
        )
        reply = None
        if live is None or page.first.records:
            reply = _catch_up_reply(request, ref, page, given, mode, redaction, live, cursor)
    except BaseException:
        slot.release()
        raise
    if reply is not None and reply.pieces is not None:
        reply.release = slot.release  # held until the body is written
        return reply
    slot.release()
    if reply is not None:
        return reply
    # A long-poll at the tail waits without a slot.
    first = page.first
    if first.closed:
        return _tail_reply(ref, first.latest_sequence, True, True)
    return await _long_poll(request, principal, ref, first.next_cursor, mode, redaction)


def _catch_up_reply(
    request: Request,
    ref: StreamRef,
    page: ds.CatchUpPage,
    given: str | None,
    mode: media.Mode,
    redaction: list[str],
    live: str | None,
    cursor: str | None,
) -> Reply:
    """The reply of a page that holds records (or of an empty catch-up page)."""
    first, page_last = page.first, page.page_last
    reply = _page_reply(
        ref, first.records, first.latest_sequence, first.closed, mode, redaction, page_last
    )
    if live is not None:
        reply.headers["Stream-Cursor"] = response_cursor(cursor)
    etag = catch_up_etag(
        request.runtime.settings.require_jwt_secret(),
        ref.stream_pk,
        offset=given or "-1",
        first_sequence=first.records[0].sequence if first.records else None,
        next_offset=reply.headers["Stream-Next-Offset"],
        closed="Stream-Closed" in reply.headers,
        redaction=redaction,
    )
    reply.headers["ETag"] = etag
    if request.header("if-none-match") == etag:
        return Reply(304, {"ETag": etag, "Cache-Control": CATCH_UP_CACHE, "Vary": "Authorization"})
    if page_last is not None and first.next_cursor < page_last:
        # Larger than a piece: the rest is read as it is sent.
        reply.pieces = _pieces(
            request.runtime.pool,
            ref.stream_pk,
            mode,
            redaction,
            reply.body,
            len(first.records),
            first.next_cursor,
            page_last,
            request.runtime.settings.read_piece_bytes,
        )
        reply.body = b""
    return reply


async def _pieces(
    pool: asyncpg.Pool,
    stream_pk: int,
    mode: media.Mode,
    redaction: list[str],
    start: bytes,
    span: int,
    last: int,
    page_last: int,
    piece_bytes: int,
) -> AsyncIterator[bytes]:
    """``start`` (the body's start and first piece of ``span`` records, up to ``last``),
    each later piece up to ``page_last``, the body's end (http/codecs/record_pages.py reads a
    native page alike: no piece stays referenced here once yielded)."""
    state = [last, span]
    first = [start]
    del start
    yield first.pop()
    while state[0] < page_last:
        yield await _piece(pool, stream_pk, mode, redaction, state, page_last, piece_bytes)
    end_bytes = media.body_end(mode)
    if end_bytes:
        yield end_bytes


async def _piece(
    pool: asyncpg.Pool,
    stream_pk: int,
    mode: media.Mode,
    redaction: list[str],
    state: list[int],
    page_last: int,
    piece_bytes: int,
) -> bytes:
    """The records after ``state[0]`` within ``piece_bytes``, encoded (``body_more``);
    ``state`` (the last sequence sent, the last piece's records) moves on past them."""
    after, span = state
    # The query's range ends two pieces' worth of records on (at the last piece's rate):
    # its scan stops there, and its byte budget ends the piece.
    end = min(page_last, after + 2 * span)
    records = await read_range(pool, stream_pk, after, end, piece_bytes)
    check_dense(after, len(records), records[-1].sequence if records else after)
    state[:] = [records[-1].sequence, len(records)]
    return media.body_more(mode, records, redaction)


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
    page_last: int | None = None,
) -> Reply:
    """The reply of a page of ``records``, or of its first piece when the page goes on
    to ``page_last`` (the reply's body is then the start of the page's, http/fronts/ds/media.py
    ``body_start``)."""
    if page_last is None:
        next_cursor = records[-1].sequence if records else None
    else:
        next_cursor = page_last
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
    if page_last is not None and records and records[-1].sequence < page_last:
        return Reply(200, headers, media.body_start(mode, records, redaction))
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
    read of the principal's tenant while it waits (http/middleware/live_reads.py)."""
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
