"""Definition pins on every route, generated from the route table: authorization lists
(readers/writers), egress regions on every path that returns payloads or bytes, and
redaction on every path for callers without ``streams:read_unredacted``."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from ductor_streams.auth import SCOPES
from tests.security.routes import ApiRoute, api_routes
from tests.security.test_auth_matrix import assert_problem, refused
from tests.security.world import World, bearer

ROUTES = api_routes()
STREAM_ROUTES = [r for r in ROUTES if r.stream_scoped]
READER_SCOPES = {"streams:read", "streams:ack"}
WRITER_SCOPES = {"streams:write"}
# The payload paths the contract names; each one that exists must be egress-checked.
PAYLOAD_ROUTES = {
    ("GET", "/runs/{}/streams/{}/records"),
    ("GET", "/runs/{}/streams/{}/subscribe"),
    ("GET", "/runs/{}/streams/{}/objects/{}/content"),
}
HAS_OBJECTS = any("/objects" in r.template for r in ROUTES)


def _pin(route: ApiRoute) -> str:
    if route.scope in READER_SCOPES:
        return "readers"
    if route.scope in WRITER_SCOPES:
        return "writers"
    return "none"


@pytest.mark.parametrize("route", STREAM_ROUTES, ids=str)
async def test_authorization_pins(make_world: Any, pool: asyncpg.Pool, route: ApiRoute) -> None:
    world: World = await make_world(
        authorization={"readers": ["alice", "rita"], "writers": ["alice", "wendy"]}
    )
    answers = {}
    for sub in ("mallory", "rita", "wendy", "alice"):
        if _pin(route) != "none" and sub == "mallory":
            answers[sub] = await refused(world, pool, route, bearer(tenant=world.tenant, sub=sub))
            continue
        response, body = await world.request(
            route, bearer(tenant=world.tenant, sub=sub), read_body=False
        )
        answers[sub] = (response, body)
    allowed = {
        "readers": {"alice", "rita"},
        "writers": {"alice", "wendy"},
        "none": {"alice", "rita", "wendy", "mallory"},
    }[_pin(route)]
    for sub, (response, body) in answers.items():
        if sub in allowed:
            assert response.status_code not in (401, 403, 404), (sub, response.status_code, body)
        else:
            assert_problem(response, body, 403, "forbidden")


async def _closed_world(make_world: Any) -> World:
    """A world whose stream holds marked records (and a committed object with marked
    bytes and metadata, when objects exist) and is closed, so SSE answers end."""
    world: World = await make_world()
    if HAS_OBJECTS:
        await world.committed_object()
    r = await world.http.post(world.url("/close"), headers=world.admin)
    assert r.status_code == 200, r.text
    return world


def test_every_contract_payload_route_that_exists_is_in_the_table() -> None:
    keys = {r.key for r in ROUTES}
    assert ("GET", "/runs/{}/streams/{}/records") in keys
    present = PAYLOAD_ROUTES & keys
    assert present, keys


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_egress(make_world: Any, pool: asyncpg.Pool, route: ApiRoute) -> None:
    world = await _closed_world(make_world)
    local, local_body = await world.request(route, bearer(tenant=world.tenant, region="local"))
    _implicit, implicit_body = await world.request(route, bearer(tenant=world.tenant))
    far, far_body = await refused(
        world, pool, route, bearer(tenant=world.tenant, region="far-away")
    )
    marker = world.open_marker.encode()
    shows_payload = marker in local_body
    assert (marker in implicit_body) == shows_payload  # no region claim = deployment's region
    if route.key in PAYLOAD_ROUTES:
        assert shows_payload, (route, local.status_code, local_body[:300])
    # Whatever the route, nothing of the payload leaves for a region outside the pins;
    # the contract's payload paths refuse outright, operator views may hide the payload.
    assert marker not in far_body, (route, far.status_code, far_body[:300])
    if route.key in PAYLOAD_ROUTES:
        assert_problem(far, far_body, 403, "egress_denied")
    if not shows_payload:
        assert not (far.status_code == 403 and b"egress_denied" in far_body), (
            f"{route} returns no payload but is egress-checked: metadata paths are not"
        )


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_redaction(make_world: Any, route: ApiRoute) -> None:
    world = await _closed_world(make_world)
    without = [s for s in SCOPES if s != "streams:read_unredacted"]
    _redacted, redacted_body = await world.request(
        route, bearer(tenant=world.tenant, scopes=without)
    )
    _full, full_body = await world.request(route, bearer(tenant=world.tenant))
    secret = world.secret_marker.encode()
    assert secret not in redacted_body, (route, redacted_body[:500])
    if world.open_marker.encode() in full_body and route.key != (
        "GET",
        "/runs/{}/streams/{}/objects/{}/content",
    ):
        # A JSON payload path: the unredacted caller sees the secret, the other sees
        # the same document with the pointer's value replaced.
        assert secret in full_body
        assert b'"secret":"[REDACTED]"' in redacted_body.replace(b" ", b"")


async def test_redaction_of_records_is_exact(make_world: Any) -> None:
    world: World = await make_world(
        records=0,
        redaction={"json_pointers": ["/a/b", "/list/1", "/missing/x", "/k~1ey", "/t~0ilde"]},
    )
    payload = {
        "a": {"b": {"deep": world.secret_marker}, "c": 1},
        "list": [0, world.secret_marker, 2],
        "k/ey": world.secret_marker,
        "t~ilde": world.secret_marker,
        "z": "open",
    }
    r = await world.http.post(
        world.url("/records"), json={"records": [{"payload": payload}]}, headers=world.admin
    )
    assert r.status_code == 201, r.text
    without = [s for s in SCOPES if s != "streams:read_unredacted"]
    r = await world.http.get(
        world.url("/records"), headers=bearer(tenant=world.tenant, scopes=without)
    )
    assert r.status_code == 200, r.text
    assert r.json()["records"][0]["payload"] == {
        "a": {"b": "[REDACTED]", "c": 1},
        "list": [0, "[REDACTED]", 2],
        "k/ey": "[REDACTED]",
        "t~ilde": "[REDACTED]",
        "z": "open",
    }
    r = await world.http.get(world.url("/records"), headers=world.admin)
    assert r.json()["records"][0]["payload"] == payload
    assert json.dumps(payload, separators=(",", ":")).encode() in r.content.replace(b" ", b"")


async def test_operator_delivery_view_shows_a_payload_only_to_its_readers(make_world: Any) -> None:
    world: World = await make_world(authorization={"readers": ["alice"], "writers": ["alice"]})
    delivery = await world.delivery_id()
    path = f"/api/workflow-streams/ops/deliveries/{delivery}"
    marker = world.open_marker
    cases = [
        (bearer(tenant=world.tenant, sub="alice"), True),
        (bearer(tenant=world.tenant, sub="mallory"), False),
        (bearer(tenant=world.tenant, sub="alice", scopes=["streams:ops"]), False),
        (bearer(tenant=world.tenant, sub="alice", region="far-away"), False),
    ]
    for headers, visible in cases:
        r = await world.http.get(path, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["record"]["payload_visible"] is visible, r.json()["record"]
        assert (marker in r.text) is visible
        assert world.secret_marker not in r.text or visible
