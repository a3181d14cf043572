"""Response headers of tenant isolation (docs/security.md, "Tenant isolation"), against
real servers: every API answer, Durable Streams and native, carries
``Content-Security-Policy: default-src 'none'; sandbox`` and ``nosniff`` whatever the
stream's media type; catch-up ETags differ per redaction view and name no internal key
(and two replicas give the same); a malformed or repeated ``Host`` is 400
``invalid_host`` before anything else; a DS PUT's ``Location`` comes from
``DUCTOR_STREAMS_PUBLIC_URL`` or the checked ``Host``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from ductor_streams.config import Settings
from tests.conftest import API, TokenFactory
from tests.support.server import ServerProcess

SANDBOX = "default-src 'none'; sandbox"
PUBLIC_URL = "https://streams.example.com/edge"
READ_SCOPES = ["streams:read", "streams:write", "streams:admin"]  # no read_unredacted


@pytest.fixture(scope="module")
def replica(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A second server over the same database and secret, with a public URL."""
    log = tmp_path_factory.mktemp("replica") / "server.log"
    env = {"DUCTOR_STREAMS_PUBLIC_URL": PUBLIC_URL}
    with ServerProcess(settings, extra_env=env, log_path=log) as proc:
        yield proc


def _sandboxed(response: httpx.Response) -> None:
    assert response.headers.get("content-security-policy") == SANDBOX, dict(response.headers)
    assert response.headers.get("x-content-type-options") == "nosniff"


async def test_ds_streams_of_any_media_type_are_served_sandboxed(
    server: Any, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        ds = f"{API}/runs/{run_id}/ds/v1/stream"
        for name, media_type, body in (
            ("page", "text/html", b"<script>alert(document.domain)</script>"),
            ("picture", "image/svg+xml", b'<svg xmlns="http://www.w3.org/2000/svg" onload="x()"/>'),
        ):
            r = await http.put(
                f"{ds}/{name}", headers={**headers, "Content-Type": media_type}, content=body
            )
            assert r.status_code == 201, r.text
            _sandboxed(r)
            for method, query in (("GET", "?offset=-1"), ("HEAD", ""), ("GET", "?offset=now")):
                r = await http.request(method, f"{ds}/{name}{query}", headers=headers)
                assert r.status_code == 200, (method, query, r.text)
                assert r.headers["content-type"].startswith(media_type)
                _sandboxed(r)
            r = await http.get(f"{ds}/{name}?offset=-1", headers=headers)
            assert r.content == body
            # Long-poll and SSE answers too.
            r = await http.get(f"{ds}/{name}?offset=-1&live=long-poll", headers=headers)
            assert r.status_code == 200
            _sandboxed(r)
            async with http.stream(
                "GET", f"{ds}/{name}?offset=-1&live=sse", headers=headers
            ) as sse:
                assert sse.status_code == 200
                _sandboxed(sse)
        # And problems.
        r = await http.get(f"{ds}/missing?offset=-1", headers=headers)
        assert r.status_code == 404
        _sandboxed(r)


async def test_native_answers_are_sandboxed_and_the_operator_page_keeps_its_policy(
    server: Any, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    base = f"{API}/runs/{run_id}/streams"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.post(base, json={"stream_id": "n", "direction": "output"}, headers=headers)
        assert r.status_code == 201
        _sandboxed(r)
        r = await http.post(
            f"{base}/n/records",
            json={"records": [{"payload": "<b>hi</b>"}]},
            headers=headers,
        )
        assert r.status_code == 201
        _sandboxed(r)
        for path in ("/n/records?cursor=0", "/n", "/n/records?cursor=9", "/nope/records"):
            r = await http.get(f"{base}{path}", headers=headers)
            _sandboxed(r)
        async with http.stream("GET", f"{base}/n/subscribe?cursor=0", headers=headers) as sse:
            assert sse.status_code == 200
            _sandboxed(sse)
        page = await http.get(f"{API}/ops")
        assert page.status_code == 200
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "sandbox" not in policy


async def _redacted_stream(http: httpx.AsyncClient, headers: dict[str, str], run_id: str) -> str:
    base = f"{API}/runs/{run_id}/streams"
    r = await http.post(
        base,
        json={"stream_id": "r", "direction": "output", "redaction": {"json_pointers": ["/pin"]}},
        headers=headers,
    )
    assert r.status_code == 201, r.text
    r = await http.post(
        f"{base}/r/records",
        json={"records": [{"payload": {"pin": "1234", "n": 1}}]},
        headers=headers,
    )
    assert r.status_code == 201, r.text
    return f"{API}/runs/{run_id}/ds/v1/stream/r?offset=-1"


async def test_catch_up_etags_differ_per_redaction_view_and_are_opaque(
    server: Any, replica: Any, auth: TokenFactory, pool: asyncpg.Pool, tenant: str, run_id: str
) -> None:
    full, redacted = auth(), auth(scopes=READ_SCOPES)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        url = await _redacted_stream(http, full, run_id)
        plain = await http.get(url, headers=full)
        hidden = await http.get(url, headers=redacted)
        assert json.loads(plain.content) == [{"pin": "1234", "n": 1}]
        assert json.loads(hidden.content) == [{"pin": "[REDACTED]", "n": 1}]
        plain_tag, hidden_tag = plain.headers["etag"], hidden.headers["etag"]
        assert plain_tag != hidden_tag

        # A redacted token holding the unredacted copy's tag gets its own view, not 304
        # (and the other way round).
        r = await http.get(url, headers={**redacted, "If-None-Match": plain_tag})
        assert r.status_code == 200
        assert json.loads(r.content) == [{"pin": "[REDACTED]", "n": 1}]
        r = await http.get(url, headers={**full, "If-None-Match": hidden_tag})
        assert r.status_code == 200 and json.loads(r.content) == [{"pin": "1234", "n": 1}]
        # Each view's own tag still revalidates.
        for token, tag in ((full, plain_tag), (redacted, hidden_tag)):
            r = await http.get(url, headers={**token, "If-None-Match": tag})
            assert r.status_code == 304 and r.content == b""

    # Opaque: 144 bits of a keyed hash, no stream number or offset in it.
    stream_pk = await pool.fetchval(
        "SELECT stream_pk FROM workflow_streams.streams WHERE tenant = $1 AND run_id = $2",
        tenant,
        run_id,
    )
    for tag in (plain_tag, hidden_tag):
        assert re.fullmatch(r'"[A-Za-z0-9_-]{24}"', tag), tag
        assert str(stream_pk) not in tag.split(":")
        assert ":" not in tag
    # Every replica (same secret) gives the same tag for the same answer.
    async with httpx.AsyncClient(base_url=replica.url, timeout=30) as other:
        assert (await other.get(url, headers=full)).headers["etag"] == plain_tag
        assert (await other.get(url, headers=redacted)).headers["etag"] == hidden_tag


async def _raw(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as written (no client checks the Host) and read the answer."""
    match = re.fullmatch(r"http://([^:]+):(\d+)", url)
    assert match
    reader, writer = await asyncio.open_connection(match.group(1), int(match.group(2)))
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def _request(method: str, path: str, hosts: list[str], token: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1"]
    lines += [f"Host: {host}" for host in hosts]
    lines += [f"{k}: {v}" for k, v in token.items()]
    lines += ["Content-Type: text/plain", "Content-Length: 0", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@pytest.mark.parametrize(
    "hosts",
    [['a"b<c>'], ["a b"], ["x/y"], ["[::1"], ["host:port"], ["good", "other"]],
    ids=["quote-angle", "space", "slash", "bracket", "port-word", "twice"],
)
async def test_a_malformed_or_repeated_host_is_refused_before_anything(
    server: Any, auth: TokenFactory, run_id: str, hosts: list[str]
) -> None:
    token = auth()
    path = f"{API}/runs/{run_id}/ds/v1/stream/hosted"
    status, headers, body = await _raw(server.url, _request("PUT", path, hosts, token))
    assert status == 400, body
    assert headers["content-type"] == "application/problem+json"
    assert headers["content-security-policy"] == SANDBOX
    assert "location" not in headers
    problem = json.loads(body)
    assert problem["code"] == "invalid_host" and problem["status"] == 400
    # Nothing was created; health answers the same.
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        assert (await http.head(path, headers=token)).status_code == 404
    status, _, body = await _raw(server.url, _request("GET", "/healthz", hosts, {}))
    assert status == 400 and json.loads(body)["code"] == "invalid_host"


async def test_location_comes_from_the_servers_address_or_the_public_url(
    server: Any, replica: Any, auth: TokenFactory, run_id: str
) -> None:
    token = auth()
    path = f"{API}/runs/{run_id}/ds/v1/stream"
    # Whatever well-formed Host the client claims, none of it comes back: the URL is
    # the address the connection arrived at.
    for host in ("streams.example.com:8443", "evil.example", "127.0.0.1", "[::1]:8000"):
        name = f"loc-{host.replace(':', '').replace('[', '').replace(']', '')}"
        status, headers, _ = await _raw(
            server.url, _request("PUT", f"{path}/{name}", [host], token)
        )
        assert status == 201
        assert headers["location"] == f"{server.url}{path}/{name}"
    # A public URL wins over any Host.
    status, headers, _ = await _raw(
        replica.url, _request("PUT", f"{path}/public", ["evil.example"], token)
    )
    assert status == 201
    assert headers["location"] == f"{PUBLIC_URL}{path}/public"
