"""Bad input on every route of the route table, against the real server: path IDs with
traversal, unicode and SQL metacharacters, wrong body types, oversized headers and
bodies, bad query parameters. Each is a clear 4xx problem (never a 5xx) and the
database is exactly as it was before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from tests.security.dbstate import fingerprint
from tests.security.routes import ApiRoute, Sample, api_routes, fill_path, sample_for
from tests.security.test_auth_matrix import assert_problem
from tests.security.world import World

ROUTES = api_routes()
BODY_ROUTES = [r for r in ROUTES if r.method in ("POST", "PUT")]

# Path segments as sent on the wire (already percent-encoded where needed).
BAD_SEGMENTS = {
    "encoded_traversal": "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "encoded_slash": "a%2fb",
    "backslash_traversal": "..%5c..%5cwin.ini",
    "unicode": "%E3%82%B9%E3%83%88%E3%83%AA%E3%83%BC%E3%83%A0",
    "accent": "caf%C3%A9",
    "rtl_override": "%E2%80%AEevil",
    "emoji": "%F0%9F%98%80",
    "sql_quote": "x%27%3B%20DROP%20TABLE%20workflow_streams.streams%3B--",
    "sql_or": "x%22%20OR%201%3D1%20--",
    "like_wildcards": "%25_%25",
    "nul": "a%00b",
    "crlf": "a%0d%0aSet-Cookie:%20x=1",
    "invalid_utf8": "%ff%fe",
    "space": "a%20b",
    "star": "*",
    "very_long": "a" * 4000,
}


@pytest.fixture
def pool_(pool: asyncpg.Pool) -> asyncpg.Pool:
    return pool


def assert_clean_4xx(response: httpx.Response, allowed: tuple[int, ...] = ()) -> dict[str, Any]:
    status = response.status_code
    assert 400 <= status < 500, (status, response.text[:500])
    if allowed:
        assert status in allowed, (status, response.text[:500])
    assert response.headers["content-type"].startswith("application/problem+json"), (
        status,
        response.headers.get("content-type"),
        response.text[:200],
    )
    problem: dict[str, Any] = response.json()
    assert problem["status"] == status and problem["code"] and problem["title"], problem
    return problem


def _param_cases() -> Iterator[Any]:
    for route in ROUTES:
        for param in route.params:
            yield pytest.param(route, param, id=f"{route}-{param}")


@pytest.mark.parametrize(("route", "param"), list(_param_cases()))
async def test_bad_path_ids(world: World, pool: asyncpg.Pool, route: ApiRoute, param: str) -> None:
    sample = await sample_for(route)(world)
    values = await world.path_values(route)
    before = await fingerprint(pool, *world.watched)
    for name, segment in BAD_SEGMENTS.items():
        kind = next(k for k in values if k in param.lower())
        path = fill_path(route, {**values, kind: segment})
        request = world.http.build_request(
            route.method,
            "http://placeholder",
            params=sample.params,
            json=sample.json,
            content=sample.content,
            headers={**sample.headers, **world.admin},
        )
        # Send the path exactly as written: no client-side normalisation of dots.
        request.url = request.url.copy_with(raw_path=path.encode() + _query(request.url))
        request.url = httpx.URL(str(world.http.base_url).rstrip("/")).copy_with(
            raw_path=request.url.raw_path
        )
        response = await world.http.send(request)
        problem = assert_clean_4xx(response, (400, 404, 405))
        assert problem["code"] in (
            "not_found",
            "consumer_not_found",
            "method_not_allowed",
            "invalid_request",
        ), (name, problem)
    assert await fingerprint(pool, *world.watched) == before


def _query(url: httpx.URL) -> bytes:
    return b"?" + url.query if url.query else b""


def _swaps(value: Any) -> list[Any]:
    """Values of other JSON types than ``value``."""
    candidates: list[Any] = ["text", 17, -1, 1.5, True, None, [], {}, [1, "a"], {"k": 1}]
    return [c for c in candidates if type(c) is not type(value)]


def _typed_variants(body: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """The body with one field at a time given a value of a wrong type. Free-form fields
    (``payload``, ``metadata``) take any JSON and are left alone."""
    if isinstance(body, dict):
        for key, value in body.items():
            if key in ("payload", "metadata"):
                continue
            for swap in _swaps(value):
                if value is None or swap is None:
                    continue  # null is the value of an omitted optional field
                yield f"{path}/{key}={json.dumps(swap)}", {**body, key: swap}
            if isinstance(value, str):
                # NUL cannot be stored in Postgres text or jsonb: refused, never a 500.
                yield f"{path}/{key}=NUL", {**body, key: value + "\u0000"}
            for where, inner in _typed_variants(value, f"{path}/{key}"):
                yield where, {**body, key: inner}
    elif isinstance(body, list) and body:
        for where, inner in _typed_variants(body[0], f"{path}/0"):
            yield where, [inner, *body[1:]]


RAW_BAD_BODIES: dict[str, bytes] = {
    "not_json": b"{not json",
    "truncated": b'{"records": [',
    "invalid_utf8": b'{"a": "\xff\xfe"}',
    "lone_surrogate": b'{"a": "\\ud800"}',
    "nan": b'{"a": NaN}',
    "deep_nesting": b"[" * 100_000 + b"]" * 100_000,
    "deep_objects": b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
    "array": b"[]",
    "string": b'"text"',
    "number": b"12",
    "null": b"null",
    "true": b"true",
    "empty_object": b"{}",
    "unknown_field": b'{"zzz_unknown": 1}',
    "trailing_garbage": b"{}{}",
    "bom": b'\xef\xbb\xbf{"a": 1}',
}


@pytest.mark.parametrize("route", [r for r in BODY_ROUTES], ids=str)
async def test_bad_bodies(world: World, pool: asyncpg.Pool, route: ApiRoute) -> None:
    sample = await sample_for(route)(world)
    values = await world.path_values(route)
    path = fill_path(route, values)
    headers = {**world.admin, "Content-Type": "application/json"}
    if sample.json is None:
        if sample.content is not None:
            # A raw-bytes route: any bytes but the pinned ones are refused.
            before = await fingerprint(pool, *world.watched)
            for bad in (b"", sample.content + b"x", sample.content[:-1], b"\x00" * 10):
                r = await world.http.request(route.method, path, content=bad, headers=world.admin)
                assert_clean_4xx(r)
            assert await fingerprint(pool, *world.watched) == before
        return
    before = await fingerprint(pool, *world.watched)
    for name, raw in RAW_BAD_BODIES.items():
        r = await world.http.request(
            route.method, path, params=sample.params, content=raw, headers=headers
        )
        assert r.status_code < 500, (name, r.text[:300])
        assert_clean_4xx(r, (400, 413, 422))
    for where, body in _typed_variants(sample.json):
        r = await world.http.request(
            route.method, path, params=sample.params, json=body, headers=headers
        )
        assert r.status_code < 500, (where, r.text[:300])
        assert 400 <= r.status_code, (where, r.text[:300])
        assert_clean_4xx(r, (400, 413, 422))
    assert await fingerprint(pool, *world.watched) == before


@pytest.mark.parametrize("route", [r for r in BODY_ROUTES], ids=str)
async def test_oversized_bodies(world: World, pool: asyncpg.Pool, route: ApiRoute) -> None:
    sample = await sample_for(route)(world)
    if sample.json is None and sample.content is None:
        return  # the route takes no body and never reads one
    path = fill_path(route, await world.path_values(route))
    before = await fingerprint(pool, *world.watched)
    # Over every route's limit (the largest is the append route's 80 MiB).
    size = 81 * 1024 * 1024 if route.key[1].endswith("/records") else 34 * 1024 * 1024
    body = b'{"records": [{"payload": "' + b"x" * size + b'"}]}'
    r = await world.http.request(
        route.method,
        path,
        content=body,
        headers={**world.admin, "Content-Type": "application/json"},
    )
    # A raw-bytes route may answer that the bytes cannot match any object's pins (422).
    assert_clean_4xx(r, (413,) if sample.json is not None else (413, 422))
    del body, sample
    assert await fingerprint(pool, *world.watched) == before


async def test_append_limits(world: World, pool: asyncpg.Pool) -> None:
    before = await fingerprint(pool, *world.watched)
    url = world.url("/records")
    cases = [
        ({"records": []}, 400, "invalid_batch"),
        ({"records": [{"payload": 1}] * 1001}, 400, "invalid_batch"),
        ({"records": [{"payload": "x" * 65_535}]}, 413, "record_too_large"),
        ({"records": [{"payload": 1}, {"payload": "y" * 70_000}]}, 413, "record_too_large"),
        ({"records": [{"payload": 1, "extra": 2}]}, 400, "invalid_body"),
        ({"records": [{}]}, 400, "invalid_body"),
    ]
    for body, status, code in cases:
        r = await world.http.post(url, json=body, headers=world.admin)
        assert_problem(r, r.content, status, code)
    for key in ("", "k" * 256, "ключ", "a\tb"):
        r = await world.http.post(
            url,
            json={"records": [{"payload": 1}]},
            headers={**world.admin, "Idempotency-Key": key.encode("utf-8")},
        )
        assert_problem(r, r.content, 400, "invalid_idempotency_key")
    assert await fingerprint(pool, *world.watched) == before
    # Exactly 65,536 bytes is allowed (the ceiling is the largest allowed value).
    r = await world.http.post(
        url, json={"records": [{"payload": "x" * 65_534}]}, headers=world.admin
    )
    assert r.status_code == 201, r.text


BAD_CURSORS = ["-1", "abc", "1e3", "1.0", "", "99999999999999999999999", "١٢", "0x10", "1 1"]
BAD_LIMITS = ["0", "1001", "-5", "ten", "", "1.5", "99999999999"]
READ_ROUTES = [
    r for r in ROUTES if r.method == "GET" and r.template.endswith(("/records", "/subscribe"))
]


@pytest.mark.parametrize("route", READ_ROUTES, ids=str)
async def test_bad_cursors_and_limits(world: World, route: ApiRoute) -> None:
    path = fill_path(route, await world.path_values(route))
    for cursor in BAD_CURSORS:
        r = await world.http.get(path, params={"cursor": cursor}, headers=world.admin)
        assert_problem(r, r.content, 400, "invalid_cursor")
    if route.template.endswith("/records"):
        for limit in BAD_LIMITS:
            r = await world.http.get(path, params={"limit": limit}, headers=world.admin)
            assert_problem(r, r.content, 400, "invalid_limit")
    else:
        for cursor in ("-1", "x", "1.5"):
            r = await world.http.get(path, headers={**world.admin, "Last-Event-ID": cursor})
            assert_problem(r, r.content, 400, "invalid_cursor")
    r = await world.http.get(path, params={"cursor": "3"}, headers=world.admin)
    assert_problem(r, r.content, 400, "cursor_in_future")


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_oversized_headers(world: World, pool: asyncpg.Pool, route: ApiRoute) -> None:
    """Headers past 32 KiB in all are 431 ``request_header_too_large`` on every route;
    ordinary odd headers are not a 5xx."""
    sample: Sample = await sample_for(route)(world)
    values = await world.path_values(route)
    before = await fingerprint(pool, *world.watched)
    for headers in (
        {"X-Padding": "p" * (256 * 1024)},
        {"X-Padding": "p" * (33 * 1024)},
        {f"X-H{i}": "v" * 100 for i in range(500)},
        {"Authorization": "Bearer " + "a" * (64 * 1024)},
    ):
        response, body = await world.request(
            route, {**world.admin, **headers}, sample=sample, path_values=values
        )
        assert_problem(response, body, 431, "request_header_too_large")
    assert await fingerprint(pool, *world.watched) == before
    response, body = await world.request(
        route,
        {**world.admin, "Content-Type": "application/json; charset=utf-16", "X-Ok": "p" * 8000},
        sample=sample,
        path_values=values,
        read_body=False,
    )
    assert response.status_code < 500, body[:300]


QUERY_NAMES = ["cursor", "limit", "state", "run", "stream", "page", "older_than", "unknown"]
BAD_QUERY_VALUES = ["a\x00b", "%", "'; DROP TABLE x;--", "ストリーム", "9" * 40, "-1", "", "1e9"]
GET_ROUTES = [r for r in ROUTES if r.method == "GET"]


@pytest.mark.parametrize("route", GET_ROUTES, ids=str)
async def test_bad_query_parameters(world: World, pool: asyncpg.Pool, route: ApiRoute) -> None:
    sample = await sample_for(route)(world)
    values = await world.path_values(route)
    before = await fingerprint(pool, *world.watched)
    for name in QUERY_NAMES:
        for value in BAD_QUERY_VALUES:
            response, body = await world.request(
                route,
                world.admin,
                sample=Sample(params={**sample.params, name: value}),
                path_values=values,
                read_body=False,
            )
            assert response.status_code < 500, (name, value, body[:300])
            if response.status_code >= 400:
                assert response.headers["content-type"].startswith(PROBLEM), (name, value)
    assert await fingerprint(pool, *world.watched) == before


PROBLEM = "application/problem+json"
