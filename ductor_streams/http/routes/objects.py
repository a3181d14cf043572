"""Large objects: prepare, upload (PUT content), commit, abort, state, download.

The routes only translate; ``objects.intents.ObjectService`` does the work. Uploads are
streamed (``request.stream()``), never read whole into memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Response, get, post, put
from litestar.exceptions import HTTPException
from litestar.response import Stream

from ductor_streams.errors import ObjectEvidenceMismatch
from ductor_streams.http.access import check_egress, principal_of, stream_for
from ductor_streams.http.codecs.json_bodies import json_body, json_response
from ductor_streams.http.middleware.disconnect import caller_gone
from ductor_streams.http.middleware.write_budget import BudgetedBody
from ductor_streams.http.routes.streams import STREAM
from ductor_streams.http.state import runtime_of
from ductor_streams.objects import MAX_OBJECT_BYTES, ObjectIntent, PrepareRequest
from ductor_streams.objects.intents import ObjectService

OBJECTS = STREAM + "/objects"
OBJECT = OBJECTS + "/{object_id:str}"


class PrepareBody(msgspec.Struct, forbid_unknown_fields=True):
    idempotency_key: str
    sha256: str
    size: int
    content_type: str = "application/octet-stream"
    schema: str | None = None
    region: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


def object_service(request: Request[Any, Any, Any]) -> ObjectService:
    """The app's object service (its runtime's, ductor_streams/runtime/__init__.py; the intent
    lifetime is ``DUCTOR_STREAMS_OBJECT_INTENT_TTL``)."""
    service: ObjectService = runtime_of(request).objects
    return service


def _state_json(intent: ObjectIntent) -> dict[str, Any]:
    return {"object_id": str(intent.object_id), "state": intent.effective_state}


@post(OBJECTS, opt={"scope": "streams:write"}, status_code=201)
async def prepare_object(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Pin an object intent; the same idempotency key and pins again answers 200."""
    body: PrepareBody = await json_body(request, PrepareBody)
    prepare = PrepareRequest.parse(
        idempotency_key=body.idempotency_key,
        sha256=body.sha256,
        size=body.size,
        content_type=body.content_type,
        schema=body.schema,
        region=body.region,
        metadata=body.metadata,
    )
    ref = await stream_for(request, "write")
    principal = principal_of(request)
    prepared = await object_service(request).prepare(
        ref, prepare, principal=principal.sub, scopes=list(principal.scopes)
    )
    intent = prepared.intent
    if prepared.signed_upload is not None:
        upload = {
            "method": prepared.signed_upload.method,
            "url": prepared.signed_upload.url,
            "headers": prepared.signed_upload.headers,
        }
    else:
        upload = {
            "method": "PUT",
            "url": f"{request.url.path.rstrip('/')}/{intent.object_id}/content",
            "headers": {"Content-Type": intent.content_type},
        }
    return json_response(
        {
            **_state_json(intent),
            "expires_at": intent.expires_at.isoformat(),
            "upload": upload,
        },
        status_code=201 if prepared.created else 200,
    )


async def _body(request: Request[Any, Any, Any]) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            if chunk:
                yield chunk
    except HTTPException as exc:
        if exc.status_code == 413:
            raise ObjectEvidenceMismatch(
                f"the body is larger than any object ({MAX_OBJECT_BYTES} bytes)"
            ) from None
        raise


@put(
    OBJECT + "/content",
    opt={"scope": "streams:write"},
    status_code=200,
    request_max_body_size=MAX_OBJECT_BYTES + 1,
)
async def upload_object(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The body is the object: stored only if its size and SHA-256 match the pins."""
    ref = await stream_for(request, "write")
    intent = await object_service(request).upload(
        ref, request.path_params["object_id"], _body(request)
    )
    return json_response(_state_json(intent))


@post(OBJECT + "/commit", opt={"scope": "streams:write"}, status_code=201)
async def commit_object(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Append the object's record (201); committing again answers 200, same sequence."""
    ref = await stream_for(request, "write")
    committed = await object_service(request).commit(
        ref, request.path_params["object_id"], caller_gone=caller_gone(request.receive)
    )
    return json_response(
        {"sequence": committed.sequence}, status_code=201 if committed.created else 200
    )


@post(OBJECT + "/abort", opt={"scope": "streams:write"}, status_code=200)
async def abort_object(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Abort an uncommitted object; its stored bytes are removed."""
    ref = await stream_for(request, "write")
    intent = await object_service(request).abort(ref, request.path_params["object_id"])
    return json_response(_state_json(intent))


@get(OBJECT, opt={"scope": "streams:read"})
async def read_object(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The intent's state and pins (metadata only: no payload, not egress-checked)."""
    ref = await stream_for(request, "read")
    intent = await object_service(request).get(ref, request.path_params["object_id"])
    return json_response(
        {
            **_state_json(intent),
            "sha256": intent.sha256,
            "size": intent.size,
            "content_type": intent.content_type,
            "schema": intent.schema,
            "region": intent.region,
            "expires_at": intent.expires_at.isoformat(),
            "sequence": intent.committed_sequence,
        }
    )


@get(OBJECT + "/content", opt={"scope": "streams:read"})
async def download_object(request: Request[Any, Any, Any]) -> Stream:
    """The bytes of a committed object (egress checked, like every payload path).

    The download takes one of its tenant's read slots (runtime/tenant_reads.py), held until the
    bytes are written, and goes out a piece at a time under the write budget
    (http/middleware/write_budget.py): a client that stops reading is cut."""
    ref = await stream_for(request, "read")
    check_egress(request, ref)
    runtime = runtime_of(request)
    settings = runtime.settings
    slot = await runtime.reads.admit(principal_of(request).tenant, caller_gone(request.receive))
    try:
        intent, content = await object_service(request).download(
            ref, request.path_params["object_id"], block_bytes=settings.read_piece_bytes
        )
    except BaseException:
        slot.release()
        raise
    body = BudgetedBody(
        content,
        request.scope,
        stall_seconds=settings.read_stall_seconds,
        route="object",
        on_end=slot.release,
    )
    return Stream(
        body,
        headers={
            # Exactly the uploader's type, as a header: as ``media_type`` Litestar would
            # append "; charset=utf-8" to a text/* type, even to one naming its charset.
            "Content-Type": intent.content_type,
            "Content-Length": str(intent.size),
            "ETag": f'"{intent.sha256}"',
            "X-Object-Sha256": intent.sha256,
            # The content type is the uploader's: never let a browser render it (or run
            # its script) in this origin.
            "Content-Disposition": "attachment",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
        },
    )


ROUTES = [prepare_object, upload_object, commit_object, abort_object, read_object, download_object]
