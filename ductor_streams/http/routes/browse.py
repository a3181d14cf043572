"""Listing streams (scope ``streams:read``): a tenant's streams and one run's.

What a token sees is what it could read one by one: its tenant, the runs its ``runs``
claim covers, and only streams whose ``authorization.readers`` name its principal (or
``*``). Nothing else is listed, counted or hinted at. A run with no stream the token may
see answers 404, as an unknown run does everywhere else. These are metadata answers
(state and ceilings, no payloads), so egress regions do not apply, as for ``getStream``.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from ductor_streams.errors import InvalidFilter, NotFound
from ductor_streams.foundation.definitions import RUN_ID_RE
from ductor_streams.http.access import principal_of
from ductor_streams.http.codecs.json_bodies import json_response
from ductor_streams.http.routes.streams import RUN
from ductor_streams.http.state import runtime_of
from ductor_streams.ops import filters
from ductor_streams.store import browse

READ_SCOPE = {"scope": "streams:read"}
DIRECTIONS = ("input", "output")


def _viewer(request: Request[Any, Any, Any]) -> browse.Viewer:
    principal = principal_of(request)
    runs = None if "*" in principal.runs else tuple(sorted(principal.runs))
    return browse.Viewer(principal.tenant, runs, principal.sub)


def _params(request: Request[Any, Any, Any], allowed: set[str]) -> dict[str, str]:
    """The query parameters, each at most once and all of them known."""
    params: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name in params:
            raise InvalidFilter(f"parameter {name!r} is given twice")
        params[name] = value
    filters.reject_unknown(params, allowed)
    return params


def _run_prefix(raw: str | None) -> str | None:
    # A non-empty prefix of a run ID is itself shaped like a run ID.
    if raw is not None and not RUN_ID_RE.fullmatch(raw):
        raise InvalidFilter("run_prefix is not the beginning of a valid run ID")
    return raw


def _direction(raw: str | None) -> str | None:
    if raw is not None and raw not in DIRECTIONS:
        raise InvalidFilter("direction must be input or output")
    return raw


def _closed(raw: str | None) -> bool | None:
    if raw is None:
        return None
    if raw not in ("true", "false"):
        raise InvalidFilter("closed must be true or false")
    return raw == "true"


@get("/streams", opt=READ_SCOPE)
async def list_streams(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The tenant's streams the token may read, newest activity first: ``run_prefix``,
    ``direction``, ``closed``, ``limit`` per page, ``page`` from ``next_page``."""
    params = _params(request, {"run_prefix", "direction", "closed", "limit", "page"})
    where = browse.StreamFilter(
        run_prefix=_run_prefix(params.get("run_prefix")),
        direction=_direction(params.get("direction")),
        closed=_closed(params.get("closed")),
    )
    page = await browse.list_streams(
        runtime_of(request).pool,
        _viewer(request),
        where,
        limit=filters.parse_limit(params.get("limit")),
        after=browse.parse_page(params.get("page")),
    )
    return json_response(page.to_json_dict())


@get(RUN + "/streams", opt=READ_SCOPE)
async def list_run_streams(request: Request[Any, Any, Any]) -> Response[bytes]:
    """One run's streams with their state (``limit``, ``page``), newest activity first."""
    params = _params(request, {"limit", "page"})
    after = browse.parse_page(params.get("page"))
    run_id = request.path_params["run_id"]
    page = await browse.list_streams(
        runtime_of(request).pool,
        _viewer(request),
        browse.StreamFilter(run_id=run_id),
        limit=filters.parse_limit(params.get("limit")),
        after=after,
    )
    if not page.streams and after is None:
        raise NotFound(f"run {run_id!r} does not exist")
    return json_response(page.to_json_dict())


ROUTES = [list_streams, list_run_streams]
