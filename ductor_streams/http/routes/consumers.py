"""Consumer acknowledgements."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, post

from ductor_streams.errors import AckInFuture, ConsumerNotFound, InvalidBody
from ductor_streams.foundation.definitions import CONSUMER_ID_RE
from ductor_streams.http.access import stream_for
from ductor_streams.http.codecs.json_bodies import json_body, json_response
from ductor_streams.http.routes.streams import STREAM
from ductor_streams.http.state import runtime_of


class AckBody(msgspec.Struct, forbid_unknown_fields=True):
    sequence: int


@post(STREAM + "/consumers/{consumer_id:str}/ack", opt={"scope": "streams:ack"}, status_code=200)
async def ack_consumer(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Move a consumer's acknowledgement forward (never back)."""
    body: AckBody = await json_body(request, AckBody)
    if body.sequence < 0:
        raise InvalidBody("sequence must be a non-negative integer")
    if body.sequence > 2**62:
        raise AckInFuture("sequence is beyond the latest sequence")
    ref = await stream_for(request, "read")
    consumer_id = request.path_params["consumer_id"]
    if not CONSUMER_ID_RE.fullmatch(consumer_id):
        raise ConsumerNotFound(f"no consumer {consumer_id!r} on this stream")
    acked = await runtime_of(request).store.ack(ref, consumer_id, body.sequence)
    return json_response({"consumer_id": consumer_id, "acked_sequence": acked})


ROUTES = [ack_consumer]
