"""Append and read records."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, post

from ductor_streams.http.access import check_egress, may_see_unredacted, stream_for
from ductor_streams.http.codec import json_body, json_response, page_json
from ductor_streams.http.params import parse_cursor, parse_limit
from ductor_streams.http.routes_streams import STREAM
from ductor_streams.store import encode_batch

# 1,000 records of 64 KiB, with room for JSON escapes in the request's own encoding.
MAX_APPEND_BODY = 80 * 1024 * 1024


class AppendRecord(msgspec.Struct, forbid_unknown_fields=True):
    payload: Any


class AppendBody(msgspec.Struct, forbid_unknown_fields=True):
    records: list[AppendRecord]


@post(
    STREAM + "/records",
    opt={"scope": "streams:write"},
    status_code=201,
    request_max_body_size=MAX_APPEND_BODY,
)
async def append_records(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Append 1 to 1,000 records atomically; ``Idempotency-Key`` makes retries safe."""
    body: AppendBody = await json_body(request, AppendBody)
    batch = encode_batch(
        [r.payload for r in body.records],
        idempotency_key=request.headers.get("idempotency-key"),
    )
    ref = await stream_for(request, "write")
    result = await request.app.state.store.append(ref, batch)
    answer = {"first_sequence": result.first_sequence, "last_sequence": result.last_sequence}
    if result.replayed:
        return json_response(answer, 200, headers={"Idempotent-Replayed": "true"})
    return json_response(answer, 201)


@get(STREAM + "/records", opt={"scope": "streams:read"})
async def read_records(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Records with ``sequence > cursor``, ascending, at most ``limit``."""
    cursor = parse_cursor(request.query_params.get("cursor"))
    limit = parse_limit(request.query_params.get("limit"))
    ref = await stream_for(request, "read")
    check_egress(request, ref)
    page = await request.app.state.store.read(ref, cursor, limit)
    redaction = [] if may_see_unredacted(request) else ref.definition.redaction.json_pointers
    return json_response(page_json(page, redaction))


ROUTES = [append_records, read_records]
