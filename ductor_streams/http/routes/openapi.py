"""The OpenAPI document, completed with what the route table cannot say (bodies, problems).

Handlers read raw bodies (msgspec, for speed) and answer ``Response[bytes]``, so
litestar alone documents neither request bodies nor answers. Rather than change the
handlers, ``ContractJsonRenderPlugin`` completes the generated document once, when it
is first served: request bodies (from the same msgspec/pydantic types the handlers
decode with), query and header parameters, path ID patterns, success answers, the
``application/problem+json`` answers each operation can give (status by status, with
their codes), and the links from one operation's answer to the next. Every API route
must be described in ``OPERATIONS`` (the document refuses to render otherwise).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request, Router, get
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.routes import BaseRoute

from ductor_streams.compat.litestar import is_schema_not_found_handler
from ductor_streams.errors import NotFound
from ductor_streams.foundation.definitions import (
    CONSUMER_ID_PATTERN,
    CONTENT_CLASSES,
    RUN_ID_PATTERN,
    STREAM_ID_PATTERN,
    WORKFLOW_CONSUMER,
    StreamDefinition,
)
from ductor_streams.http.codecs.params import MAX_LIMIT
from ductor_streams.http.routes.consumers import AckBody
from ductor_streams.http.routes.objects import PrepareBody
from ductor_streams.http.routes.ops import RetryBody
from ductor_streams.http.routes.records import AppendBody
from ductor_streams.http.routes.streams import LegalHoldBody
from ductor_streams.names import API_MOUNT
from ductor_streams.objects.models import MAX_OBJECT_BYTES, MEDIA_TYPE_PATTERN
from ductor_streams.ops.filters import MAX_AGE_SECONDS
from ductor_streams.store.browse import PAGE_PATTERN as STREAM_PAGE_PATTERN
from ductor_streams.store.encoding import MAX_BATCH_RECORDS
from ductor_streams.store.fingerprint import FINGERPRINT_PATTERN

MOUNT = API_MOUNT
REF = "#/components/schemas/{name}"
PROBLEM_JSON = "application/problem+json"

# Every status an operation can answer with, and what each means. Each operation lists
# its own (``OperationDoc.errors``: status -> the codes it can answer there); these are
# the texts. Answers the server gives before routing (the connection guard's 431 and
# 503, compat/uvicorn_protocol.py) can come on every route, health included.
_STATUS_TEXT = {
    "400": "Bad input",
    "401": "`unauthenticated`: no, malformed, expired or wrongly signed bearer token",
    "403": "Not allowed",
    "404": "`not_found` (never reveals another run's or tenant's streams)",
    "409": "Conflicts with the resource's state",
    "410": "Gone",
    "413": "Too large",
    "422": "Well-formed but refused",
    "429": "Too many requests; retry after `Retry-After` seconds",
    "431": "`request_header_too_large`: the request's headers are too large",
    "503": "`database_unavailable` (Postgres restarting, failing over or unreachable) or "
    "`too_many_connections` (the connection cap); retry after `Retry-After` seconds",
}
# What every API operation can answer: authentication, scope, the header cap and an
# unavailable database. Each operation adds its own (``_errors``).
_EVERY_API_OPERATION = {
    "401": ["unauthenticated"],
    "403": ["forbidden"],
    "431": ["request_header_too_large"],
    "503": ["database_unavailable", "too_many_connections"],
}
# What every request can answer before routing, health included: a malformed or
# repeated Host header (http/middleware/host.py).
_EVERY_REQUEST = {"400": ["invalid_host"]}
_IN_RUN = {"404": ["not_found"], "400": ["invalid_request"]}
_BODY = {"400": ["invalid_body"], "413": ["request_too_large"]}
_READ = {"403": ["forbidden", "egress_denied"]}
# A catch-up read past its tenant's reads in progress (runtime/tenant_reads.py).
_TOO_MANY_READS = {"429": ["too_many_reads"]}

_INT = {"type": "integer", "minimum": 0}
_STR = {"type": "string"}
_TIME = {"type": "string", "format": "date-time"}
_TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
_STR_OR_NULL = {"type": ["string", "null"]}


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
        "appended_at": _TIME,
        "object": {"type": ["object", "null"]},
        # Opaque: sent back as ``fingerprint=`` when resuming after this record.
        "fingerprint": {"type": "string", "pattern": FINGERPRINT_PATTERN},
    }
)
STREAM_VIEW = _obj(
    {
        "definition": {"$ref": REF.format(name="StreamDefinition")},
        "state": {"$ref": REF.format(name="StreamState")},
    }
)
OBJECT_STATE = _obj(
    {
        "object_id": _STR,
        "state": {"enum": ["prepared", "uploaded", "committed", "aborted", "expired"]},
    }
)
DELIVERY = _obj(
    {
        "delivery_id": _INT,
        "run_id": _STR,
        "stream_id": _STR,
        "sequence": _INT,
        "state": {"enum": ["pending", "retrying", "delivered", "dead"]},
        "attempts": _INT,
        "last_error": _STR_OR_NULL,
        "next_attempt_at": _TIME_OR_NULL,
        "delivered_at": _TIME_OR_NULL,
        "created_at": _TIME,
        "retried_by": _STR_OR_NULL,
        "retried_at": _TIME_OR_NULL,
        "lease_owner": _STR_OR_NULL,
        "lease_expires_at": _TIME_OR_NULL,
    }
)
DELIVERY_DETAIL = {
    **DELIVERY,
    "properties": {
        **DELIVERY["properties"],
        "record": _obj(
            {
                "size": {"type": ["integer", "null"], "minimum": 0},
                "appended_at": _TIME_OR_NULL,
                "fingerprint": {"type": ["string", "null"], "pattern": FINGERPRINT_PATTERN},
                "payload_visible": {"type": "boolean"},
                "payload_hidden_reason": _STR_OR_NULL,
            },
            {"payload": {}},
        ),
    },
    "required": [*DELIVERY["required"], "record"],
}
GAP = _obj(
    {
        "gap_id": _INT,
        "run_id": _STR,
        "stream_id": _STR,
        "expected_sequence": _INT,
        "received_sequence": _INT,
        "repaired_records": _INT,
        "detected_by": _STR,
        "detected_at": _TIME,
    }
)
SUMMARY = _obj(
    {
        "counts": _obj({state: _INT for state in ("pending", "retrying", "delivered", "dead")}),
        "oldest_pending_age_seconds": {"type": ["number", "null"], "minimum": 0},
        "streams": {
            "type": "array",
            "items": _obj(
                {
                    "run_id": _STR,
                    "stream_id": _STR,
                    "latest_sequence": _INT,
                    "owed": _INT,
                    "pending": _INT,
                    "retrying": _INT,
                    "dead": _INT,
                    "first_undelivered_sequence": _INT,
                    "lag_seconds": {"type": "number", "minimum": 0},
                    "last_delivered_at": _TIME_OR_NULL,
                }
            ),
        },
    }
)
_NEXT_PAGE = {"type": ["string", "null"]}
_CEILING = {"type": ["integer", "null"], "minimum": 0}
STREAM_LISTING = _obj(
    {
        "run_id": _STR,
        "stream_id": _STR,
        "direction": {"enum": ["input", "output"]},
        "content_class": _STR,
        "latest_sequence": _INT,
        "earliest_sequence": _INT,
        "total_items": _INT,
        "total_bytes": _INT,
        "unread_items": _INT,
        "unread_bytes": _INT,
        "credit": _obj(
            {
                "max_unread_items": _CEILING,
                "max_unread_bytes": _CEILING,
                "max_total_items": _CEILING,
                "max_total_bytes": _CEILING,
            }
        ),
        "closed": {"type": "boolean"},
        "closed_at": _TIME_OR_NULL,
        "legal_hold": {"type": "boolean"},
        "created_at": _TIME,
        "last_append_at": _TIME_OR_NULL,
        "activity_at": _TIME,
    }
)
STREAM_PAGE = _obj(
    {
        "streams": {"type": "array", "items": {"$ref": REF.format(name="StreamListing")}},
        "next_page": _NEXT_PAGE,
    }
)
SSE_DESCRIPTION = (
    "Server-Sent Events. `record` events carry one record each (`data`: a StreamRecord,"
    " `id`: its sequence); `: keepalive` comments come while nothing happens; the response"
    " ends after `end` (`data`: SseEnd, the stream is closed and everything was sent),"
    " `error` (`data`: a Problem, `cursor_expired` when retention overtook the"
    " subscriber) or `reconnect` (`data`: SseReconnect; the server shuts down or the token"
    " expired: reconnect with `Last-Event-ID`, and `fingerprint=` the last record's"
    " fingerprint: 409 `history_diverged` when the stream no longer has that record)."
)


@dataclass(frozen=True)
class OperationDoc:
    """What the document says of one operation, beyond what litestar sees."""

    operation_id: str
    body: dict[str, Any] | None = None
    body_media_type: str = "application/json"
    body_required: bool = True
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)  # status -> schema
    answer_media_type: str = "application/json"
    answer_description: str = "OK"
    query: dict[str, dict[str, Any]] = field(default_factory=dict)
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)  # status -> problem codes
    links: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> link
    success_headers: dict[str, dict[str, Any]] = field(default_factory=dict)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": REF.format(name=name)}


def _errors(*parts: dict[str, list[str]]) -> dict[str, list[str]]:
    """Merge status -> codes maps (codes of one status in order, once each)."""
    merged: dict[str, list[str]] = {}
    for part in (_EVERY_API_OPERATION, *parts, _EVERY_REQUEST):
        for status, codes in part.items():
            merged.setdefault(status, [])
            merged[status] += [c for c in codes if c not in merged[status]]
    return merged


def _link(operation_id: str, description: str, **parameters: Any) -> dict[str, Any]:
    body = parameters.pop("request_body", None)
    link: dict[str, Any] = {
        "operationId": operation_id,
        "parameters": parameters,
        "description": description,
    }
    if body is not None:
        link["requestBody"] = body
    return link


_SAME_STREAM = {"run_id": "$request.path.run_id", "stream_id": "$request.path.stream_id"}
_CREATED_STREAM = {
    "run_id": "$request.path.run_id",
    "stream_id": "$response.body#/definition/stream_id",
}
_SAME_OBJECT = {**_SAME_STREAM, "object_id": "$request.path.object_id"}
# What a new (or found) stream leads to: the stateful phase of the schemathesis test
# (tests/security/test_schemathesis.py) follows these to create, append, read, ack, close.
_STREAM_LINKS = {
    "GetStream": _link("getStream", "The stream just defined", **_CREATED_STREAM),
    "AppendRecords": _link("appendRecords", "Append to it", **_CREATED_STREAM),
    # From cursor 0: whatever else a request carries (a fingerprint is not checked at 0).
    "ReadRecords": _link("readRecords", "Read it from the start", cursor=0, **_CREATED_STREAM),
    "AckFirstConsumer": _link(
        "ackConsumer",
        "Acknowledge what its first declared consumer has read (nothing yet)",
        consumer_id="$response.body#/definition/consumers/0",
        request_body={"sequence": "$response.body#/state/latest_sequence"},
        **_CREATED_STREAM,
    ),
    "CloseStream": _link("closeStream", "Close it", **_CREATED_STREAM),
    "PrepareObject": _link("prepareObject", "Prepare an object on it", **_CREATED_STREAM),
    "SetLegalHold": _link("setLegalHold", "Put it on legal hold", **_CREATED_STREAM),
}
_APPENDED_LINKS = {
    "ReadAppended": _link(
        "readRecords",
        "Read what this append stored",
        cursor="$response.body#/first_sequence",
        **_SAME_STREAM,
    ),
    "AckAppendedAsWorkflow": _link(
        "ackConsumer",
        "On an input stream, acknowledge what was appended as its workflow",
        consumer_id=WORKFLOW_CONSUMER,
        request_body={"sequence": "$response.body#/last_sequence"},
        **_SAME_STREAM,
    ),
    "GetStream": _link("getStream", "The stream's state after the append", **_SAME_STREAM),
    "CloseStream": _link("closeStream", "Close the stream", **_SAME_STREAM),
}
_OBJECT_LINKS = {
    "UploadObject": _link(
        "uploadObject", "Upload its bytes", object_id="$response.body#/object_id", **_SAME_STREAM
    ),
    "GetObject": _link(
        "getObject", "Its state", object_id="$response.body#/object_id", **_SAME_STREAM
    ),
    "CommitObject": _link(
        "commitObject", "Commit it", object_id="$response.body#/object_id", **_SAME_STREAM
    ),
    "AbortObject": _link(
        "abortObject", "Abort it", object_id="$response.body#/object_id", **_SAME_STREAM
    ),
}
_UPLOADED_LINKS = {
    "CommitObject": _link("commitObject", "Commit the uploaded object", **_SAME_OBJECT),
    "DownloadObject": _link("downloadObject", "Download it", **_SAME_OBJECT),
}

_CURSOR = {"type": "integer", "minimum": 0, "maximum": 2**62}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}
_PAGE = {"type": "string", "pattern": "^[0-9]{1,18}$"}
_STREAM_PAGE_TOKEN = {"type": "string", "pattern": STREAM_PAGE_PATTERN}
_RUN = {"type": "string", "pattern": RUN_ID_PATTERN}
_STREAM = {"type": "string", "pattern": STREAM_ID_PATTERN}
_SEQUENCES = _obj({"first_sequence": _INT, "last_sequence": _INT})
_PREPARED = {
    **OBJECT_STATE,
    "properties": {
        **OBJECT_STATE["properties"],
        "expires_at": _TIME,
        "upload": _obj({"method": _STR, "url": _STR, "headers": {"type": "object"}}),
    },
    "required": [*OBJECT_STATE["required"], "expires_at", "upload"],
}
_REPLAYED = {"Idempotent-Replayed": {"schema": {"const": "true"}, "required": False}}
_CURSOR_ERRORS = {
    "400": ["invalid_cursor", "cursor_in_future"],
    "410": ["cursor_expired"],
}
# ``fingerprint=``: that of the record at the cursor (cursor >= 1), as the record's JSON
# carried it; 409 when the stream's record there differs (store/fingerprint.py).
_FINGERPRINT = {"type": "string", "pattern": FINGERPRINT_PATTERN}
_FINGERPRINT_ERRORS = {"400": ["invalid_fingerprint"], "409": ["history_diverged"]}
OPERATIONS: dict[tuple[str, str], OperationDoc] = {
    ("post", "/runs/{run_id}/streams"): OperationDoc(
        "createStream",
        body=_ref("StreamDefinitionInput"),
        answers={"201": STREAM_VIEW, "200": STREAM_VIEW},
        errors=_errors(
            _IN_RUN,
            _BODY,
            {"409": ["definition_conflict", "tenant_quota_exhausted"]},
            {"422": ["invalid_definition", "content_class_forbidden", "placement_mismatch"]},
        ),
        links=_STREAM_LINKS,
    ),
    ("get", "/streams"): OperationDoc(
        "listStreams",
        query={
            "run_prefix": _RUN,
            "direction": {"enum": ["input", "output"]},
            "closed": {"type": "boolean"},
            "limit": _LIMIT,
            "page": _STREAM_PAGE_TOKEN,
        },
        answers={"200": STREAM_PAGE},
        errors=_errors({"400": ["invalid_filter", "invalid_limit", "invalid_page"]}),
    ),
    ("get", "/runs/{run_id}/streams"): OperationDoc(
        "listRunStreams",
        query={"limit": _LIMIT, "page": _STREAM_PAGE_TOKEN},
        answers={"200": STREAM_PAGE},
        errors=_errors(_IN_RUN, {"400": ["invalid_filter", "invalid_limit", "invalid_page"]}),
    ),
    ("get", "/runs/{run_id}/streams/{stream_id}"): OperationDoc(
        "getStream", answers={"200": STREAM_VIEW}, errors=_errors(_IN_RUN)
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/records"): OperationDoc(
        "appendRecords",
        body=_ref("AppendBody"),
        answers={"201": _SEQUENCES, "200": _SEQUENCES},
        headers={
            "Idempotency-Key": {"type": "string", "pattern": "^[\\x20-\\x7e]{1,255}$"},
        },
        errors=_errors(
            _IN_RUN,
            _BODY,
            {
                "400": ["invalid_batch", "invalid_idempotency_key"],
                "409": ["stream_closed", "quota_exhausted"],
                "413": ["record_too_large", "too_many_json_values"],
                "422": ["idempotency_key_reused"],
                "429": ["credit_exhausted"],
            },
        ),
        links=_APPENDED_LINKS,
        success_headers=_REPLAYED,
    ),
    ("get", "/runs/{run_id}/streams/{stream_id}/records"): OperationDoc(
        "readRecords",
        answers={
            "200": _obj(
                {
                    "records": {"type": "array", "items": _ref("StreamRecord")},
                    "next_cursor": _INT,
                    "earliest_sequence": _INT,
                    "latest_sequence": _INT,
                    "closed": {"type": "boolean"},
                }
            )
        },
        query={"cursor": _CURSOR, "limit": _LIMIT, "fingerprint": _FINGERPRINT},
        errors=_errors(
            _IN_RUN,
            _READ,
            _CURSOR_ERRORS,
            {"400": ["invalid_limit"]},
            _TOO_MANY_READS,
            _FINGERPRINT_ERRORS,
        ),
    ),
    ("get", "/runs/{run_id}/streams/{stream_id}/subscribe"): OperationDoc(
        "subscribe",
        answers={"200": {"type": "string", "description": SSE_DESCRIPTION}},
        answer_media_type="text/event-stream",
        answer_description=SSE_DESCRIPTION,
        query={"cursor": _CURSOR, "fingerprint": _FINGERPRINT},
        headers={"Last-Event-ID": {"type": "string", "pattern": "^[0-9]{1,18}$"}},
        errors=_errors(
            _IN_RUN, _READ, _CURSOR_ERRORS, {"429": ["too_many_live_reads"]}, _FINGERPRINT_ERRORS
        ),
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/consumers/{consumer_id}/ack"): OperationDoc(
        "ackConsumer",
        body=_ref("AckBody"),
        answers={"200": _obj({"consumer_id": _STR, "acked_sequence": _INT})},
        errors=_errors(
            _IN_RUN,
            _BODY,
            {
                "400": ["ack_in_future"],
                "404": ["consumer_not_found"],
                "409": ["ack_regression"],
            },
        ),
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/close"): OperationDoc(
        "closeStream",
        answers={"200": _obj({"closed": {"const": True}, "last_sequence": _INT})},
        errors=_errors(_IN_RUN),
    ),
    ("put", "/runs/{run_id}/streams/{stream_id}/legal-hold"): OperationDoc(
        "setLegalHold",
        body=_ref("LegalHoldBody"),
        answers={"200": _ref("StreamState")},
        errors=_errors(_IN_RUN, _BODY),
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/objects"): OperationDoc(
        "prepareObject",
        body=_ref("PrepareBody"),
        answers={"201": _PREPARED, "200": _PREPARED},
        errors=_errors(
            _IN_RUN,
            _BODY,
            {
                "400": ["invalid_request", "invalid_idempotency_key"],
                "409": ["stream_closed", "definition_conflict"],
                "413": ["object_too_large", "record_too_large"],
                "422": ["placement_mismatch"],
            },
        ),
        links=_OBJECT_LINKS,
    ),
    ("put", "/runs/{run_id}/streams/{stream_id}/objects/{object_id}/content"): OperationDoc(
        "uploadObject",
        body={"type": "string", "format": "binary"},
        body_media_type="application/octet-stream",
        answers={"200": OBJECT_STATE},
        errors=_errors(
            _IN_RUN,
            {
                "409": ["object_aborted", "object_committed"],
                "410": ["object_expired"],
                "413": ["object_too_large", "request_too_large"],
                "422": ["object_evidence_mismatch"],
            },
        ),
        links=_UPLOADED_LINKS,
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/objects/{object_id}/commit"): OperationDoc(
        "commitObject",
        answers={"201": _obj({"sequence": _INT}), "200": _obj({"sequence": _INT})},
        errors=_errors(
            _IN_RUN,
            {
                "409": [
                    "object_not_uploaded",
                    "object_aborted",
                    "stream_closed",
                    "quota_exhausted",
                ],
                "410": ["object_expired"],
                "422": ["object_evidence_mismatch"],
                "429": ["credit_exhausted"],
            },
        ),
    ),
    ("post", "/runs/{run_id}/streams/{stream_id}/objects/{object_id}/abort"): OperationDoc(
        "abortObject",
        answers={"200": OBJECT_STATE},
        errors=_errors(_IN_RUN, {"409": ["object_committed"]}),
    ),
    ("get", "/runs/{run_id}/streams/{stream_id}/objects/{object_id}"): OperationDoc(
        "getObject", answers={"200": OBJECT_STATE}, errors=_errors(_IN_RUN)
    ),
    ("get", "/runs/{run_id}/streams/{stream_id}/objects/{object_id}/content"): OperationDoc(
        "downloadObject",
        answers={"200": {"type": "string", "format": "binary"}},
        answer_media_type="*/*",
        errors=_errors(
            _IN_RUN,
            _READ,
            {"409": ["object_not_uploaded"], "410": ["object_pruned"]},
            _TOO_MANY_READS,
        ),
    ),
    ("get", "/ops/deliveries"): OperationDoc(
        "listDeliveries",
        query={
            "state": {"enum": ["pending", "delivered", "retrying", "dead"]},
            "run": _RUN,
            "stream": _STREAM,
            "older_than": {"type": "number", "minimum": 0, "maximum": MAX_AGE_SECONDS},
            "limit": _LIMIT,
            "page": _PAGE,
        },
        answers={
            "200": _obj(
                {
                    "deliveries": {"type": "array", "items": _ref("Delivery")},
                    "next_page": _NEXT_PAGE,
                }
            )
        },
        errors=_errors({"400": ["invalid_filter", "invalid_limit", "invalid_page"]}),
    ),
    ("get", "/ops/deliveries/{delivery_id}"): OperationDoc(
        "getDelivery",
        answers={"200": DELIVERY_DETAIL},
        errors=_errors({"400": ["invalid_filter"], "404": ["not_found"]}),
    ),
    ("post", "/ops/deliveries/{delivery_id}/retry"): OperationDoc(
        "retryDelivery",
        body=_ref("RetryBody"),
        body_required=False,
        answers={"200": _ref("Delivery")},
        errors=_errors(
            {"400": ["invalid_filter", "invalid_body"], "404": ["not_found"]},
            {"409": ["delivery_not_dead"], "413": ["request_too_large"]},
        ),
    ),
    ("get", "/ops/gaps"): OperationDoc(
        "listGaps",
        query={"run": _RUN, "stream": _STREAM, "limit": _LIMIT, "page": _PAGE},
        answers={"200": _obj({"gaps": {"type": "array", "items": GAP}, "next_page": _NEXT_PAGE})},
        errors=_errors({"400": ["invalid_filter", "invalid_limit", "invalid_page"]}),
    ),
    ("get", "/ops/summary"): OperationDoc(
        "deliverySummary",
        query={"limit": _LIMIT},
        answers={"200": SUMMARY},
        errors=_errors({"400": ["invalid_filter", "invalid_limit"]}),
    ),
}
HEALTH_OPERATIONS = {
    "/healthz": ("healthz", "Up", {}),
    "/readyz": (
        "readyz",
        "Ready: the database answers and every migration is applied",
        {"503": ["not_ready"]},
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
        [AppendBody, AckBody, LegalHoldBody, PrepareBody, RetryBody], ref_template=REF
    )
    structs["AppendBody"]["properties"]["records"].update(minItems=1, maxItems=MAX_BATCH_RECORDS)
    structs["AckBody"]["properties"]["sequence"].update(minimum=0, maximum=2**62)
    prepare = structs["PrepareBody"]["properties"]
    prepare["idempotency_key"].update(pattern="^[\\x20-\\x7e]{1,255}$")
    prepare["sha256"].update(pattern="^[0-9a-fA-F]{64}$")
    # The size limit is not a schema ``maximum``: a size over it is well-formed and is
    # refused as what it is, 413 object_too_large (the contract's status), which a
    # ``maximum`` would make a validation error (400/422) in a client's or fuzzer's eyes.
    prepare["size"].update(
        minimum=0,
        description=f"The object's size in bytes: at most {MAX_OBJECT_BYTES:,}; over it, "
        "`413 object_too_large`.",
    )
    prepare["content_type"].update(pattern=MEDIA_TYPE_PATTERN, maxLength=255)
    prepare["schema"] = {
        "anyOf": [{"type": "string", "minLength": 1, "maxLength": 255}, {"type": "null"}]
    }
    prepare["region"] = {
        "anyOf": [{"type": "string", "minLength": 1, "maxLength": 64}, {"type": "null"}]
    }
    definition = StreamDefinition.model_json_schema(
        by_alias=True, ref_template=REF.replace("{name}", "{model}")
    )
    nested = definition.pop("$defs", {})
    _without_nul(definition)
    for schema in nested.values():
        _without_nul(schema)
    # Only stream_id and direction are required; everything else gets a default.
    definition_input = copy.deepcopy(definition)
    definition_input["required"] = ["stream_id", "direction"]
    definition_input["properties"]["content_class"] = {"enum": list(CONTENT_CLASSES)}
    definition_input["title"] = "StreamDefinitionInput"
    problem = _obj(
        {"type": _STR, "title": _STR, "status": {"type": "integer"}, "detail": _STR, "code": _STR},
        {
            "instance": _STR,
            # The X-Request-ID the response echoes (http/middleware/observe.py).
            "request_id": _STR,
        },
    )
    # A problem may carry members of its own (cursor_expired: requested_sequence,
    # earliest_sequence, latest_sequence, resync_reason; history_diverged: sequence,
    # fingerprint, stored_fingerprint, earliest_sequence, latest_sequence,
    # resync_reason; others later).
    problem["additionalProperties"] = True
    return {
        **structs,
        **nested,
        "StreamDefinitionInput": definition_input,
        "StreamDefinition": definition,
        "StreamState": STATE,
        "StreamRecord": RECORD,
        "StreamListing": STREAM_LISTING,
        "Delivery": DELIVERY,
        "SseEnd": _obj({"last_sequence": _INT}),
        "SseReconnect": _obj({"reason": {"enum": ["server_shutdown", "token_expired"]}}),
        "Problem": problem,
    }


# Postgres text and jsonb hold no NUL, so a definition's strings may not contain one
# (definitions.parse_definition refuses it): the document says so with a pattern.
_NO_NUL = "^[^\\u0000]*$"


def _without_nul(schema: Any) -> None:
    if isinstance(schema, dict):
        if schema.get("type") == "string" and "pattern" not in schema and "enum" not in schema:
            schema["pattern"] = _NO_NUL
        for value in schema.values():
            _without_nul(value)
    elif isinstance(schema, list):
        for value in schema:
            _without_nul(value)


def _problem_answers(errors: dict[str, list[str]]) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    for status in sorted(errors):
        codes = errors[status]
        text = _STATUS_TEXT[status]
        if codes and not text.startswith("`"):
            text = f"{text}: " + ", ".join(f"`{c}`" for c in codes)
        answers[status] = {
            "description": text,
            "content": {PROBLEM_JSON: {"schema": _ref("Problem")}},
        }
        if status in ("429", "503") and "not_ready" not in codes:
            answers[status]["headers"] = {
                "Retry-After": {"schema": {"type": "integer", "minimum": 1}, "required": True}
            }
    return answers


def complete_openapi(document: dict[str, Any]) -> dict[str, Any]:
    """Complete litestar's generated document in place (idempotent) and return it.

    Only the API under the mount and the health routes are described; any other route
    (other protocols served beside the API) is left out of the document."""
    if document.get("x-completed-from-contract"):
        return document
    document.setdefault("components", {}).setdefault("schemas", {}).update(_components())
    paths = document.get("paths", {})
    for path in list(paths):
        if not path.startswith(MOUNT) and path not in HEALTH_OPERATIONS:
            del paths[path]
    for path, item in paths.items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            if path.startswith(MOUNT):
                _complete_api_operation(path[len(MOUNT) :], method, operation)
            else:
                _complete_health_operation(path, operation)
    document["x-completed-from-contract"] = True
    return document


def _complete_health_operation(path: str, operation: dict[str, Any]) -> None:
    operation_id, description, errors = HEALTH_OPERATIONS[path]
    operation["operationId"] = operation_id
    # Probes carry no token.
    operation["security"] = []
    operation["responses"] = {
        "200": {
            "description": description,
            "content": {"application/json": {"schema": _obj({"status": _STR})}},
        },
        **_problem_answers(
            {
                **_EVERY_REQUEST,
                "431": ["request_header_too_large"],
                "503": ["too_many_connections", *errors.get("503", [])],
            }
        ),
    }


def _complete_api_operation(path: str, method: str, operation: dict[str, Any]) -> None:
    doc = OPERATIONS.get((method, path))
    if doc is None:
        raise RuntimeError(f"http/routes/openapi.py does not describe {method.upper()} {path}")
    operation["operationId"] = doc.operation_id
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
            "required": doc.body_required,
            "content": {doc.body_media_type: {"schema": doc.body}},
        }
    answers: dict[str, Any] = {}
    for status, schema in doc.answers.items():
        answer: dict[str, Any] = {
            "description": doc.answer_description
            if status != "200" or "201" not in doc.answers
            else "The same answer again (idempotent replay)",
            "content": {doc.answer_media_type: {"schema": copy.deepcopy(schema)}},
        }
        if doc.links:
            answer["links"] = copy.deepcopy(doc.links)
        if doc.success_headers and status == "200":
            answer["headers"] = copy.deepcopy(doc.success_headers)
        answers[status] = answer
    answers.update(_problem_answers(doc.errors))
    operation["responses"] = answers


class ContractJsonRenderPlugin(JsonRenderPlugin):
    """Serves ``/schema/openapi.json`` completed by ``complete_openapi``."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        document = complete_openapi(openapi_schema)
        runtime = getattr(request.app.state, "runtime", None)
        if runtime is not None:
            settings = runtime.settings
            document = for_deployment(document, settings.region, settings.object_store_regions)
        return super().render(request, document)


def for_deployment(
    document: dict[str, Any], region: str, store_regions: frozenset[str]
) -> dict[str, Any]:
    """A copy of ``document`` whose definition schema names the regions this deployment
    serves: a ``metadata_home`` other than its region, or an object region without a
    store, is refused (422 ``placement_mismatch``), so the document says so rather than
    describe such a definition as valid."""
    document = copy.deepcopy(document)
    placement = document["components"]["schemas"].get("Placement")
    if placement is None:
        return document
    fields = placement["properties"]
    fields["metadata_home"]["anyOf"][0]["enum"] = [region]
    array = fields["object_regions"]["anyOf"][0]
    if store_regions:
        array["items"]["enum"] = sorted(store_regions)
    else:
        array["maxItems"] = 0
    return document


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
        if is_schema_not_found_handler(value):
            value = _unknown_schema_path
        return super().register(value)
