"""Operator endpoints (scope ``streams:ops``) and the /ops page for people.

JSON endpoints live under the API router and its ``authorize`` guard. The page and its
script and style sheet are served to anyone because they hold no data at all: the
script asks the person for a bearer token, keeps it in ``sessionStorage`` (gone when the
tab closes, never sent as a cookie, so a cross-site form cannot act with it) and calls
the JSON endpoints with ``Authorization: Bearer``. Every figure on the page therefore
passes the same checks as any other API call.

An operator sees the deliveries of their token's tenant and runs only. Payloads are
never listed; one delivery's payload is shown only when the same token could read the
record itself (``streams:read``, a reader of the stream, egress allowed), redacted
unless it also holds ``streams:read_unredacted``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Response, get, post

from ductor_streams import ops
from ductor_streams.errors import EgressDenied, InvalidFilter, NotFound
from ductor_streams.foundation.redaction import redact_json_text
from ductor_streams.http.access import check_egress, principal_of, redaction_for
from ductor_streams.http.codecs.json_bodies import json_body, json_response
from ductor_streams.http.state import runtime_of
from ductor_streams.ops import filters
from ductor_streams.store import StreamKey
from ductor_streams.store.fingerprint import record_fingerprint

# The /ops page's files: http/static/, beside the routes/ folder.
STATIC_DIR = Path(__file__).parent.parent / "static"
DELIVERY = "/ops/deliveries/{delivery_id:str}"
OPS_SCOPE = {"scope": "streams:ops"}


def _view(request: Request[Any, Any, Any]) -> ops.Visibility:
    principal = principal_of(request)
    return ops.Visibility.of(principal.tenant, principal.runs)


def _params(request: Request[Any, Any, Any], allowed: set[str]) -> dict[str, str]:
    """The query parameters, each at most once and all of them known."""
    params: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name in params:
            raise InvalidFilter(f"parameter {name!r} is given twice")
        params[name] = value
    filters.reject_unknown(params, allowed)
    return params


def _delivery_id(request: Request[Any, Any, Any]) -> int:
    raw = request.path_params["delivery_id"]
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise NotFound(f"delivery {raw[:40]!r} does not exist")
    return int(raw)


@get("/ops/deliveries", opt=OPS_SCOPE)
async def list_deliveries(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Deliveries in id order, filtered by ``state``, ``run``, ``stream`` and
    ``older_than`` (seconds), ``limit`` per page, ``page`` from ``next_page``."""
    params = _params(request, {"state", "run", "stream", "older_than", "limit", "page"})
    where = filters.delivery_filter(params)
    limit = filters.parse_limit(params.get("limit"))
    after = filters.parse_page(params.get("page"))
    page = await ops.list_deliveries(
        runtime_of(request).pool, _view(request), where, limit=limit, after=after
    )
    return json_response(page.to_json_dict())


@get(DELIVERY, opt=OPS_SCOPE)
async def show_delivery(request: Request[Any, Any, Any]) -> Response[bytes]:
    """One delivery and its record; the payload only when the token may read it."""
    _params(request, set())
    detail = await ops.get_delivery(runtime_of(request).pool, _view(request), _delivery_id(request))
    body = detail.delivery.to_json_dict()
    body["record"] = await _record_json(request, detail)
    return json_response(body)


async def _record_json(request: Request[Any, Any, Any], detail: ops.DeliveryDetail) -> Any:
    at, size = detail.record_appended_at, detail.record_size
    record: dict[str, Any] = {
        "size": size,
        "appended_at": at.isoformat() if at else None,
        # The record's fingerprint as reads show it (None once retention removed it).
        "fingerprint": (
            record_fingerprint(detail.delivery.sequence, at, size)
            if at is not None and size is not None
            else None
        ),
    }
    payload, hidden = await _visible_payload(request, detail)
    if payload is None:
        record.update(payload_visible=False, payload_hidden_reason=hidden)
    else:
        record.update(payload=msgspec.Raw(payload.encode()), payload_visible=True)
        record["payload_hidden_reason"] = None
    return record


async def _visible_payload(
    request: Request[Any, Any, Any], detail: ops.DeliveryDetail
) -> tuple[str | None, str | None]:
    """``(payload JSON as this caller may see it, None)``, or ``(None, why not)``: the
    same rules as reading the record (scope, readers, egress, redaction)."""
    if detail.payload is None:
        return None, "the record was removed by retention"
    principal = principal_of(request)
    if not principal.has("streams:read"):
        return None, "the token lacks streams:read"
    delivery = detail.delivery
    ref = await runtime_of(request).store.get_stream(
        StreamKey(principal.tenant, delivery.run_id, delivery.stream_id)
    )
    if not ref.definition.may_read(principal.sub):
        return None, "the principal is not among the stream's readers"
    try:
        check_egress(request, ref)
    except EgressDenied:
        return None, "the caller's region may not receive this stream's data"
    redaction = redaction_for(principal_of(request), ref)
    return redact_json_text(detail.payload, redaction), None


class RetryBody(msgspec.Struct, forbid_unknown_fields=True):
    """Nothing to say yet; a body, when sent, must be an empty JSON object."""


@post(DELIVERY + "/retry", opt=OPS_SCOPE, status_code=200)
async def retry_delivery(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Re-queue a dead delivery (dead -> pending); audited with who and when."""
    _params(request, set())
    if await request.body():
        await json_body(request, RetryBody)
    delivery = await ops.retry_delivery(
        runtime_of(request).pool,
        _view(request),
        _delivery_id(request),
        retried_by=principal_of(request).sub,
    )
    return json_response(delivery.to_json_dict())


@get("/ops/gaps", opt=OPS_SCOPE)
async def list_gaps(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Gap evidence recorded by live delivery, newest first (``run``, ``stream``,
    ``limit``, ``page``)."""
    params = _params(request, {"run", "stream", "limit", "page"})
    page = await ops.list_gaps(
        runtime_of(request).pool,
        _view(request),
        filters.gap_filter(params),
        limit=filters.parse_limit(params.get("limit")),
        before=filters.parse_page(params.get("page")),
    )
    return json_response(page.to_json_dict())


@get("/ops/summary", opt=OPS_SCOPE)
async def summary(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Counts by state, the oldest owed delivery's age and per-stream delivery lag
    (``limit`` streams, the longest waiting first)."""
    params = _params(request, {"limit"})
    limit = (
        filters.parse_limit(params["limit"]) if "limit" in params else filters.MAX_SUMMARY_STREAMS
    )
    result = await ops.summarize(runtime_of(request).pool, _view(request), max_streams=limit)
    return json_response(result.to_json_dict())


ROUTES = [list_deliveries, show_delivery, retry_delivery, list_gaps, summary]


# --- the page (no data in it; see the module docstring) -----------------------------

# Litestar appends "; charset=utf-8" to every text/* media type itself: naming it here
# too sent it twice.
_ASSETS = {
    "ops.js": "text/javascript",
    "console.js": "text/javascript",
    "ops.css": "text/css",
    "ops.svg": "image/svg+xml",
}
_PAGE_HEADERS = {
    # Only our own script, style and API: no inline script, no third party, no framing.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",  # as every API answer (http/codecs/headers.py)
}


def page_routes(mount: str) -> list[Any]:
    """The unguarded page handlers, at ``<mount>/ops`` (registered beside the API)."""

    @get(mount + "/ops", include_in_schema=False)
    async def ops_page() -> Response[bytes]:
        """The operator page."""
        html = (STATIC_DIR / "ops.html").read_bytes()
        return Response(html, media_type="text/html", headers=_PAGE_HEADERS)

    @get(mount + "/ops/static/{name:str}", include_in_schema=False)
    async def ops_asset(request: Request[Any, Any, Any]) -> Response[bytes]:
        """The page's script and style sheet (a fixed list: no path from the URL)."""
        name = request.path_params["name"]
        media_type = _ASSETS.get(name)
        if media_type is None:
            raise NotFound(f"no asset {name[:40]!r}")
        return Response(
            (STATIC_DIR / name).read_bytes(), media_type=media_type, headers=_PAGE_HEADERS
        )

    return [ops_page, ops_asset]
