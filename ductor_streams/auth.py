"""Bearer tokens: HS256 JWTs naming the principal, tenant, scopes, runs and region."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jwt

from ductor_streams.errors import Unauthenticated

ALGORITHM = "HS256"
MAX_TOKEN_LENGTH = 8192
# The latest time a token's ``exp``, ``nbf`` or ``iat`` may name: 9999-12-31T23:59:59Z,
# the last second that dates and float seconds still represent exactly.
MAX_NUMERIC_DATE = 253_402_300_799
_TIME_CLAIMS = ("exp", "nbf", "iat")
SCOPES = (
    "streams:read",
    "streams:write",
    "streams:ack",
    "streams:admin",
    "streams:read_unredacted",
    "streams:ops",
)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, as the token says."""

    sub: str
    tenant: str
    scopes: frozenset[str]
    runs: frozenset[str]
    region: str | None

    def sees_run(self, run_id: str) -> bool:
        return "*" in self.runs or run_id in self.runs

    def has(self, scope: str) -> bool:
        return scope in self.scopes


def issue_token(
    secret: str,
    *,
    sub: str,
    tenant: str,
    scopes: list[str],
    runs: list[str],
    region: str | None = None,
    ttl_seconds: int = 3600,
) -> str:
    """Sign a bearer token (used by ``ductor-streams token``, ``dev`` and tests)."""
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": sub,
        "tenant": tenant,
        "scopes": list(scopes),
        "runs": list(runs),
        "iat": now,
        "exp": now + ttl_seconds,
    }
    if region is not None:
        claims["region"] = region
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def _str_list(claims: dict[str, Any], name: str) -> frozenset[str]:
    value = claims.get(name)
    if not isinstance(value, list) or not all(isinstance(v, str) and _clean(v) for v in value):
        raise Unauthenticated(f"the token's {name!r} claim must be a list of strings")
    return frozenset(value)


def _clean(text: str) -> bool:
    # NUL cannot reach Postgres (tenant and runs are query parameters): a token that
    # carries one is malformed, not a server error.
    return "\x00" not in text


def _check_times(claims: dict[str, Any]) -> None:
    # PyJWT compares int(claim) with the clock: it takes "99999999999" (a string) and
    # true, and an ``exp`` of 10**400 passed it only to overflow float() later (a 500).
    # RFC 7519 NumericDate is a JSON number: refuse anything else, and any time outside
    # 0 .. MAX_NUMERIC_DATE.
    for name in _TIME_CLAIMS:
        if name not in claims:
            continue
        value = claims[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Unauthenticated(f"the token's {name!r} claim must be a number")
        if not 0 <= value <= MAX_NUMERIC_DATE:  # also false for NaN
            raise Unauthenticated(f"the token's {name!r} claim is out of range")


def verify_token(secret: str, token: str) -> Principal:
    """Check signature (HS256 only: no ``none``, no algorithm confusion), expiry, the
    time claims (``exp``, ``nbf``, ``iat``: numbers within range) and claim types. Any
    failure is Unauthenticated."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        raise Unauthenticated("missing or oversized bearer token")
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            # ``exp`` is required: a token that never expires cannot be contained.
            options={"require": ["sub", "tenant", "scopes", "runs", "exp"]},
        )
    except jwt.ExpiredSignatureError:
        raise Unauthenticated("the bearer token has expired") from None
    except jwt.PyJWTError:
        raise Unauthenticated("the bearer token is invalid") from None
    _check_times(claims)
    sub, tenant, region = claims.get("sub"), claims.get("tenant"), claims.get("region")
    if not (isinstance(sub, str) and sub and _clean(sub)) or not (
        isinstance(tenant, str) and tenant and _clean(tenant)
    ):
        raise Unauthenticated("the token's sub and tenant must be non-empty strings")
    if region is not None and not (isinstance(region, str) and _clean(region)):
        raise Unauthenticated("the token's region must be a string")
    return Principal(
        sub=sub,
        tenant=tenant,
        scopes=_str_list(claims, "scopes"),
        runs=_str_list(claims, "runs"),
        region=region,
    )
