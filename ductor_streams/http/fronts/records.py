"""The hot path's way in: append and read records without Litestar's per-request work.

Appends and reads carry nearly all of the service's requests. py-spy put about two
thirds of the server's CPU per append in the framework's layers (routing, handler
signature and parameter resolution, guard layering, response objects), far more than
the append itself (docs/speed.md, "Records front"). So ``StreamsApp`` (http/app.py) answers exactly
these two routes here, with the same guard function (``access.authenticate``), the same
core functions (``routes_records.append_answer`` / ``read_answer``) and the same problem
mapping (``problems.error_for``), and hands every other request to Litestar untouched.
The Litestar handlers stay the routes' definition (route table, OpenAPI, auth matrix)
and answer the same way; tests/speed/test_records_front.py sends the same requests
both ways and compares the answers.
"""

from __future__ import annotations

import functools
import mmap
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from ductor_streams.compat.uvicorn_protocol import note_tenant
from ductor_streams.errors import ClientGone, InvalidBody, RequestTooLarge
from ductor_streams.http.access import authenticate
from ductor_streams.http.codecs.append_body import Body
from ductor_streams.http.codecs.headers import API_HEADERS
from ductor_streams.http.codecs.problems import PROBLEM_JSON, error_for, problem_parts
from ductor_streams.http.middleware.disconnect import caller_gone
from ductor_streams.http.middleware.observe import REQUEST_ID_HEADER
from ductor_streams.http.middleware.write_budget import send_pieces
from ductor_streams.http.routes.records import (
    MAX_APPEND_BODY,
    append_answer,
    budgeted_pieces,
    read_answer,
)
from ductor_streams.names import API_MOUNT
from ductor_streams.runtime import Runtime

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# Bodies announced larger than this are read into a memory map (``_read_mapped``).
_MAPPED_BODY = 1024 * 1024

# Litestar matches a ``{name:str}`` parameter to one non-empty path segment; anything
# else (a trailing slash, another method) is left to Litestar.
RECORDS_PATH = re.compile(re.escape(API_MOUNT) + r"/runs/([^/]+)/streams/([^/]+)/records")
# The route both requests are observed as (metrics, spans: http/middleware/observe.py).
RECORDS_TEMPLATE = API_MOUNT + "/runs/{run_id}/streams/{stream_id}/records"
_JSON = b"application/json"


def records_route(scope: Scope) -> re.Match[str] | None:
    """The path's match when this front answers the request (an append or a read of
    records), else None; its groups are the run and stream ids."""
    if scope["method"] not in ("POST", "GET"):
        return None
    return RECORDS_PATH.fullmatch(scope["path"])


def is_records_request(scope: Scope) -> bool:
    """Whether this front answers the request."""
    return records_route(scope) is not None


async def answer_records(
    runtime: Runtime,
    scope: Scope,
    receive: Receive,
    send: Send,
    route: re.Match[str],
    request_id: str,
) -> int:
    """Answer an append (POST) or read (GET) of records; ``runtime`` is the process's,
    ``route`` what ``records_route`` matched, ``request_id`` what the answer echoes.
    Returns the answer's status (0: the client went away unanswered)."""
    path: str = scope["path"]
    run_id, stream_id = route.group(1), route.group(2)
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    try:
        settings = runtime.settings
        if scope["method"] == "POST":
            principal = authenticate(
                headers, run_id, "streams:write", settings.require_jwt_secret()
            )
            note_tenant(scope, principal.tenant)
            answer = await append_answer(
                runtime.store,
                principal,
                run_id,
                stream_id,
                # Called once the stream is resolved: nobody's body is read for nothing.
                functools.partial(read_body, headers, receive, MAX_APPEND_BODY),
                _first_header(headers, b"idempotency-key"),
                caller_gone(receive),
            )
        else:
            principal = authenticate(headers, run_id, "streams:read", settings.require_jwt_secret())
            note_tenant(scope, principal.tenant)
            query = _first_values(scope.get("query_string", b""))
            answer = await read_answer(
                runtime,
                principal,
                run_id,
                stream_id,
                query.get("cursor"),
                query.get("limit"),
                query.get("fingerprint"),
                caller_gone(receive),
            )
    except ClientGone:
        return 0
    except Exception as exc:  # one mapping for every error, as Litestar's handler does
        status, body, extra = problem_parts(error_for(exc, path), path)
        await _respond(send, status, _PROBLEM, body, extra, request_id)
        return status
    if answer.pieces is not None:
        # A page larger than a piece: sent a piece at a time (http/middleware/write_budget.py).
        pieces = budgeted_pieces(answer, scope, settings.read_stall_seconds)
        await send(_start(answer.status, _JSON, None, answer.headers, request_id))
        await send_pieces(send, pieces)
        return answer.status
    await _respond(send, answer.status, _JSON, answer.body, answer.headers, request_id)
    return answer.status


_PROBLEM = PROBLEM_JSON.encode()


async def _respond(
    send: Send,
    status: int,
    media_type: bytes,
    body: bytes,
    extra: dict[str, str],
    request_id: str,
) -> None:
    await send(_start(status, media_type, len(body), extra, request_id))
    await send({"type": "http.response.body", "body": body})


def _start(
    status: int,
    media_type: bytes,
    length: int | None,
    extra: dict[str, str],
    request_id: str,
) -> dict[str, Any]:
    """The response's start message; without a ``length`` the server frames the body in
    chunks."""
    response_headers = [(b"content-type", media_type)]
    if length is not None:
        response_headers.append((b"content-length", str(length).encode()))
    response_headers.extend(API_HEADERS)
    response_headers.append((REQUEST_ID_HEADER, request_id.encode("ascii")))
    response_headers.extend((k.lower().encode(), v.encode("latin-1")) for k, v in extra.items())
    return {"type": "http.response.start", "status": status, "headers": response_headers}


async def read_body(headers: list[tuple[bytes, bytes]], receive: Receive, limit: int) -> Body:
    """The whole request body, refused past ``limit`` bytes (as Litestar's Request.body)."""
    announced = _first_header(headers, b"content-length")
    if announced is not None:
        try:
            length = int(announced)
        except ValueError:
            raise InvalidBody(f"Invalid content-length: {announced!r}") from None
        if length > limit:
            raise RequestTooLarge()
        if length > _MAPPED_BODY:
            return await _read_mapped(receive, length)
    chunks: list[bytes] = []
    total = 0
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            raise ClientGone()
        chunk: bytes = event.get("body", b"")
        if chunk:
            total += len(chunk)
            if total > limit:
                raise RequestTooLarge()
            chunks.append(chunk)
        if not event.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _read_mapped(receive: Receive, length: int) -> memoryview:
    """A body of ``length`` announced bytes, each chunk copied into an anonymous memory
    map as it arrives. Joining 80 MiB of chunks at the end would be one copy of ~50 ms
    (page faults included) that holds the event loop; here the map's pages are touched
    a chunk at a time."""
    # Private: a shared anonymous map (mmap's default) is shmem, about twice as slow to
    # fill and to free.
    view = memoryview(mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE))
    received = 0
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            raise ClientGone()
        chunk: bytes = event.get("body", b"")
        if len(chunk) > length - received:
            raise InvalidBody("the body is longer than its content-length")
        view[received : received + len(chunk)] = chunk
        received += len(chunk)
        if not event.get("more_body", False):
            return view[:received]


def _first_header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _first_values(query_string: bytes) -> dict[str, str]:
    """Each query parameter's first value (Litestar's ``query_params.get``)."""
    values: dict[str, str] = {}
    for key, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        values.setdefault(key, value)
    return values
