"""Definitions and stream lifecycle: create, read, close, legal hold."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, post, put

from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.http.access import principal_of, stream_for
from ductor_streams.http.codecs.json_bodies import json_body, json_response
from ductor_streams.http.state import runtime_of

# The API's mount point; route paths below are relative to it.
from ductor_streams.store import StreamKey

RUN = "/runs/{run_id:str}"
STREAM = RUN + "/streams/{stream_id:str}"


@post(RUN + "/streams", opt={"scope": "streams:admin"}, status_code=201)
async def create_stream(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Create a stream definition; the same body again answers 200, another body 409."""
    settings = runtime_of(request).settings
    definition = parse_definition(
        await json_body(request),
        region=settings.region,
        object_store_regions=settings.object_store_regions,
    )
    store = runtime_of(request).store
    key = StreamKey(
        principal_of(request).tenant, request.path_params["run_id"], definition.stream_id
    )
    ref, created = await store.create_stream(key, definition)
    state = await store.state(ref)
    return json_response(
        {"definition": ref.definition.to_json_dict(), "state": state.to_json_dict()},
        status_code=201 if created else 200,
    )


@get(STREAM, opt={"scope": "streams:read"})
async def read_stream(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The definition and the current state (metadata: not egress-checked)."""
    ref = await stream_for(request, "read")
    state = await runtime_of(request).store.state(ref)
    return json_response(
        {"definition": ref.definition.to_json_dict(), "state": state.to_json_dict()}
    )


@post(STREAM + "/close", opt={"scope": "streams:admin"}, status_code=200)
async def close_stream(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Close the stream; closing again answers the same."""
    ref = await stream_for(request, "admin")
    last = await runtime_of(request).store.close(ref)
    return json_response({"closed": True, "last_sequence": last})


class LegalHoldBody(msgspec.Struct, forbid_unknown_fields=True):
    enabled: bool
    reason: str | None = None


@put(STREAM + "/legal-hold", opt={"scope": "streams:admin"}, status_code=200)
async def put_legal_hold(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Turn legal hold on or off; while on, nothing of the stream is pruned or deleted."""
    body: LegalHoldBody = await json_body(request, LegalHoldBody)
    ref = await stream_for(request, "admin")
    state = await runtime_of(request).store.set_legal_hold(ref, body.enabled, body.reason)
    return json_response(state.to_json_dict())


ROUTES = [create_stream, read_stream, close_stream, put_legal_hold]
