"""The auth matrix, generated from the app's route table: every API route x {no token,
bad signature, expired, malformed, wrong scheme, wrong tenant, wrong run, missing scope},
with the exact status and ``code`` (docs/security.md), plus a positive control
per route so that each refusal is a refusal of a request that would otherwise succeed."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import jwt
import pytest

from ductor_streams.auth import SCOPES
from tests.conftest import API, JWT_SECRET
from tests.security.dbstate import fingerprint
from tests.security.routes import PUBLIC_ROUTES, ApiRoute, Sample, api_routes, sample_for
from tests.security.world import World, bearer

ROUTES = api_routes()


@pytest.fixture
async def http(in_process_server: Any) -> AsyncIterator[httpx.AsyncClient]:
    # What the app answers, over real HTTP from this process: the matrix is in the
    # fast tier (the process's own behaviour is tested against ServerProcess).
    async with httpx.AsyncClient(base_url=in_process_server.url, timeout=30) as client:
        yield client


def test_route_table_is_not_empty_and_every_route_declares_a_known_scope() -> None:
    assert len(ROUTES) >= 7, [str(r) for r in ROUTES]
    for route in ROUTES:
        assert route.scope in SCOPES, f"{route} declares no known opt['scope']: {route.scope!r}"
        sample_for(route)  # fails with a clear message when a route has no sample


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _unauthenticated_headers(world: World) -> dict[str, dict[str, str]]:
    now = int(time.time())
    claims = {"sub": "alice", "tenant": world.tenant, "scopes": list(SCOPES), "runs": ["*"]}
    return {
        "no_token": {},
        "bad_signature": bearer(tenant=world.tenant, secret="another-secret-" + "y" * 32),
        "expired": {
            "Authorization": "Bearer "
            + jwt.encode({**claims, "exp": now - 5, "iat": now - 100}, JWT_SECRET, "HS256")
        },
        "malformed": {"Authorization": "Bearer not.a.jwt"},
        "garbage": {"Authorization": "Bearer " + "A" * 64},
        "wrong_scheme": {"Authorization": "Basic " + base64.b64encode(b"alice:pw").decode()},
        "empty_bearer": {"Authorization": "Bearer"},
        "alg_none": {
            "Authorization": "Bearer "
            + _b64({"alg": "none", "typ": "JWT"})
            + "."
            + _b64({**claims, "exp": now + 600})
            + "."
        },
    }


UNAUTH_CASES = [
    "no_token",
    "bad_signature",
    "expired",
    "malformed",
    "garbage",
    "wrong_scheme",
    "empty_bearer",
    "alg_none",
]


async def refused(
    world: World, pool: asyncpg.Pool, route: ApiRoute, headers: dict[str, str]
) -> tuple[Any, bytes]:
    """Send the route's sample request (made first: making it may prepare an object)
    with ``headers``, and check that the database is exactly as before."""
    sample = await sample_for(route)(world)
    values = await world.path_values(route)
    before = await fingerprint(pool, *world.watched)
    response, body = await world.request(route, headers, sample=sample, path_values=values)
    if response.status_code >= 400:
        assert await fingerprint(pool, *world.watched) == before, (
            f"{route}: a refused request changed data"
        )
    return response, body


def assert_problem(response: Any, body: bytes, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, body[:500])
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    problem: dict[str, Any] = json.loads(body)
    assert problem["code"] == code, problem
    assert problem["status"] == status
    assert problem["title"] and problem["detail"]
    return problem


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_positive_control(world: World, route: ApiRoute) -> None:
    response, body = await world.request(route, world.admin, read_body=False)
    assert 200 <= response.status_code < 300 or (
        route.key == ("POST", "/ops/deliveries/{}/retry") and response.status_code == 409
    ), (response.status_code, body[:500])


@pytest.mark.parametrize("case", UNAUTH_CASES)
@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_unauthenticated(
    world: World, pool: asyncpg.Pool, route: ApiRoute, case: str
) -> None:
    headers = _unauthenticated_headers(world)[case]
    response, body = await refused(world, pool, route, headers)
    problem = assert_problem(response, body, 401, "unauthenticated")
    assert world.open_marker not in body.decode(errors="replace")
    assert problem["status"] == 401


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_wrong_tenant_is_not_found(world: World, pool: asyncpg.Pool, route: ApiRoute) -> None:
    other = bearer(tenant=world.tenant + "-other")
    if route.run_scoped and not route.stream_scoped and route.method == "POST":
        # Creating: another tenant's run/stream ID is free in this tenant. The same
        # stream ID with another definition is a new stream (201), never a 409 that would
        # reveal the first tenant's stream.
        sample = Sample(json={"stream_id": world.stream_id, "direction": "input"})
        response, body = await world.request(route, other, sample=sample)
        assert response.status_code == 201, body[:500]
        assert json.loads(body)["definition"]["direction"] == "input"
        mine, body = await world.request(route, world.admin, sample=sample)
        assert_problem(mine, body, 409, "definition_conflict")
        return
    await _seed_operator_data(world, pool, route)
    response, body = await refused(world, pool, route, other)
    _assert_hidden(world, route, response, body)


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_wrong_run_is_not_found(world: World, pool: asyncpg.Pool, route: ApiRoute) -> None:
    other = bearer(tenant=world.tenant, runs=[world.run_id + "-other", "run-x"])
    await _seed_operator_data(world, pool, route)
    response, body = await refused(world, pool, route, other)
    _assert_hidden(world, route, response, body)


async def _seed_operator_data(world: World, pool: asyncpg.Pool, route: ApiRoute) -> None:
    """For routes without a run in the path (operator views): give the world a delivery
    and gap evidence, and check its own token sees the run, so that "not shown to
    others" is a real refusal and not an empty answer."""
    if route.run_scoped:
        return
    await world.delivery_id()
    await pool.execute(
        "INSERT INTO workflow_streams.gap_evidence"
        " (stream_pk, expected_sequence, received_sequence, repaired_records, detected_by)"
        " SELECT stream_pk, 1, 2, 1, 'security-test' FROM workflow_streams.streams"
        " WHERE tenant = $1 AND run_id = $2 AND stream_id = $3",
        world.tenant,
        world.run_id,
        world.stream_id,
    )
    if route.method == "GET" and "{}" not in route.template:
        response, body = await world.request(route, world.admin)
        assert response.status_code == 200, body[:300]
        assert world.run_id.encode() in body, (route, body[:300])


def _assert_hidden(world: World, route: ApiRoute, response: Any, body: bytes) -> None:
    if route.run_scoped:
        assert_problem(response, body, 404, "not_found")
        return
    # Routes without a run in the path (operator views) must not show this run at all.
    text = body.decode(errors="replace")
    if response.status_code == 404:
        assert_problem(response, body, 404, "not_found")
    else:
        assert 200 <= response.status_code < 300, (response.status_code, text[:500])
    assert world.run_id not in text and world.open_marker not in text, text[:500]


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_missing_scope_is_forbidden(
    world: World, pool: asyncpg.Pool, route: ApiRoute
) -> None:
    scopes = [s for s in SCOPES if s != route.scope]
    response, body = await refused(world, pool, route, bearer(tenant=world.tenant, scopes=scopes))
    assert_problem(response, body, 403, "forbidden")


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_only_its_own_scope_is_enough(world: World, route: ApiRoute) -> None:
    assert route.scope is not None
    headers = bearer(tenant=world.tenant, scopes=[route.scope])
    response, body = await world.request(route, headers, read_body=False)
    assert response.status_code not in (401, 403, 404), (response.status_code, body[:500])


def test_only_the_listed_data_free_routes_are_public() -> None:
    public = {r.key for r in api_routes(include_public=True) if r.scope is None}
    assert public <= PUBLIC_ROUTES, public - PUBLIC_ROUTES


@pytest.mark.parametrize("key", sorted(PUBLIC_ROUTES))
async def test_public_routes_hold_no_data(world: World, key: tuple[str, str]) -> None:
    method, template = key
    path = API + template.replace("{}", "ops.js")
    for headers in ({}, world.admin):
        response = await world.http.request(method, path, headers=headers)
        assert response.status_code in (200, 404), response.text[:300]
        for secret in (world.run_id, world.tenant, world.open_marker, JWT_SECRET):
            assert secret not in response.text
