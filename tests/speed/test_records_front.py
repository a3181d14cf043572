"""The records front (http/fronts/records.py) answers exactly as the Litestar routes do.

The same sequence of requests goes to two identical streams: one through the app as
served (appends and reads of records answered by the front), one through Litestar alone
(``StreamsApp.without_front``, bypassing the front). Every answer must match: status, headers
(but the date) and body, with the stream id swapped.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from ductor_streams.http import create_app
from ductor_streams.http.app import StreamsApp
from ductor_streams.http.fronts.records import is_records_request
from ductor_streams.http.routes.records import MAX_APPEND_BODY
from tests.conftest import API, TokenFactory, unique

APPENDED_AT = re.compile(r'"appended_at":"[^"]+"')
# A record's fingerprint holds its appended_at: the two ways' streams differ in it.
FINGERPRINT = re.compile(r"\b[0-9a-f]{16}-[0-9a-f]{1,8}\b")
Case = tuple[str, str, dict[str, str], bytes]  # method, path suffix, headers, body


class LitestarOnly:
    """The app without its front: every request goes through Litestar's routing (and
    gets the headers every response carries, as served)."""

    def __init__(self, app: StreamsApp) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app.without_front(scope, receive, send)


class ViaFront:
    """The app as served, which must take the front for every records case."""

    def __init__(self, app: StreamsApp) -> None:
        self.app = app
        self.fronted = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and is_records_request(scope):
            self.fronted += 1
        await self.app(scope, receive, send)


def _cases(auth: TokenFactory, run_id: str, tenant: str) -> list[Case]:
    writer = auth()
    json_h = {**writer, "Content-Type": "application/json"}
    read_only = auth(scopes=["streams:read"])
    unredacted = auth(scopes=["streams:read", "streams:read_unredacted"])
    other_run = auth(runs=["run-elsewhere"])
    outsider = auth(sub="mallory")
    abroad = auth(region="mars")
    forged = {
        "Authorization": "Bearer "
        + issue_token(
            "another-secret-" + "y" * 32,
            sub="x",
            tenant=tenant,
            scopes=["streams:write"],
            runs=["*"],
        )
    }
    rec = b"/records"
    one = b'{"records":[{"payload":{"secret":"s1","open":"o1"}}]}'
    two = b'{"records":[{"payload":1},{"payload":"two"}]}'
    cases: list[Case] = [
        ("POST", "/records", json_h, one),
        ("POST", "/records", json_h, two),
        ("POST", "/records", {**json_h, "Idempotency-Key": "k1"}, one),
        ("POST", "/records", {**json_h, "Idempotency-Key": "k1"}, one),  # replay
        ("POST", "/records", {**json_h, "Idempotency-Key": "k1"}, two),  # key reused
        ("POST", "/records", json_h, b'{"records":[]}'),
        ("POST", "/records", json_h, b'{"records":[{"payload":1,"extra":2}]}'),
        ("POST", "/records", json_h, b"not json"),
        ("POST", "/records", json_h, b""),
        ("POST", "/records", json_h, b'{"records":[{"payload":"nul \\u0000"}]}'),
        (
            "POST",
            "/records",
            json_h,
            b'{"records":[{"payload":' + b"[" * 5000 + b"]" * 5000 + b"}]}",
        ),
        ("POST", "/records", {"Content-Type": "application/json"}, one),
        ("POST", "/records", {**forged, "Content-Type": "application/json"}, one),
        ("POST", "/records", {"Authorization": "Basic abc"}, one),
        ("POST", "/records", {**read_only}, one),
        ("POST", "/records", {**outsider}, one),
        ("POST", "/records", {**other_run}, one),
        ("POST", "/records", {**writer, "X-Filler": "x" * 40_000}, one),
        ("POST", "/records", {**writer, "Content-Length": str(MAX_APPEND_BODY + 1)}, one),
        ("GET", "/records", writer, b""),
        ("GET", "/records?cursor=1&limit=2", writer, b""),
        ("GET", "/records?cursor=2&cursor=0", writer, b""),
        ("GET", "/records?cursor=-1", writer, b""),
        ("GET", "/records?cursor=abc", writer, b""),
        ("GET", "/records?limit=0", writer, b""),
        ("GET", "/records?limit=1001", writer, b""),
        ("GET", "/records?limit=", writer, b""),
        ("GET", "/records?cursor=99", writer, b""),
        ("GET", "/records?cursor=0&fingerprint=0000000000000001-1", writer, b""),
        ("GET", "/records?cursor=1&fingerprint=not-hex", writer, b""),
        ("GET", "/records?cursor=1&fingerprint=0000000000000001-1", writer, b""),
        ("GET", "/records?cursor=1&fingerprint=0000000000000001-1", unredacted, b""),
        ("GET", "/records?cursor=99&fingerprint=0000000000000001-1", writer, b""),
        ("GET", "/records", unredacted, b""),
        ("GET", "/records", abroad, b""),
        ("GET", "/records", auth(scopes=["streams:write"]), b""),
        ("GET", "/records", {}, b""),
        ("GET", "/records", outsider, b""),
        ("GET", "/records", other_run, b""),
    ]
    del rec
    return cases


def _client(app: Any) -> httpx.AsyncClient:
    # In this test's own event loop: the app's pool belongs to the loop it started in.
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver", timeout=30
    )


def _normalise(response: httpx.Response, stream_id: str) -> tuple[int, dict[str, str], str]:
    # Each answer echoes its own (generated) request ID, in a problem's body too.
    request_id = response.headers["x-request-id"]
    headers = {
        k.lower(): v.replace(request_id, "<request-id>")
        for k, v in response.headers.items()
        if k.lower() not in ("date", "server", "content-length")
    }
    body = APPENDED_AT.sub("<time>", response.text.replace(stream_id, "<stream>"))
    if response.status_code >= 400:
        assert response.json()["request_id"] == request_id
    body = FINGERPRINT.sub("<fingerprint>", body.replace(request_id, "<request-id>"))
    return response.status_code, headers, body


async def test_the_front_answers_every_records_request_as_litestar_does(
    settings: Settings, auth: TokenFactory, run_id: str, tenant: str
) -> None:
    app = create_app(settings.with_overrides(pool_max_size=5))
    async with app.lifespan(), _client(app) as client:
        admin = auth()
        streams = {}
        for way in ("front", "litestar"):
            stream_id = unique()
            definition = {
                "stream_id": stream_id,
                "direction": "output",
                "consumers": ["reader"],
                "credit": {"max_unread_items": 6},
                "redaction": {"json_pointers": ["/secret"]},
                "placement": {"client_egress_regions": ["local"]},
                "authorization": {"readers": ["tester"], "writers": ["tester"]},
            }
            created = await client.post(
                f"{API}/runs/{run_id}/streams", json=definition, headers=admin
            )
            assert created.status_code == 201, created.text
            streams[way] = stream_id
        front = ViaFront(app)
        ways: dict[str, Any] = {"front": front, "litestar": LitestarOnly(app)}
        cases = _cases(auth, run_id, tenant)
        # Past the credit ceiling (6 unread items), then after close: the same answers.
        cases += [("POST", "/records", auth(), b'{"records":[{"payload":1}]}')] * 3
        answers: dict[str, list[tuple[int, dict[str, str], str]]] = {}
        for way, stream_id in streams.items():
            base = f"{API}/runs/{run_id}/streams/{stream_id}"
            async with _client(ways[way]) as http:
                got = []
                for method, suffix, headers, body in cases:
                    response = await http.request(
                        method, base + suffix, headers=headers, content=body
                    )
                    got.append(_normalise(response, stream_id))
                closed = await client.post(f"{base}/close", headers=admin)
                assert closed.status_code == 200
                response = await http.post(
                    base + "/records", headers=admin, content=b'{"records":[{"payload":1}]}'
                )
                got.append(_normalise(response, stream_id))
            answers[way] = got
        assert front.fronted == len(cases) + 1
        for case, mine, theirs in zip(
            [*cases, ("POST", "closed", {}, b"")],
            answers["front"],
            answers["litestar"],
            strict=True,
        ):
            assert mine == theirs, f"{case[0]} {case[1]}: front {mine} != litestar {theirs}"
        statuses = [status for status, _, _ in answers["front"]]
        # The cases reach every branch they are meant to (no silent all-404s).
        assert {201, 200, 400, 401, 403, 404, 409, 413, 429, 431} <= set(statuses), statuses


async def test_the_litestar_record_handlers_answer_what_the_front_does_not_match(
    settings: Settings, auth: TokenFactory, run_id: str, monkeypatch: Any
) -> None:
    """The Litestar handlers are the fallback for records requests the front leaves
    alone (a trailing slash; docs/speed.md): they append and read as the front does."""
    import ductor_streams.http.app as app_module

    async def front_must_not_answer(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("the records front answered a request it must leave alone")

    app = create_app(settings.with_overrides(pool_max_size=5))
    async with app.lifespan(), _client(app) as client:
        h = auth()
        stream_id = unique()
        created = await client.post(
            f"{API}/runs/{run_id}/streams",
            json={"stream_id": stream_id, "direction": "output"},
            headers=h,
        )
        assert created.status_code == 201, created.text
        monkeypatch.setattr(app_module, "answer_records", front_must_not_answer)
        base = f"{API}/runs/{run_id}/streams/{stream_id}/records/"
        appended = await client.post(base, json={"records": [{"payload": {"n": 1}}]}, headers=h)
        assert appended.status_code == 201, appended.text
        assert appended.json() == {"first_sequence": 1, "last_sequence": 1}
        read = await client.get(base + "?cursor=0", headers=h)
        assert read.status_code == 200, read.text
        assert [(r["sequence"], r["payload"]) for r in read.json()["records"]] == [(1, {"n": 1})]
        refused = await client.get(base + "?cursor=5", headers=h)
        assert refused.status_code == 400 and refused.json()["code"] == "cursor_in_future"
