"""The OpenAPI document, completed with what the route table cannot say (bodies, problems).

Handlers read raw bodies (msgspec, for speed) and answer ``Response[bytes]``, so
litestar alone documents neither request bodies nor answers. Rather than change the
handlers, ``ContractJsonRenderPlugin`` completes the generated document once, when it
is first served: request bodies (from the same msgspec/pydantic types the handlers
decode with), query and header parameters, path ID patterns, success answers and the
``application/problem+json`` answers every API operation may give. An operation not
described in ``OPERATIONS`` still gets the problem answers and an any-JSON success.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request, Router, get
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.routes import BaseRoute

from ductor_streams.definitions import (
    CONSUMER_ID_PATTERN,
    CONTENT_CLASSES,
    RUN_ID_PATTERN,
    STREAM_ID_PATTERN,
    StreamDefinition,
)
from ductor_streams.errors import NotFound
from ductor_streams.http.params import MAX_LIMIT
from ductor_streams.http.routes_consumers import AckBody
from ductor_streams.http.routes_objects import PrepareBody
from ductor_streams.http.routes_records import AppendBody
from ductor_streams.http.routes_streams import LegalHoldBody
from ductor_streams.names import API_MOUNT
from ductor_streams.ops.filters import MAX_AGE_SECONDS
from ductor_streams.store.encoding import MAX_BATCH_RECORDS

MOUNT = API_MOUNT
REF = "#/components/schemas/{name}"
PROBLEM_JSON = "application/problem+json"
ERROR_STATUSES = {
    "400": "Bad input: `invalid_body`, `invalid_cursor`, `invalid_limit`, `cursor_in_future`, ...",
    "401": "`unauthenticated`: no, malformed, expired or wrongly signed bearer token",
    "403": "`forbidden` (scope or authorization pins) or `egress_denied`",
    "404": "`not_found` (never reveals another run's or tenant's streams)",
    "409": "`definition_conflict`, `stream_closed`, `quota_exhausted`, `ack_regression`, ...",
    "410": "`cursor_expired` (with requested/earliest/latest sequences) or `object_expired`",
    "413": "`record_too_large`, `too_many_json_values`, `object_too_large` or `request_too_large`",
    "422": "`invalid_definition`, `content_class_forbidden`, `placement_mismatch`, ...",
    "429": "`credit_exhausted`; retry after `Retry-After` seconds",
    "431": "`request_header_too_large`: the headers exceed 32 KiB in all",
    "503": "`database_unavailable` (Postgres restarting, failing over or unreachable); "
    "retry after `Retry-After` seconds",
}

_INT = {"type": "integer", "minimum": 0}
_STR = {"type": "string"}


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
    }


STATE = _obj(
    {
        "latest_sequence": _INT,
        "earliest_sequence": _INT,
        "closed": {"type": "boolean"},
        "legal_hold": {"type": "boolean"},
        "total_items": _INT,
        "total_bytes": _INT,
        "unread_items": _INT,
        "unread_bytes": _INT,
        "consumers": {
            "type": "array",
            "items": _obj({"consumer_id": _STR, "acked_sequence": _INT}),
        },
    },
    {"legal_hold_reason": {"type": ["string", "null"]}},
)
RECORD = _obj(
    {
        "sequence": _INT,
        "payload": {},
        "size": _INT,
        "appended_at": {"type": "string", "format": "date-time"},
        "object": {"type": ["object", "null"]},
    }
)
STREAM_VIEW = _obj(
    {
        "definition": _obj({"stream_id": _STR, "direction": {"enum": ["input", "output"]}}),
        "state": {"$ref": REF.format(name="StreamState")},
    }
)
OBJECT_STATE = _obj(
    {
        "object_id": _STR,
        "state": {"enum": ["prepared", "uploaded", "committed", "aborted", "expired"]},
    }
)


@dataclass(frozen=True)
class OperationDoc:
    """What the contract says of one operation, beyond what litestar sees."""

    body: dict[str, Any] | None = None
    body_media_type: str = "application/json"
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)  # status -> schema
    answer_media_type: str = "application/json"
    query: dict[str, dict[str, Any]] = field(default_factory=dict)
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": REF.format(name=name)}


_CURSOR = {"type": "integer", "minimum": 0, "maximum": 2**62}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}
_PAGE = {"type": "string", "pattern": "^[0-9]{1,18}$"}
_RUN = {"type": "string", "pattern": RUN_ID_PATTERN}
_STREAM = {"type": "string", "pattern": STREAM_ID_PATTERN}
OPERATIONS: dict[tuple[str, str], OperationDoc] = {
    ("post", "/runs/{run_id}/streams"): OperationDoc(
        body=_ref("StreamDefinition"), answers={"201": STREAM_VIEW, "200": STREAM_VIEW}
    ),
    ("get", "/runs/{run_id}/streams/{stream_id}"): OperationDoc(answers={"200": STREAM_VIEW}),
    ("post", "/runs/{run_id}/streams/{stream_id}/records"): OperationDoc(
        body=_ref("AppendBody"),
        answers={
            "201": _obj({"first_sequence": _INT, "last_sequence": _INT}),
            "200": _obj({"first_sequence": _INT, "last_sequence": _INT}),
        },
        headers={
            "Idempotency-Key": {"type": "string", "pattern": "^[\\x20-\\x7e]{1,255}$"},
        },
    ),
    ("get", "/runs/{run_id}/streams/{stream_id}/records"): OperationDoc(
        answers={
            "200": _obj(
                {
                    "records": {"type": "array", "items": RECORD},
                    "next_cursor": _INT,
                    "earliest_sequence": _INT,
                    "latest_sequence": _INT,
                    "closed": {"type": "boolean"},
                }
            )
        },
        query={"cursor": _CURSOR, "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
    ),
    ("get", "/runs/{run_id}/streams/{stream_id}/subscribe"): OperationDoc(
        answers={"200": {"type": "string"}},
        answer_media_type="text/event-stream",
        query={"cursor": _CURSOR},
        headers={"Last-Event-ID": {"type": "string", "pattern": "^[0-9]{1,18}$"}},
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/consumers/{consumer_id}/ack"): OperationDoc(
        body=_ref("AckBody"), answers={"200": _obj({"consumer_id": _STR, "acked_sequence": _INT})}
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/close"): OperationDoc(
        answers={"200": _obj({"closed": {"const": True}, "last_sequence": _INT})}
    ),
    ("put", "/runs/{run_id}/streams/{stream_id}/legal-hold"): OperationDoc(
        body=_ref("LegalHoldBody"), answers={"200": _ref("StreamState")}
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/objects"): OperationDoc(
        body=_ref("PrepareBody"),
        answers={
            status: {
                **OBJECT_STATE,
                "properties": {
                    **OBJECT_STATE["properties"],
                    "expires_at": {"type": "string", "format": "date-time"},
                    "upload": _obj({"method": _STR, "url": _STR, "headers": {"type": "object"}}),
                },
                "required": [*OBJECT_STATE["required"], "expires_at", "upload"],
            }
            for status in ("201", "200")
        },
    ),
    ("put", "/runs/{run_id}/streams/{stream_id}/objects/{object_id}/content"): OperationDoc(
        body={"type": "string", "format": "binary"},
        body_media_type="application/octet-stream",
        answers={"200": OBJECT_STATE},
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/objects/{object_id}/commit"): OperationDoc(
        answers={"201": _obj({"sequence": _INT}), "200": _obj({"sequence": _INT})}
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/objects/{object_id}/abort"): OperationDoc(
        answers={"200": OBJECT_STATE}
    ),
    ("get", "/runs/{run_id}/streams/{stream_id}/objects/{object_id}"): OperationDoc(
        answers={"200": OBJECT_STATE}
    ),
    ("get", "/runs/{run_id}/streams/{stream_id}/objects/{object_id}/content"): OperationDoc(
        answers={"200": {"type": "string", "format": "binary"}}, answer_media_type="*/*"
    ),
    ("get", "/ops/deliveries"): OperationDoc(
        query={
            "state": {"enum": ["pending", "delivered", "retrying", "dead"]},
            "run": _RUN,
            "stream": _STREAM,
            "older_than": {"type": "number", "minimum": 0, "maximum": MAX_AGE_SECONDS},
            "limit": _LIMIT,
            "page": _PAGE,
        },
        answers={"200": _obj({"deliveries": {"type": "array"}, "next_page": {}})},
    ),
    ("get", "/ops/gaps"): OperationDoc(
        query={"run": _RUN, "stream": _STREAM, "limit": _LIMIT, "page": _PAGE},
        answers={"200": {"type": "object"}},
    ),
    ("get", "/ops/summary"): OperationDoc(
        query={"limit": _LIMIT}, answers={"200": {"type": "object"}}
    ),
}

PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    "run_id": {"type": "string", "pattern": RUN_ID_PATTERN},
    "stream_id": {"type": "string", "pattern": STREAM_ID_PATTERN},
    "consumer_id": {"type": "string", "pattern": CONSUMER_ID_PATTERN},
    "object_id": {"type": "string", "format": "uuid"},
    "delivery_id": {"type": "string", "pattern": "^[0-9]{1,18}$"},
}


def _components() -> dict[str, Any]:
    """Schemas of the request bodies, from the types the handlers decode with."""
    _, structs = msgspec.json.schema_components(
        [AppendBody, AckBody, LegalHoldBody, PrepareBody], ref_template=REF
    )
    structs["AppendBody"]["properties"]["records"].update(minItems=1, maxItems=MAX_BATCH_RECORDS)
    structs["AckBody"]["properties"]["sequence"]["minimum"] = 0
    definition = StreamDefinition.model_json_schema(
        by_alias=True, ref_template=REF.replace("{name}", "{model}")
    )
    nested = definition.pop("$defs", {})
    # Only stream_id and direction are required; everything else gets a default.
    definition["required"] = ["stream_id", "direction"]
    definition["properties"]["content_class"] = {"enum": list(CONTENT_CLASSES)}
    problem = _obj(
        {"type": _STR, "title": _STR, "status": {"type": "integer"}, "detail": _STR, "code": _STR},
        # request_id: the X-Request-ID the response echoes (http/observe.py).
        {"instance": _STR, "request_id": _STR},
    )
    return {
        **structs,
        **nested,
        "StreamDefinition": definition,
        "StreamState": STATE,
        "Problem": problem,
    }


def _problem_answers() -> dict[str, Any]:
    answers: dict[str, Any] = {
        status: {
            "description": description,
            "content": {PROBLEM_JSON: {"schema": _ref("Problem")}},
        }
        for status, description in ERROR_STATUSES.items()
    }
    for status in ("429", "503"):
        answers[status]["headers"] = {
            "Retry-After": {"schema": {"type": "integer", "minimum": 1}, "required": True}
        }
    return answers


def complete_openapi(document: dict[str, Any]) -> dict[str, Any]:
    """Complete litestar's generated document in place (idempotent) and return it."""
    if document.get("x-completed-from-contract"):
        return document
    document.setdefault("components", {}).setdefault("schemas", {}).update(_components())
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            if path.startswith(MOUNT):
                _complete_api_operation(path[len(MOUNT) :], method, operation)
            elif path in ("/healthz", "/readyz"):
                operation["responses"] = {
                    "200": {
                        "description": "Up (healthz) or ready (readyz)",
                        "content": {"application/json": {"schema": _obj({"status": _STR})}},
                    },
                    "503": {
                        "description": "`not_ready`",
                        "content": {PROBLEM_JSON: {"schema": _ref("Problem")}},
                    },
                }
    document["x-completed-from-contract"] = True
    return document


def _complete_api_operation(path: str, method: str, operation: dict[str, Any]) -> None:
    doc = OPERATIONS.get((method, path), OperationDoc())
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "path" and parameter["name"] in PATH_PARAMETERS:
            parameter["schema"] = dict(PATH_PARAMETERS[parameter["name"]])
    extra = [
        {"name": name, "in": "query", "required": False, "schema": schema}
        for name, schema in doc.query.items()
    ] + [
        {"name": name, "in": "header", "required": False, "schema": schema}
        for name, schema in doc.headers.items()
    ]
    if extra:
        operation["parameters"] = [*operation.get("parameters", []), *extra]
    if doc.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {doc.body_media_type: {"schema": doc.body}},
        }
    success = {
        status: answer
        for status, answer in operation["responses"].items()
        if status.startswith("2")
    }
    answers: dict[str, Any] = {}
    for status, answer in success.items():
        schema = doc.answers.get(status, {})
        answers[status] = {
            "description": answer.get("description", "OK"),
            "content": {doc.answer_media_type: {"schema": copy.deepcopy(schema)}},
        }
    for status, schema in doc.answers.items():
        answers.setdefault(
            status,
            {
                "description": "The same answer again (idempotent replay)",
                "content": {doc.answer_media_type: {"schema": copy.deepcopy(schema)}},
            },
        )
    answers.update(_problem_answers())
    operation["responses"] = answers


class ContractJsonRenderPlugin(JsonRenderPlugin):
    """Serves ``/schema/openapi.json`` completed by ``complete_openapi``."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, complete_openapi(openapi_schema))


@get("/{path:str}", include_in_schema=False, sync_to_thread=False)
def _unknown_schema_path() -> None:
    """Any other path under ``/schema``: a ``not_found`` problem, as every unknown route."""
    raise NotFound("no such resource")


class SchemaRouter(Router):
    """The router of ``/schema`` (``OpenAPIConfig.openapi_router``).

    Litestar registers on it the document's handler and one for every other schema path
    that answers an HTML "404 Not found" page (where its documentation UIs would be:
    ``/schema/swagger``, ``/schema/redoc``, ...). Here that handler is replaced, so that
    an unknown schema path answers like every unknown route: a ``not_found`` problem."""

    def __init__(self, path: str) -> None:
        super().__init__(path, route_handlers=[], include_in_schema=False)

    def register(self, value: Any) -> list[BaseRoute]:
        if getattr(value, "handler_name", None) == "handle_schema_path_not_found":
            value = _unknown_schema_path
        return super().register(value)
