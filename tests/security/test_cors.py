"""CORS (http/middleware/cors.py) against real server subprocesses: one with a list of origins, one
with ``*``, and the session's server without the setting. Preflights and actual answers,
listed and unlisted origins, on the records front (append and read), Litestar routes,
SSE, a route that does not exist yet, and problems (401, 404)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from ductor_streams.config import ConfigError, Settings
from ductor_streams.http.middleware.cors import (
    ALLOWED_METHODS,
    ALLOWED_REQUEST_HEADERS,
    EXPOSED_RESPONSE_HEADERS,
    CorsPolicy,
)
from tests.support.live import API, append, create_stream, stream_url
from tests.support.server import ServerProcess

LISTED = "https://app.example.com"
OTHER_LISTED = "http://localhost:5173"
UNLISTED = "https://evil.example.net"


@pytest.fixture(scope="module")
def listed_server(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log = tmp_path_factory.mktemp("cors-listed") / "server.log"
    env = {"DUCTOR_STREAMS_CORS_ORIGINS": f"{LISTED}, {OTHER_LISTED}"}
    with ServerProcess(settings, extra_env=env, log_path=log) as proc:
        yield proc


@pytest.fixture(scope="module")
def star_server(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log = tmp_path_factory.mktemp("cors-star") / "server.log"
    with ServerProcess(
        settings, extra_env={"DUCTOR_STREAMS_CORS_ORIGINS": "*"}, log_path=log
    ) as proc:
        yield proc


@pytest.fixture
async def listed(listed_server: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=listed_server.url, timeout=30) as client:
        yield client


@pytest.fixture
async def star(star_server: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=star_server.url, timeout=30) as client:
        yield client


@pytest.fixture
async def unset(server: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        yield client


def preflight_headers(origin: str, method: str, headers: str) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": headers,
    }


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def listed_values(value: str) -> list[str]:
    return [part.strip().lower() for part in value.split(",")]


def assert_allowed_answer(response: httpx.Response, origin: str) -> None:
    """An actual (not preflight) answer readable by a page of ``origin``."""
    assert response.headers["access-control-allow-origin"] == origin
    assert listed_values(response.headers["access-control-expose-headers"]) == [
        h.lower() for h in EXPOSED_RESPONSE_HEADERS
    ]
    assert "access-control-allow-credentials" not in response.headers
    if origin != "*":
        assert "origin" in listed_values(response.headers["vary"])


def assert_no_allow(response: httpx.Response) -> None:
    assert cors_headers(response) == {}


# -- a list of origins ---------------------------------------------------------------------


async def test_preflight_from_a_listed_origin_is_204_without_a_token(
    listed: httpx.AsyncClient, run_id: str
) -> None:
    paths_methods = [
        (stream_url(run_id, "out") + "/records", "POST"),  # the records front's route
        (stream_url(run_id, "out") + "/records", "GET"),
        (stream_url(run_id, "out") + "/subscribe", "GET"),  # SSE
        (f"{API}/runs/{run_id}/streams", "POST"),  # a Litestar route
        (f"{API}/runs/{run_id}/ds/v1/stream/out", "PUT"),  # the Durable Streams routes
        ("/healthz", "GET"),
    ]
    wanted = ", ".join(ALLOWED_REQUEST_HEADERS).lower()
    for origin in (LISTED, OTHER_LISTED):
        for path, method in paths_methods:
            r = await listed.options(path, headers=preflight_headers(origin, method, wanted))
            assert r.status_code == 204, (origin, path, r.text)
            assert r.content == b""
            assert r.headers["access-control-allow-origin"] == origin
            assert "origin" in listed_values(r.headers["vary"])
            methods = listed_values(r.headers["access-control-allow-methods"])
            assert methods == [m.lower() for m in ALLOWED_METHODS]
            allowed = listed_values(r.headers["access-control-allow-headers"])
            assert allowed == [h.lower() for h in ALLOWED_REQUEST_HEADERS]
            for needed in (
                "authorization",
                "content-type",
                "idempotency-key",
                "last-event-id",
                "if-none-match",
                "x-request-id",
                "traceparent",
                "stream-seq",
                "stream-closed",
                "producer-id",
                "producer-epoch",
                "producer-seq",
            ):
                assert needed in allowed
            assert int(r.headers["access-control-max-age"]) > 0
            assert "access-control-allow-credentials" not in r.headers


async def test_preflight_from_an_unlisted_origin_gets_no_allow_header(
    listed: httpx.AsyncClient, run_id: str
) -> None:
    path = stream_url(run_id, "out") + "/records"
    r = await listed.options(path, headers=preflight_headers(UNLISTED, "POST", "authorization"))
    assert_no_allow(r)
    # Not answered by the CORS layer: the API's guard answers it as any other request.
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    assert "origin" in listed_values(r.headers["vary"])
    # An origin that only resembles a listed one is another origin.
    for lookalike in (LISTED + ":443", LISTED + ".evil.net", "http://app.example.com", "null"):
        r = await listed.options(
            path, headers=preflight_headers(lookalike, "POST", "authorization")
        )
        assert_no_allow(r)


async def test_answers_to_a_listed_origin_carry_the_allow_and_expose_headers(
    listed: httpx.AsyncClient, auth: Any, run_id: str
) -> None:
    h = {**auth(), "Origin": LISTED}
    r = await listed.post(
        f"{API}/runs/{run_id}/streams", json={"stream_id": "out", "direction": "output"}, headers=h
    )
    assert r.status_code == 201, r.text
    assert_allowed_answer(r, LISTED)
    # The records front: an append, its keyed replay, and a read.
    records = stream_url(run_id, "out") + "/records"
    body = {"records": [{"payload": {"n": 1}}]}
    for expected in (201, 200):
        r = await listed.post(records, json=body, headers={**h, "Idempotency-Key": "k1"})
        assert r.status_code == expected, r.text
        assert_allowed_answer(r, LISTED)
    assert r.headers["idempotent-replayed"] == "true"
    # A page can quote the answer's request ID (the records front sets it too).
    assert r.headers["x-request-id"] and "x-request-id" in listed_values(
        r.headers["access-control-expose-headers"]
    )
    r = await listed.get(records, headers=h)
    assert r.status_code == 200 and [x["payload"] for x in r.json()["records"]] == [{"n": 1}]
    assert_allowed_answer(r, LISTED)
    # The headers every answer carries are still there, each once.
    assert r.headers.get_list("x-content-type-options") == ["nosniff"]
    assert r.headers.get_list("cache-control") == ["no-store"]
    assert r.headers.get_list("access-control-allow-origin") == [LISTED]
    # Outside the API too.
    r = await listed.get("/healthz", headers={"Origin": OTHER_LISTED})
    assert r.status_code == 200
    assert_allowed_answer(r, OTHER_LISTED)


async def test_problems_to_a_listed_origin_are_readable(
    listed: httpx.AsyncClient, auth: Any, run_id: str
) -> None:
    records = stream_url(run_id, "missing") + "/records"
    cases = [
        # no token: 401 on the records front and on a Litestar route
        ("POST", records, {}, 401, "unauthenticated"),
        ("GET", stream_url(run_id, "missing"), {}, 401, "unauthenticated"),
        # a token, no such stream: 404 on both
        ("POST", records, auth(), 404, "not_found"),
        ("GET", stream_url(run_id, "missing"), auth(), 404, "not_found"),
        # a run the token does not see
        ("GET", records, auth(runs=["run-other"]), 404, "not_found"),
        # no route at all
        ("GET", f"{API}/nowhere", auth(), 404, "not_found"),
    ]
    for method, path, token, status, code in cases:
        r = await listed.request(
            method,
            path,
            json={"records": [{"payload": 1}]} if method == "POST" else None,
            headers={**token, "Origin": LISTED},
        )
        assert (r.status_code, r.json()["code"]) == (status, code), (method, path)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert_allowed_answer(r, LISTED)


async def test_answers_to_an_unlisted_or_no_origin_carry_no_allow_header(
    listed: httpx.AsyncClient, auth: Any, run_id: str
) -> None:
    h = auth()
    await create_stream(listed, run_id, "out", h)
    records = stream_url(run_id, "out") + "/records"
    for extra in ({"Origin": UNLISTED}, {}):
        r = await listed.post(records, json={"records": [{"payload": 1}]}, headers={**h, **extra})
        assert r.status_code == 201, r.text
        assert_no_allow(r)
        # The answer still depends on the origin, so caches must key on it.
        assert "origin" in listed_values(r.headers["vary"])
        r = await listed.get(records, headers={**h, **extra})
        assert r.status_code == 200
        assert_no_allow(r)
        r = await listed.get(stream_url(run_id, "nope"), headers={**extra})
        assert r.status_code == 401
        assert_no_allow(r)


async def test_sse_to_a_listed_origin_carries_the_headers_and_delivers(
    listed: httpx.AsyncClient, listed_server: Any, auth: Any, run_id: str
) -> None:
    h = auth()
    await create_stream(listed, run_id, "out", h)
    await append(listed, run_id, "out", [1, 2], h)
    path = stream_url(run_id, "out") + "/subscribe"
    seen: list[int] = []
    async with (
        httpx.AsyncClient(base_url=listed_server.url, timeout=30) as c,
        aconnect_sse(c, "GET", path, headers={**h, "Origin": LISTED}) as source,
    ):
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        assert_allowed_answer(source.response, LISTED)
        events = source.aiter_sse()

        async def next_record() -> int:
            async for event in events:
                if event.event == "record":
                    return int(event.id)
            raise AssertionError("the SSE response ended")

        seen.append(await asyncio.wait_for(next_record(), 20))
        seen.append(await asyncio.wait_for(next_record(), 20))
        await append(listed, run_id, "out", [3], h)  # live, after the backfill
        seen.append(await asyncio.wait_for(next_record(), 20))
    assert seen == [1, 2, 3]
    # An unlisted origin's subscription gets no allow header.
    async with (
        httpx.AsyncClient(base_url=listed_server.url, timeout=30) as c,
        c.stream("GET", path, headers={**h, "Origin": UNLISTED}) as response,
    ):
        assert response.status_code == 200
        assert_no_allow(response)


async def test_durable_streams_answers_to_a_listed_origin_expose_the_protocol_headers(
    listed: httpx.AsyncClient, listed_server: Any, auth: Any, run_id: str
) -> None:
    h = {**auth(), "Origin": LISTED}
    url = f"{API}/runs/{run_id}/ds/v1/stream/out"
    # What the conformance suite asks (its origin is another one; here a listed one).
    r = await listed.options(url, headers=preflight_headers(LISTED, "GET", "if-none-match"))
    assert (
        r.status_code == 204
        and "if-none-match" in r.headers["access-control-allow-headers"].lower()
    )
    json_body = {**h, "Content-Type": "application/json"}
    created = await listed.put(url, headers=json_body)
    assert created.status_code == 201, created.text
    appended = await listed.post(url, content=b'[{"n":1},{"n":2}]', headers=json_body)
    caught_up = await listed.get(url, params={"offset": "-1"}, headers=h)
    head = await listed.head(url, headers=h)
    assert [r.status_code for r in (appended, caught_up, head)] == [204, 200, 200]
    assert caught_up.json() == [{"n": 1}, {"n": 2}]
    exposed = listed_values(created.headers["access-control-expose-headers"])
    # Every protocol header a client reads is in the answer and readable by the page.
    for answer, names in (
        (created, ("location", "stream-next-offset")),
        (appended, ("stream-next-offset",)),
        (caught_up, ("stream-next-offset", "stream-up-to-date", "etag")),
        (head, ("stream-next-offset",)),
    ):
        assert_allowed_answer(answer, LISTED)
        for name in names:
            assert name in answer.headers and name in exposed, name
        # The endpoint's own browser headers are kept.
        assert answer.headers["cross-origin-resource-policy"] == "cross-origin"
        assert answer.headers.get_list("x-content-type-options") == ["nosniff"]
    # The ETag round trip a page makes: If-None-Match (allowed above) gets 304.
    again = await listed.get(
        url, params={"offset": "-1"}, headers={**h, "If-None-Match": caught_up.headers["etag"]}
    )
    assert again.status_code == 304
    assert_allowed_answer(again, LISTED)
    # DS-framed SSE, and DS problems.
    async with listed.stream("GET", url, params={"offset": "-1", "live": "sse"}, headers=h) as sse:
        assert sse.status_code == 200
        assert sse.headers["content-type"].startswith("text/event-stream")
        assert_allowed_answer(sse, LISTED)
    for token, status in (({}, 401), (auth(), 404)):
        missing = await listed.get(
            f"{API}/runs/{run_id}/ds/v1/stream/missing",
            params={"offset": "-1"},
            headers={**token, "Origin": LISTED},
        )
        assert missing.status_code == status
        assert_allowed_answer(missing, LISTED)
    r = await listed.get(url, params={"offset": "-1"}, headers={**h, "Origin": UNLISTED})
    assert r.status_code == 200
    assert_no_allow(r)


# -- any origin --------------------------------------------------------------------------


async def test_star_allows_every_origin_without_vary(
    star: httpx.AsyncClient, auth: Any, run_id: str
) -> None:
    path = stream_url(run_id, "out") + "/records"
    r = await star.options(path, headers=preflight_headers(UNLISTED, "POST", "authorization"))
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "*"
    assert "vary" not in r.headers
    h = auth()
    await create_stream(star, run_id, "out", h)
    # With or without an Origin, every answer is the same: readable by any page.
    for extra in ({"Origin": UNLISTED}, {"Origin": LISTED}, {}):
        r = await star.post(path, json={"records": [{"payload": 1}]}, headers={**h, **extra})
        assert r.status_code == 201
        assert_allowed_answer(r, "*")
        assert "vary" not in r.headers
        r = await star.get(path, headers=extra)
        assert r.status_code == 401
        assert_allowed_answer(r, "*")
    async with star.stream(
        "GET", stream_url(run_id, "out") + "/subscribe", headers={**h, "Origin": UNLISTED}
    ) as response:
        assert response.status_code == 200
        assert_allowed_answer(response, "*")


# -- unset ------------------------------------------------------------------------------


async def test_unset_means_no_cors_headers_at_all(
    unset: httpx.AsyncClient, auth: Any, run_id: str
) -> None:
    path = stream_url(run_id, "out") + "/records"
    r = await unset.options(path, headers=preflight_headers(LISTED, "POST", "authorization"))
    assert r.status_code == 401  # a preflight is a request like any other
    assert_no_allow(r)
    assert "vary" not in r.headers
    h = {**auth(), "Origin": LISTED}
    await create_stream(unset, run_id, "out", h)
    r = await unset.post(path, json={"records": [{"payload": 1}]}, headers=h)
    assert r.status_code == 201
    assert_no_allow(r)
    assert "vary" not in r.headers
    async with unset.stream("GET", stream_url(run_id, "out") + "/subscribe", headers=h) as response:
        assert response.status_code == 200
        assert_no_allow(response)


# -- the policy alone -------------------------------------------------------------------


async def test_a_vary_the_app_set_is_kept() -> None:
    policy = CorsPolicy([LISTED])
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "headers": [(b"origin", LISTED.encode())]}
    wrapped = await policy.screen(scope, send)
    assert wrapped is not None
    start = {"type": "http.response.start", "status": 200, "headers": [(b"vary", b"Accept")]}
    await wrapped(start)
    headers = sent[0]["headers"]
    assert [v for k, v in headers if k == b"vary"] == [b"Accept, Origin"]
    assert (b"access-control-allow-origin", LISTED.encode()) in headers


def test_the_setting_is_a_list_of_origins_or_star() -> None:
    parsed = Settings.from_env(
        {"DUCTOR_STREAMS_CORS_ORIGINS": " https://App.Example.com, http://localhost:5173 ,"}
    )
    assert parsed.cors_origins == ("https://app.example.com", "http://localhost:5173")
    assert Settings.from_env({"DUCTOR_STREAMS_CORS_ORIGINS": "*"}).cors_origins == ("*",)
    assert Settings.from_env({}).cors_origins == ()
    assert Settings.from_env({"DUCTOR_STREAMS_CORS_ORIGINS": "  "}).cors_origins == ()
    ipv6 = Settings.from_env({"DUCTOR_STREAMS_CORS_ORIGINS": "http://[::1]:8080"})
    assert ipv6.cors_origins == ("http://[::1]:8080",)
    for bad, says in [
        ("https://app.example.com/", "is not an origin"),  # a path (even /)
        ("https://app.example.com/ui", "is not an origin"),
        ("app.example.com", "is not an origin"),  # no scheme
        ("null", "is not an origin"),
        ("https://a.example, *", "cannot be combined"),
    ]:
        with pytest.raises(ConfigError, match=says):
            Settings.from_env({"DUCTOR_STREAMS_CORS_ORIGINS": bad})


async def test_origins_match_whatever_case_the_browser_sends_and_are_echoed_as_sent() -> None:
    policy = CorsPolicy(Settings.validated(cors_origins="HTTPS://APP.example.com").cors_origins)
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "headers": [(b"origin", b"https://app.EXAMPLE.com")]}
    wrapped = await policy.screen(scope, send)
    assert wrapped is not None
    await wrapped({"type": "http.response.start", "status": 200, "headers": []})
    assert (b"access-control-allow-origin", b"https://app.EXAMPLE.com") in sent[0]["headers"]
