"""Who may do what: authentication, run visibility, scopes, definition pins, egress.

Order matters (docs/security.md): a bad token is 401; a run the token does not
cover, another tenant's stream or an unknown one is 404 (existence is never revealed);
a missing scope or a principal outside the definition's lists is 403; a token region
outside ``client_egress_regions`` on a payload path is 403 ``egress_denied``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Literal

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from ductor_streams.auth import Principal
from ductor_streams.compat.uvicorn_protocol import note_tenant
from ductor_streams.errors import (
    EgressDenied,
    Forbidden,
    HeadersTooLarge,
    NotFound,
    Unauthenticated,
)
from ductor_streams.foundation.definitions import RUN_ID_RE, STREAM_ID_RE
from ductor_streams.foundation.logs import stream_fields
from ductor_streams.http.state import runtime_of
from ductor_streams.http.tokens import VERIFIED_TOKENS
from ductor_streams.store import Store, StreamKey, StreamRef

Access = Literal["read", "write", "admin"]
log = logging.getLogger(__name__)
# Room for an 8 KiB token and ordinary headers many times over.
MAX_HEADER_BYTES = 32 * 1024


async def authorize(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Route guard: verifies the token and the route's scope (``opt["scope"]``).

    Async on purpose although it never awaits: Litestar runs a sync guard in a worker
    thread, a thread hand-off on every request (docs/decisions.md, "The HTTP path")."""
    principal = authenticate(
        connection.scope["headers"],
        connection.path_params.get("run_id"),
        handler.opt.get("scope"),
        runtime_of(connection).settings.require_jwt_secret(),
    )
    connection.state.principal = principal
    note_tenant(connection.scope, principal.tenant)


def authenticate(
    raw_headers: Iterable[tuple[bytes, bytes]],
    run_id: str | None,
    scope: str | None,
    secret: str,
) -> Principal:
    """The request's principal, checked in the contract's order (401, 404, 403).

    ``raw_headers`` are the ASGI scope's; ``run_id`` the path's, if it names a run;
    ``scope`` the one the route requires."""
    # The HTTP server sets no limit on header size: refuse what no client needs.
    size = 0
    authorization = None
    for name, value in raw_headers:
        size += len(name) + len(value)
        if authorization is None and name.lower() == b"authorization":
            authorization = value.decode("latin-1")
    if size > MAX_HEADER_BYTES:
        raise HeadersTooLarge(f"the request's headers exceed {MAX_HEADER_BYTES} bytes")
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("a bearer token is required")
    principal = VERIFIED_TOKENS.principal(secret, token.strip())
    if run_id is not None and (not RUN_ID_RE.fullmatch(run_id) or not principal.sees_run(run_id)):
        raise NotFound(f"run {run_id!r} does not exist")
    if scope is None or not principal.has(scope):
        raise Forbidden(f"the token lacks the scope {scope!r}")
    return principal


def bearer_tenant(secret: str, raw_headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The tenant of the request's bearer token when the token is valid, else None (no
    other check: the connection guard's view of who is asking, at the cap)."""
    for name, value in raw_headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return None
            try:
                return VERIFIED_TOKENS.principal(secret, token.strip()).tenant
            except Unauthenticated:
                return None
    return None


def principal_of(request: Request[Any, Any, Any]) -> Principal:
    principal: Principal = request.state.principal
    return principal


async def stream_for(request: Request[Any, Any, Any], access: Access) -> StreamRef:
    """The stream named by the path, if this principal may use it as ``access``."""
    return await resolve_stream(
        runtime_of(request).store,
        principal_of(request),
        request.path_params["run_id"],
        request.path_params["stream_id"],
        access,
        request.method,
    )


async def resolve_stream(
    store: Store,
    principal: Principal,
    run_id: str,
    stream_id: str,
    access: Access,
    method: str,
) -> StreamRef:
    """The stream ``run_id``/``stream_id`` of the principal's tenant, if the principal may
    use it as ``access``: NotFound for an unknown one, Forbidden outside its lists."""
    if not STREAM_ID_RE.fullmatch(stream_id):
        raise NotFound(f"stream {stream_id!r} does not exist")
    ref = await store.get_stream(StreamKey(principal.tenant, run_id, stream_id))
    definition = ref.definition
    if access == "read" and not definition.may_read(principal.sub):
        raise Forbidden("the principal is not among the stream's readers")
    if access == "write" and not definition.may_write(principal.sub):
        raise Forbidden("the principal is not among the stream's writers")
    if log.isEnabledFor(logging.DEBUG):  # cheap when off: this is every request's path
        log.debug(
            "stream access",
            extra={
                **stream_fields(
                    principal.tenant, run_id, stream_id, definition.placement.log_region
                ),
                "access": access,
                "sub": principal.sub,
                "method": method,
            },
        )
    return ref


def check_egress(request: Request[Any, Any, Any], ref: StreamRef) -> None:
    """Payload paths only: the caller's region must be an allowed egress region."""
    egress_check(principal_of(request), runtime_of(request).settings.region, ref)


def egress_check(principal: Principal, home_region: str, ref: StreamRef) -> None:
    """EgressDenied unless the principal's region may receive the stream's data.

    A token without a ``region`` claim is taken to be in this deployment's region
    (``home_region``)."""
    region = principal.region or home_region
    if not ref.definition.allows_egress(region):
        raise EgressDenied(f"region {region!r} may not receive this stream's data")


def redaction_for(principal: Principal, ref: StreamRef) -> list[str]:
    """The JSON pointers to redact from this principal's view of the stream's payloads."""
    if principal.has("streams:read_unredacted"):
        return []
    return list(ref.definition.redaction.json_pointers)
