"""Small hardening points, each against the real server: IDs are matched whole (no
trailing newline slips through ``$``), the token's time claims are numbers within range,
every response carries ``nosniff`` (and ``no-store`` under the API), a content type
names its charset at most once, and every unknown route (the documentation UIs under
``/schema`` included) answers an RFC 9457 ``not_found`` problem."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import jwt
import pytest

from ductor_streams.auth import SCOPES
from tests.conftest import API, JWT_SECRET
from tests.security.dbstate import fingerprint
from tests.security.routes import api_routes
from tests.security.test_auth_matrix import assert_problem
from tests.security.world import CONSUMER, World

# --- IDs are matched whole --------------------------------------------------------------


async def test_ids_ending_in_a_newline_name_nothing(world: World, pool: asyncpg.Pool) -> None:
    """``re.match`` with ``$`` takes "run-1\\n" for "run-1"; every ID check is a full
    match, so a trailing newline (%0A in the path) is an ID that cannot exist: 404."""
    http, admin, run, stream = world.http, world.admin, world.run_id, world.stream_id
    before = await fingerprint(pool, *world.watched)
    definition = {"stream_id": "fresh", "direction": "output"}
    refused: list[tuple[str, str, Any]] = [
        ("POST", f"{API}/runs/{run}%0A/streams", definition),
        ("GET", f"{API}/runs/{run}%0A/streams/{stream}", None),
        # The records front (appends and reads) checks IDs itself.
        ("POST", f"{API}/runs/{run}%0A/streams/{stream}/records", {"records": [{"payload": 1}]}),
        ("GET", f"{API}/runs/{run}%0A/streams/{stream}/records", None),
        ("POST", f"{API}/runs/{run}/streams/{stream}%0A/records", {"records": [{"payload": 1}]}),
        ("GET", f"{API}/runs/{run}/streams/{stream}%0A/records", None),
        ("GET", f"{API}/runs/{run}/streams/{stream}%0A", None),
    ]
    for method, path, body in refused:
        response = await http.request(method, path, json=body, headers=admin)
        assert_problem(response, response.content, 404, "not_found")
    # A consumer ID that cannot exist is an unknown consumer of a known stream.
    response = await http.post(
        world.url(f"/consumers/{CONSUMER}%0A/ack"), json={"sequence": 1}, headers=admin
    )
    assert_problem(response, response.content, 404, "consumer_not_found")
    assert await fingerprint(pool, *world.watched) == before
    for name in ("run", "stream"):
        response = await http.get(f"{API}/ops/deliveries", params={name: f"{run}\n"}, headers=admin)
        assert_problem(response, response.content, 400, "invalid_filter")


async def test_object_pins_ending_in_a_newline_are_refused(
    world: World, pool: asyncpg.Pool
) -> None:
    """A content type is sent back as a header at download: "text/plain\n" must never be
    stored. The same full match applies to the digest."""
    before = await fingerprint(pool, *world.watched)
    data = b"pinned"
    for change in (
        {"content_type": "text/plain\n"},
        {"sha256": hashlib.sha256(data).hexdigest() + "\n"},
    ):
        response = await world.http.post(
            world.url("/objects"), json={**world.object_pins(data), **change}, headers=world.admin
        )
        assert_problem(response, response.content, 400, "invalid_request")
    assert await fingerprint(pool, *world.watched) == before


def test_no_id_pattern_is_checked_with_match() -> None:
    """``.match`` of an anchored pattern accepts a final newline: IDs use ``fullmatch``."""
    root = Path(__file__).resolve().parents[2] / "ductor_streams"
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"_RE\.match\(", line)
    ]
    assert offenders == []


# --- the token's time claims --------------------------------------------------------------


def _token(world: World, **claims: Any) -> dict[str, str]:
    now = int(time.time())
    body = {
        "sub": "alice",
        "tenant": world.tenant,
        "scopes": list(SCOPES),
        "runs": ["*"],
        "iat": now,
        "exp": now + 600,
        **claims,
    }
    return {"Authorization": "Bearer " + jwt.encode(body, JWT_SECRET, algorithm="HS256")}


BAD_TIME_CLAIMS = {
    "exp_huge_int": {"exp": 10**400},
    "exp_string": {"exp": "99999999999"},
    "exp_numeric_string_soon": {"exp": str(int(time.time()) + 600)},
    "exp_true": {"exp": True},
    "exp_null": {"exp": None},
    "exp_list": {"exp": [99999999999]},
    "exp_past_year_9999": {"exp": 253_402_300_800},
    "exp_huge_float": {"exp": 1e300},
    "nbf_huge_int": {"nbf": 10**400},
    "nbf_string": {"nbf": "1"},
    "nbf_true": {"nbf": True},
    "nbf_negative": {"nbf": -1},
    "iat_huge_int": {"iat": 10**400},
    "iat_string": {"iat": "1"},
    "iat_false": {"iat": False},
    "iat_negative": {"iat": -5},
}


@pytest.mark.parametrize("claims", BAD_TIME_CLAIMS.values(), ids=BAD_TIME_CLAIMS.keys())
async def test_time_claims_must_be_numbers_in_range(world: World, claims: dict[str, Any]) -> None:
    response = await world.http.get(world.url(), headers=_token(world, **claims))
    assert_problem(response, response.content, 401, "unauthenticated")
    # The records front verifies tokens the same way.
    response = await world.http.get(
        world.url("/records"), params={"cursor": "0"}, headers=_token(world, **claims)
    )
    assert_problem(response, response.content, 401, "unauthenticated")


@pytest.mark.parametrize(
    "claims",
    # Callables, so each time is read when the test runs: read at collection, a claim
    # 600 s ahead had already passed when a long suite reached this test.
    [
        lambda: {},
        lambda: {"exp": time.time() + 600.5},
        lambda: {"nbf": int(time.time()) - 5},
        lambda: {"iat": 0},
    ],
    ids=["plain", "fractional_exp", "nbf_past", "iat_epoch"],
)
async def test_time_claims_in_range_are_accepted(
    world: World, claims: Callable[[], dict[str, Any]]
) -> None:
    response = await world.http.get(world.url(), headers=_token(world, **claims()))
    assert response.status_code == 200, response.text


# --- headers of every response --------------------------------------------------------------


def _assert_headers(response: httpx.Response, *, api: bool) -> None:
    what = f"{response.request.method} {response.request.url.path} -> {response.status_code}"
    assert response.headers.get_list("x-content-type-options") == ["nosniff"], what
    if api:
        assert response.headers.get_list("cache-control") == ["no-store"], what
    content_type = response.headers.get("content-type", "")
    assert content_type.lower().count("charset") <= 1, (what, content_type)


async def test_every_api_response_is_nosniff_and_no_store(world: World) -> None:
    """Every route of the route table (payload routes, the records front, SSE, object
    content, operator views, problems) and the operator page with its assets."""
    routes = api_routes()
    last = [r for r in routes if r.template.endswith(("/subscribe", "/close"))]
    last.sort(key=lambda r: r.template.endswith("/subscribe"))  # close, then subscribe
    seen = 0
    for route in [r for r in routes if r not in last] + last:
        world.forget_object()
        response, _ = await world.request(route, world.admin)
        _assert_headers(response, api=True)
        seen += 1
    assert seen == len(routes)
    for path in ("/ops", "/ops/static/ops.js", "/ops/static/ops.css", "/ops/static/nope"):
        _assert_headers(await world.http.get(API + path), api=True)
    # Problems: no token, an unknown stream, a bad body on the records front.
    _assert_headers(await world.http.get(world.url()), api=True)
    _assert_headers(
        await world.http.get(f"{API}/runs/{world.run_id}/streams/nope", headers=world.admin),
        api=True,
    )
    _assert_headers(
        await world.http.post(world.url("/records"), content=b"{", headers=world.admin), api=True
    )


async def test_responses_outside_the_api_are_nosniff(http: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/schema/openapi.json", "/nope"):
        _assert_headers(await http.get(path), api=False)


async def test_a_text_object_downloads_with_its_own_content_type_once(world: World) -> None:
    """The uploader's text/* type, charset included, exactly: Litestar used to append a
    second ``charset=utf-8`` to it."""
    data = "grüße".encode("latin-1")
    content_type = "text/plain; charset=iso-8859-1"
    pins = {
        **world.object_pins(data),
        "content_type": content_type,
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    response = await world.http.post(world.url("/objects"), json=pins, headers=world.admin)
    assert response.status_code == 201, response.text
    object_id = response.json()["object_id"]
    response = await world.http.put(
        world.url(f"/objects/{object_id}/content"),
        content=data,
        headers={**world.admin, "Content-Type": content_type},
    )
    assert response.status_code == 200, response.text
    response = await world.http.post(world.url(f"/objects/{object_id}/commit"), headers=world.admin)
    assert response.status_code == 201, response.text
    response = await world.http.get(world.url(f"/objects/{object_id}/content"), headers=world.admin)
    assert response.status_code == 200, response.text
    assert response.headers.get_list("content-type") == [content_type]
    assert response.content == data
    _assert_headers(response, api=True)


# --- unknown routes ----------------------------------------------------------------------

UNKNOWN = [
    "/schema/swagger",
    "/schema/redoc",
    "/schema/elements",
    "/schema/rapidoc",
    "/schema/stoplight",
    "/schema/scalar",
    "/schema/openapi.yaml",
    "/schema/openapi.yml",
    "/schema/nope",
    "/nope",
    "/api/nope",
    f"{API}/nope",
    f"{API}/ops/nope",
]


@pytest.mark.parametrize("path", UNKNOWN)
async def test_every_unknown_route_answers_a_problem(http: httpx.AsyncClient, path: str) -> None:
    response = await http.get(path)
    problem = assert_problem(response, response.content, 404, "not_found")
    assert response.headers["content-type"] == "application/problem+json"
    assert problem["type"] == "https://ductor.dev/problems/not_found"
    assert problem["instance"] == path
    _assert_headers(response, api=path.startswith(API))


async def test_the_openapi_document_is_still_served(http: httpx.AsyncClient) -> None:
    response = await http.get("/schema/openapi.json")
    assert response.status_code == 200
    document = json.loads(response.content)
    assert f"{API}/runs/{{run_id}}/streams" in document["paths"]
    assert not any(path.startswith("/schema") for path in document["paths"])
