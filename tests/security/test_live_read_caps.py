"""Tenant isolation of live reads and connections, against real servers with small caps.

- One tenant's live reads (native SSE, Durable Streams SSE and DS long-polls, mixed)
  are capped at ``DUCTOR_STREAMS_TENANT_MAX_LIVE``: exactly that many are admitted, each
  one more is ``429 too_many_live_reads`` with ``Retry-After``; a live read that ends
  (the client goes away) frees its place; another tenant's appends and live reads are
  not refused meanwhile.
- With the whole connection cap held by one tenant's live reads, ``/healthz`` and
  ``/readyz`` are answered on new connections; that tenant's next request is ``503
  too_many_connections`` and cuts nothing; another tenant's request gets in by evicting
  the big tenant's newest connection (never a probe, never a connection of a tenant
  below its fair share).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from tests.conftest import API, JWT_SECRET, unique
from tests.support.server import ServerProcess
from tests.temporal.polling import eventually

SCOPES = ["streams:read", "streams:write", "streams:admin"]


def _token(tenant: str) -> str:
    return issue_token(
        JWT_SECRET, sub="reader", tenant=tenant, scopes=SCOPES, runs=["*"], ttl_seconds=600
    )


@dataclass
class Answer:
    """One request on a connection of its own, read as far as its answer's head (and
    body, when it has a length); the connection stays open."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def problem_code(self) -> str:
        code: str = json.loads(self.body)["code"]
        return code

    async def alive(self, within: float = 1.5) -> bool:
        """Whether the server still writes to this connection (SSE keepalives come every
        0.2 s) and does not close it within ``within`` seconds."""
        try:
            data = await asyncio.wait_for(self.reader.read(65536), within)
        except (ConnectionError, TimeoutError):
            return False
        return bool(data) and not await self.closed(within)

    async def closed(self, within: float = 5.0) -> bool:
        """Whether the server closes this connection within ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while (left := deadline - loop.time()) > 0:
            try:
                data = await asyncio.wait_for(self.reader.read(65536), left)
            except ConnectionError:
                return True
            except TimeoutError:
                return False
            if not data:
                return True
        return False

    def close(self) -> None:
        self.writer.close()


def request_bytes(method: str, path: str, token: str | None = None, body: bytes = b"") -> bytes:
    """One HTTP/1.1 request; a body is sent as JSON."""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


async def send(
    port: int, method: str, path: str, token: str | None = None, body: bytes = b""
) -> Answer:
    """Open a connection and send one request; nothing read yet."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(method, path, token, body))
    await writer.drain()
    return Answer(reader, writer)


async def read_head(answer: Answer, patience: float = 10.0) -> Answer:
    head = await asyncio.wait_for(answer.reader.readuntil(b"\r\n\r\n"), patience)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    answer.status = int(status_line.split()[1])
    answer.headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)
    }
    length = answer.headers.get("content-length")
    if length is not None:
        answer.body = await asyncio.wait_for(answer.reader.readexactly(int(length)), patience)
    return answer


async def get(port: int, path: str, token: str | None = None) -> Answer:
    """A GET on a connection of its own, read as far as its answer's head."""
    return await read_head(await send(port, "GET", path, token))


@dataclass
class Paths:
    run_id: str
    stream: str

    @property
    def subscribe(self) -> str:
        return f"{API}/runs/{self.run_id}/streams/{self.stream}/subscribe"

    @property
    def ds(self) -> str:
        return f"{API}/runs/{self.run_id}/ds/v1/stream/{self.stream}"

    @property
    def ds_sse(self) -> str:
        return self.ds + "?offset=now&live=sse"

    @property
    def long_poll(self) -> str:
        return self.ds + "?offset=now&live=long-poll"


async def make_stream(url: str, token: str, run_id: str) -> Paths:
    paths = Paths(run_id, unique("live"))
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        made = await http.put(
            paths.ds,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        assert made.status_code == 201, made.text
    return paths


def _server(settings: Settings, tmp_path: Path, **env: str) -> ServerProcess:
    return ServerProcess(
        settings,
        log_path=tmp_path / "serve.log",
        extra_env={
            "DUCTOR_STREAMS_SSE_KEEPALIVE_SECONDS": "0.2",
            "DUCTOR_STREAMS_DS_SSE_SECONDS": "600",
            "DUCTOR_STREAMS_DS_LONG_POLL_SECONDS": "120",
            **env,
        },
    )


@pytest.fixture
def capped_server(settings: Settings, tmp_path: Path) -> Iterator[ServerProcess]:
    """40 connections, 10 live reads per tenant."""
    with _server(
        settings,
        tmp_path,
        DUCTOR_STREAMS_MAX_CONNECTIONS="40",
        DUCTOR_STREAMS_TENANT_MAX_LIVE="10",
    ) as server:
        yield server


@pytest.fixture
def full_server(settings: Settings, tmp_path: Path) -> Iterator[ServerProcess]:
    """20 connections, and one tenant may hold all of them with live reads."""
    with _server(
        settings,
        tmp_path,
        DUCTOR_STREAMS_MAX_CONNECTIONS="20",
        DUCTOR_STREAMS_TENANT_MAX_LIVE="20",
    ) as server:
        yield server


def assert_too_many_live_reads(answer: Answer) -> None:
    assert answer.status == 429, (answer.status, answer.body)
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.problem_code() == "too_many_live_reads"
    assert int(answer.headers["retry-after"]) >= 1


@pytest.mark.timeout(120)
async def test_live_reads_are_capped_per_tenant_across_sse_and_long_poll(
    capped_server: ServerProcess, run_id: str
) -> None:
    port = capped_server.port
    big, other = unique("big"), unique("other")
    big_token, other_token = _token(big), _token(other)
    paths = await make_stream(capped_server.url, big_token, run_id)
    # 15 live reads at once: 6 native SSE, 5 DS SSE, 4 DS long-polls at the tail.
    requests = [paths.subscribe] * 6 + [paths.ds_sse] * 5 + [paths.long_poll] * 4
    sent = await asyncio.gather(*(send(port, "GET", p, big_token) for p in requests))
    sse, polls = sent[:11], sent[11:]
    await asyncio.gather(*(read_head(a) for a in sse))
    # A long-poll answers at once only when it is refused; an admitted one waits.
    poll_heads = [asyncio.ensure_future(read_head(a, patience=120)) for a in polls]

    async def refused_polls() -> int:
        return sum(1 for t in poll_heads if t.done() and t.result().status == 429)

    sse_ok = sum(1 for a in sse if a.status == 200)
    sse_refused = [a for a in sse if a.status != 200]
    for answer in sse_refused:
        assert_too_many_live_reads(answer)
    # Exactly 10 admitted: the long-polls refused are 5 less those of SSE.
    expected_refused_polls = 5 - len(sse_refused)
    assert 0 <= expected_refused_polls <= 4, (sse_ok, len(sse_refused))
    await eventually(
        refused_polls,
        lambda n: n == expected_refused_polls,
        timeout=10,
        what="the refused long-polls answered",
    )
    for task in poll_heads:
        if task.done():
            assert_too_many_live_reads(task.result())
    waiting = [t for t in poll_heads if not t.done()]
    assert sse_ok + len(waiting) == 10

    # Another tenant is not refused: its live reads and appends go through.
    other_paths = await make_stream(capped_server.url, other_token, run_id)
    other_sse = await get(port, other_paths.subscribe, other_token)
    assert other_sse.status == 200 and await other_sse.alive()
    other_ds = await get(port, other_paths.ds_sse, other_token)
    assert other_ds.status == 200
    async with httpx.AsyncClient(base_url=capped_server.url, timeout=30) as http:
        append = await http.post(
            other_paths.ds,
            headers={"Authorization": f"Bearer {other_token}", "Content-Type": "application/json"},
            content=b'{"n":1}',
        )
        assert append.status_code in (200, 204), append.text
        read = await http.get(
            other_paths.ds + "?offset=-1", headers={"Authorization": f"Bearer {other_token}"}
        )
        assert read.status_code == 200 and json.loads(read.content) == [{"n": 1}]

        # The big tenant's catch-up reads and appends are not live reads.
        big_headers = {"Authorization": f"Bearer {big_token}"}
        assert (await http.get(paths.ds + "?offset=-1", headers=big_headers)).status_code == 200
        # Its append wakes the waiting long-polls: each answers 200 with the record.
        appended = await http.post(
            paths.ds,
            headers={**big_headers, "Content-Type": "application/json"},
            content=b'{"n":1}',
        )
        assert appended.status_code in (200, 204), appended.text
    answered = await asyncio.gather(*waiting)
    assert [a.status for a in answered] == [200] * len(waiting)
    assert all(json.loads(a.body) == [{"n": 1}] for a in answered)

    # The long-polls have ended: their places are free again, and taken again at once.
    admitted = [await get(port, paths.subscribe, big_token) for _ in range(len(waiting))]
    assert [a.status for a in admitted] == [200] * len(waiting)
    assert_too_many_live_reads(await get(port, paths.ds_sse, big_token))

    # A client that goes away frees its place: one SSE reader leaves, one more gets in.
    gone = next(a for a in sse if a.status == 200)
    gone.close()

    async def another() -> Answer:
        answer = await get(port, paths.ds_sse, big_token)
        if answer.status != 200:
            answer.close()
        return answer

    replacement = await eventually(
        another, lambda a: a.status == 200, timeout=10, what="a place freed by a disconnect"
    )
    assert await replacement.alive()
    assert_too_many_live_reads(await get(port, paths.long_poll, big_token))


@pytest.mark.timeout(120)
async def test_probes_answer_at_a_full_cap_and_another_tenant_evicts_the_newest(
    full_server: ServerProcess, run_id: str
) -> None:
    port = full_server.port
    big, other = unique("big"), unique("other")
    big_token, other_token = _token(big), _token(other)
    paths = await make_stream(full_server.url, big_token, run_id)
    other_paths = await make_stream(full_server.url, other_token, run_id)
    # The big tenant takes all 20 connections with live reads, one after the other.
    held = []
    for i in range(20):
        answer = await get(port, paths.subscribe if i % 2 else paths.ds_sse, big_token)
        assert answer.status == 200, (i, answer.status, answer.body)
        held.append(answer)

    # Probes are answered on new connections, one after another and 10 at once.
    for path in ["/healthz", "/readyz"] * 5:
        probe = await get(port, path)
        assert probe.status == 200, (path, probe.status, probe.body)
        probe.close()
    probes = await asyncio.gather(*(get(port, p) for p in ["/healthz", "/readyz"] * 5))
    assert [p.status for p in probes] == [200] * 10
    for probe in probes:
        probe.close()

    # The big tenant's next request, live or not, is refused, and cuts nothing.
    refused = await get(port, paths.ds + "?offset=-1", big_token)
    assert refused.status == 503 and refused.problem_code() == "too_many_connections"
    assert refused.headers["retry-after"] == "1"
    refused = await get(port, paths.subscribe, big_token)
    assert refused.status == 503 and refused.problem_code() == "too_many_connections"
    assert all(await asyncio.gather(*(a.alive() for a in held)))

    # A probe's connection kept open, idle (a load balancer's keep-alive connection),
    # is not taken for another tenant's request.
    kept_probe = await get(port, "/healthz")
    assert kept_probe.status == 200

    # Another tenant gets in: its live read evicts the big tenant's newest connection,
    other_sse = await get(port, other_paths.subscribe, other_token)
    assert other_sse.status == 200, (other_sse.status, other_sse.body)
    assert await held[-1].closed()
    kept_probe.writer.write(request_bytes("GET", "/healthz"))
    assert (await read_head(kept_probe)).status == 200
    # and so does its append, on a new connection (the next newest goes).
    append = await read_head(await send(port, "POST", other_paths.ds, other_token, b'{"n":1}'))
    assert append.status == 204, (append.status, append.body)
    assert await held[-2].closed()
    # That connection, idle now, is not the big tenant's to take (the other tenant is
    # below its share): the big tenant is refused, and the append's connection serves
    # the next append.
    refused = await get(port, paths.subscribe, big_token)
    assert refused.status == 503 and refused.problem_code() == "too_many_connections"
    append.writer.write(request_bytes("POST", other_paths.ds, other_token, b'{"n":2}'))
    assert (await read_head(append)).status == 204
    assert await other_sse.alive()
    assert all(await asyncio.gather(*(a.alive() for a in held[:-2])))


@pytest.mark.timeout(120)
async def test_a_tenant_below_its_fair_share_is_never_evicted(
    full_server: ServerProcess, run_id: str
) -> None:
    port = full_server.port
    tenants = [unique("a"), unique("b"), unique("c")]
    a_token, b_token, c_token = (_token(t) for t in tenants)
    a_paths = await make_stream(full_server.url, a_token, run_id)
    b_paths = await make_stream(full_server.url, b_token, run_id)
    c_paths = await make_stream(full_server.url, c_token, run_id)
    a_held = [await get(port, a_paths.subscribe, a_token) for _ in range(15)]
    b_held = [await get(port, b_paths.ds_sse, b_token) for _ in range(5)]
    assert [x.status for x in a_held + b_held] == [200] * 20

    # A holds more than its share (20 / 2 = 10): its next request is refused and takes
    # nothing from B.
    refused = await get(port, a_paths.subscribe, a_token)
    assert refused.status == 503 and refused.problem_code() == "too_many_connections"

    # C arrives, three times: the share is 20 / 3; each time A (the most, above its
    # share) loses its newest connection, B (5, below its share) nothing.
    c_held = []
    for i in range(3):
        answer = await get(port, c_paths.subscribe, c_token)
        assert answer.status == 200, (i, answer.status, answer.body)
        c_held.append(answer)
        assert await a_held[-1 - i].closed()
    alive = await asyncio.gather(*(x.alive() for x in a_held[:12] + b_held + c_held))
    assert all(alive), alive

    # B, below its share, may take A's place too; A still may not take B's.
    b_more = await get(port, b_paths.ds_sse, b_token)
    assert b_more.status == 200
    assert await a_held[11].closed()
    refused = await get(port, a_paths.ds_sse, a_token)
    assert refused.status == 503 and refused.problem_code() == "too_many_connections"
    alive = await asyncio.gather(*(x.alive() for x in a_held[:11] + b_held + [b_more] + c_held))
    assert all(alive), alive
