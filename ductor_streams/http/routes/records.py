"""Append and read records.

Each route is a Litestar handler (the route table, guard and OpenAPI see it) over a core
function that takes plain values and returns an ``Answer``. The hot-path front
(``http/fronts/records.py``) calls the same core functions without Litestar's per-request
machinery, so both ways in answer alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from litestar import Request, Response, get, post
from litestar.response import Stream

from ductor_streams.auth import Principal
from ductor_streams.http.access import egress_check, principal_of, redaction_for, resolve_stream
from ductor_streams.http.codecs.append_body import (
    AppendBody as AppendBody,  # for http/routes/openapi.py
)
from ductor_streams.http.codecs.append_body import Body, decode_append_body
from ductor_streams.http.codecs.json_bodies import encode_json
from ductor_streams.http.codecs.params import parse_cursor, parse_limit
from ductor_streams.http.codecs.record_pages import page_body
from ductor_streams.http.middleware.disconnect import caller_gone
from ductor_streams.http.middleware.write_budget import BudgetedBody
from ductor_streams.http.routes.streams import STREAM
from ductor_streams.http.state import runtime_of
from ductor_streams.runtime import Runtime
from ductor_streams.store import Store
from ductor_streams.store.fingerprint import parse_fingerprint
from ductor_streams.store.gone import CallerGone

# 1,000 records of 64 KiB, with room for JSON escapes in the request's own encoding.
MAX_APPEND_BODY = 80 * 1024 * 1024


@dataclass(frozen=True)
class Answer:
    """A JSON response: status, encoded body and extra headers; or, for a page larger than
    a piece, its ``pieces`` (``body`` is then empty), sent under the write budget
    (http/middleware/write_budget.py) with ``release`` run when they are done."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    pieces: AsyncIterator[bytes] | None = None
    release: Callable[[], None] | None = None

    def to_response(self) -> Response[bytes]:
        return Response(
            content=self.body,
            status_code=self.status,
            media_type="application/json",
            headers=self.headers or None,
        )


async def append_answer(
    store: Store,
    principal: Principal,
    run_id: str,
    stream_id: str,
    read_body: Callable[[], Awaitable[Body]],
    idempotency_key: str | None,
    caller_gone: CallerGone | None = None,
) -> Answer:
    """Append the body's records (already authenticated with ``streams:write``).

    The stream is resolved (403/404) before ``read_body`` is called: a body is read and
    decoded only for a caller who may append to a stream that exists, and decoded
    without stalling the event loop (``append_body``). ``caller_gone`` ends a wait for
    credit when the client goes (ClientGone: nothing more is done, nobody answered)."""
    ref = await resolve_stream(store, principal, run_id, stream_id, "write", "POST")
    batch = await decode_append_body(await read_body(), idempotency_key)
    result = await store.append(ref, batch, caller_gone=caller_gone)
    answer = encode_json(
        {"first_sequence": result.first_sequence, "last_sequence": result.last_sequence}
    )
    if result.replayed:
        return Answer(200, answer, {"Idempotent-Replayed": "true"})
    return Answer(201, answer)


async def read_answer(
    runtime: Runtime,
    principal: Principal,
    run_id: str,
    stream_id: str,
    cursor: str | None,
    limit: str | None,
    fingerprint: str | None = None,
    caller_gone: CallerGone | None = None,
) -> Answer:
    """A page of records after ``cursor`` (already authenticated with ``streams:read``).

    Once the stream is resolved and its egress allowed, the read takes one of its
    tenant's read slots (runtime/tenant_reads.py: 429 ``too_many_reads`` when none comes free in
    time), held until the body is written. Without redaction Postgres writes the
    records' JSON (``store.read.read_page_text``): profiled, building and encoding a
    Python object per record and field took over half the server's time of a catch-up
    read. A page with an object reference, or a reader with redaction, is read and
    encoded record by record. A page larger than ``DUCTOR_STREAMS_READ_PIECE_BYTES`` is
    read and sent a piece at a time (http/codecs/record_pages.py).

    ``fingerprint`` (the ``fingerprint=`` parameter: the record the reader saw at the
    cursor) makes the read 409 ``history_diverged`` when the stored record differs.
    ``caller_gone`` ends a wait for a read slot when the client goes (ClientGone)."""
    after = parse_cursor(cursor)
    count = parse_limit(limit)
    seen = parse_fingerprint(fingerprint, after)
    store = runtime.store
    settings = runtime.settings
    ref = await resolve_stream(store, principal, run_id, stream_id, "read", "GET")
    egress_check(principal, settings.region, ref)
    redaction = redaction_for(principal, ref)
    slot = await runtime.reads.admit(principal.tenant, caller_gone)
    try:
        body, pieces = await page_body(
            store, ref, redaction, after, count, settings.read_piece_bytes, seen
        )
    except BaseException:
        slot.release()
        raise
    if pieces is None:
        slot.release()
        return Answer(200, body)
    return Answer(200, b"", pieces=pieces, release=slot.release)


def budgeted_pieces(answer: Answer, scope: Any, stall_seconds: float) -> BudgetedBody:
    """The pieces of a page answer under the write budget (http/middleware/write_budget.py)."""
    assert answer.pieces is not None
    return BudgetedBody(
        answer.pieces, scope, stall_seconds=stall_seconds, route="records", on_end=answer.release
    )


@post(
    STREAM + "/records",
    opt={"scope": "streams:write"},
    status_code=201,
    request_max_body_size=MAX_APPEND_BODY,
)
async def append_records(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Append 1 to 1,000 records atomically; ``Idempotency-Key`` makes retries safe."""
    answer = await append_answer(
        runtime_of(request).store,
        principal_of(request),
        request.path_params["run_id"],
        request.path_params["stream_id"],
        request.body,
        request.headers.get("idempotency-key"),
        caller_gone(request.receive),
    )
    return answer.to_response()


@get(STREAM + "/records", opt={"scope": "streams:read"})
async def read_records(request: Request[Any, Any, Any]) -> Response[Any]:
    """Records with ``sequence > cursor``, ascending, at most ``limit``; with
    ``fingerprint``, 409 ``history_diverged`` unless the record at the cursor matches."""
    runtime = runtime_of(request)
    answer = await read_answer(
        runtime,
        principal_of(request),
        request.path_params["run_id"],
        request.path_params["stream_id"],
        request.query_params.get("cursor"),
        request.query_params.get("limit"),
        request.query_params.get("fingerprint"),
        caller_gone(request.receive),
    )
    if answer.pieces is None:
        return answer.to_response()
    return Stream(
        budgeted_pieces(answer, request.scope, runtime.settings.read_stall_seconds),
        status_code=answer.status,
        media_type="application/json",
    )


ROUTES = [append_records, read_records]
