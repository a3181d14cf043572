"""A request whose caller has gone does no more work (docs/security.md, "Callers that
go away").

Every wait on a caller's behalf, on a real server subprocess of its own, over raw
sockets that are then closed: an append of a ``block`` stream whose unread credit is
full (a 24 MB batch, over the staged threshold, through the records front; a small one
through the Durable Streams endpoint), an object commit of such a stream, and a Durable
Streams long-poll. Once the socket closes, the server's wait gauge returns to 0, no
append statement of it runs in Postgres, nothing more is staged, and when credit then
frees the abandoned batch is never appended. A waiting request whose client stays
connected looks at the stream's row at each wake, and sends its batch again only once
it could fit: acks that free too little stage nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from ductor_streams.config import Settings
from ductor_streams.store import Store, encode_batch
from ductor_streams.store.append import Appender
from ductor_streams.store.credit_wait import LOST_WAKE_RECHECK_SECONDS
from tests.conftest import TokenFactory
from tests.support.credit import ack_url, definition_body, make_stream, records_url, stream_url
from tests.support.objects import ObjectApi, prepare_body
from tests.support.server import ServerProcess
from tests.temporal.polling import eventually

API = "/api/workflow-streams"
CEILING = 500  # max_unread_items of every stream here; filled before each test's wait
BIG_RECORDS = 400
PAYLOAD_CHARS = 60_000
# 400 records of 60 KB: a 24 MB batch, staged (COPYed) when sent: over 8 MiB. Random
# text, which neither Postgres nor the allocator can make smaller than it is.
BATCH_BYTES = BIG_RECORDS * (PAYLOAD_CHARS + 2)

WAITING = 'ductor_streams_requests_waiting{reason="credit"}'
ABANDONED = 'ductor_streams_waits_abandoned_total{reason="credit"}'
QUEUED_ABANDONED = 'ductor_streams_waits_abandoned_total{reason="queued"}'
LONG_POLLS = 'ductor_streams_requests_waiting{reason="long_poll"}'
LONG_POLLS_ABANDONED = 'ductor_streams_waits_abandoned_total{reason="long_poll"}'
STAGED = "ductor_streams_append_staged_statements_total"
STILL_REFUSED = 'ductor_streams_credit_rechecks_total{outcome="still_refused"}'
SENT = 'ductor_streams_credit_rechecks_total{outcome="sent"}'
WATCHED = {
    WAITING,
    ABANDONED,
    QUEUED_ABANDONED,
    LONG_POLLS,
    LONG_POLLS_ABANDONED,
    STAGED,
    STILL_REFUSED,
    SENT,
}

_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$")


@pytest.fixture(scope="module")
def gone_server(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server of its own: its metrics and Postgres sessions are this module's alone.
    Long-polls wait up to 300 s, so that only the client's going can end one here."""
    log = tmp_path_factory.mktemp("gone") / "serve.log"
    with ServerProcess(
        settings, log_path=log, extra_env={"DUCTOR_STREAMS_DS_LONG_POLL_SECONDS": "300"}
    ) as server:
        yield server


@pytest.fixture
async def http(gone_server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gone_server.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def big_body() -> bytes:
    payloads = [secrets.token_urlsafe(PAYLOAD_CHARS * 3 // 4) for _ in range(BIG_RECORDS)]
    assert {len(p) for p in payloads} == {PAYLOAD_CHARS}
    return json.dumps({"records": [{"payload": p} for p in payloads]}).encode()


async def scrape(http: httpx.AsyncClient) -> dict[str, float]:
    """The server's metrics that these tests watch, by name with labels as exposed."""
    samples: dict[str, float] = {}
    for line in (await http.get("/metrics")).text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in WATCHED:
            samples[match.group(1)] = float(match.group(2))
    assert set(samples) == WATCHED, WATCHED - set(samples)
    return samples


async def full_stream(http: httpx.AsyncClient, headers: dict[str, str], run_id: str) -> str:
    """A ``block`` stream (consumer ``c``, 500 unread records at most, 300 s wait) whose
    unread credit is full."""
    body = definition_body(
        max_unread_items=CEILING, on_unread_full="block", block_timeout_ms=300_000
    )
    created = await http.post(f"{API}/runs/{run_id}/streams", json=body, headers=headers)
    assert created.status_code == 201, created.text
    sid = str(body["stream_id"])
    filled = await http.post(
        records_url(run_id, sid),
        json={"records": [{"payload": i} for i in range(CEILING)]},
        headers=headers,
    )
    assert filled.status_code == 201, filled.text
    assert filled.json() == {"first_sequence": 1, "last_sequence": CEILING}
    return sid


async def latest_sequence(
    http: httpx.AsyncClient, headers: dict[str, str], run_id: str, sid: str
) -> int:
    response = await http.get(stream_url(run_id, sid), headers=headers)
    assert response.status_code == 200, response.text
    return int(response.json()["state"]["latest_sequence"])


async def ack(
    http: httpx.AsyncClient, headers: dict[str, str], run_id: str, sid: str, sequence: int
) -> None:
    response = await http.post(
        ack_url(run_id, sid, "c"), json={"sequence": sequence}, headers=headers
    )
    assert response.status_code == 200, response.text


async def raw_request(
    port: int, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A request sent whole on a socket of its own; the caller closes it unanswered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    return reader, writer


async def post_big(
    port: int, run_id: str, sid: str, headers: dict[str, str], body: bytes
) -> asyncio.StreamWriter:
    """``body`` appended to ``sid`` from a socket of its own; the caller closes it."""
    _, writer = await raw_request(
        port,
        "POST",
        records_url(run_id, sid),
        {**headers, "Content-Type": "application/json"},
        body,
    )
    return writer


async def hang_up(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


async def active_appends(pool: asyncpg.Pool) -> list[str]:
    """Append statements running in this database now (the server's, or anyone's)."""
    rows = await pool.fetch(
        """
        SELECT query FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND state <> 'idle'
           AND (query LIKE '%append_requests%' OR query LIKE '%append_stream_groups%'
                OR query LIKE '%append_staged_payloads%')
        """
    )
    return [row["query"][:80] for row in rows]


async def temp_bytes(pool: asyncpg.Pool) -> int:
    return int(
        await pool.fetchval(
            "SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()"
        )
    )


async def watched_stops(
    http: httpx.AsyncClient,
    pool: asyncpg.Pool,
    before: dict[str, float],
    waiting: str,
    gone: str,
    count: int = 1,
) -> dict[str, float]:
    """After ``count`` hang-ups: the waits end (the gauge back to where it was, each
    counted as abandoned) and no append statement runs in Postgres."""
    after = await eventually(
        lambda: scrape(http),
        lambda m: m[waiting] == before[waiting] and m[gone] == before[gone] + count,
        timeout=30,
        what="the wait ended as abandoned",
    )
    await eventually(lambda: active_appends(pool), lambda q: q == [], timeout=30, what="no append")
    return after


async def nothing_happens_for_a_while() -> None:
    """The window in which a wait that had not stopped would act: it looks at least
    every LOST_WAKE_RECHECK_SECONDS, and an ack wakes it at once. (Not a poll: the check
    is that nothing happens.)"""
    await asyncio.sleep(3 * LOST_WAKE_RECHECK_SECONDS)


@pytest.mark.timeout(300)
async def test_an_abandoned_blocking_append_stops_and_is_never_appended(
    gone_server: ServerProcess,
    http: httpx.AsyncClient,
    auth: TokenFactory,
    run_id: str,
    pool: asyncpg.Pool,
    big_body: bytes,
) -> None:
    headers = auth()
    sid = await full_stream(http, headers, run_id)
    before = await scrape(http)
    temp_before = await temp_bytes(pool)
    writer = await post_big(gone_server.port, run_id, sid, headers, big_body)
    waiting = await eventually(
        lambda: scrape(http), lambda m: m[WAITING] == 1, timeout=60, what="the append waits"
    )
    assert waiting[STAGED] - before[STAGED] == 1  # its first attempt, refused

    await hang_up(writer)
    await watched_stops(http, pool, before, WAITING, ABANDONED)

    # Credit frees: a wait that had not stopped would now send the batch, and it fits.
    await ack(http, headers, run_id, sid, CEILING)
    await nothing_happens_for_a_while()
    assert await latest_sequence(http, headers, run_id, sid) == CEILING
    after = await scrape(http)
    assert after[STAGED] == waiting[STAGED]
    assert after[SENT] == before[SENT]
    assert await active_appends(pool) == []
    # Temporary files: at most what one sending of the batch may write (Postgres 15
    # writes none for a refused staged statement here; it reports them lazily).
    assert await temp_bytes(pool) - temp_before < 2 * BATCH_BYTES
    # The stream takes appends again: the abandoned batch left nothing behind.
    again = await http.post(
        records_url(run_id, sid), json={"records": [{"payload": "next"}]}, headers=headers
    )
    assert again.status_code == 201, again.text
    assert again.json() == {"first_sequence": CEILING + 1, "last_sequence": CEILING + 1}


@pytest.mark.parametrize("policy", ["block", "reject"])
@pytest.mark.timeout(300)
async def test_an_append_whose_caller_goes_while_it_is_queued_is_never_sent(
    gone_server: ServerProcess,
    http: httpx.AsyncClient,
    auth: TokenFactory,
    run_id: str,
    pool: asyncpg.Pool,
    big_body: bytes,
    policy: str,
) -> None:
    """A large append queued behind its stream's statement in flight (credit is free:
    it would go in) whose client hangs up is dropped unsent: not appended, not staged,
    once the statement ahead of it commits. Both credit policies: a ``block`` stream's
    first attempt, and a ``reject`` stream's only one."""
    headers = auth()
    body = definition_body(
        max_unread_items=10 * CEILING, on_unread_full=policy, block_timeout_ms=300_000
    )
    created = await http.post(f"{API}/runs/{run_id}/streams", json=body, headers=headers)
    assert created.status_code == 201, created.text
    sid = str(body["stream_id"])
    before = await scrape(http)
    async with pool.acquire() as locker:
        lock = locker.transaction()
        await lock.start()
        try:
            # The stream's row locked here: the first append's statement waits in Postgres.
            await locker.execute(
                "SELECT 1 FROM workflow_streams.streams"
                " WHERE run_id = $1 AND stream_id = $2 FOR UPDATE",
                run_id,
                sid,
            )
            first = asyncio.create_task(
                http.post(
                    records_url(run_id, sid), json={"records": [{"payload": 1}]}, headers=headers
                )
            )
            await eventually(
                lambda: active_appends(pool), lambda q: len(q) == 1, what="first statement"
            )
            writer = await post_big(gone_server.port, run_id, sid, headers, big_body)
            await hang_up(writer)
            await eventually(
                lambda: scrape(http),
                lambda m: m[QUEUED_ABANDONED] == before[QUEUED_ABANDONED] + 1,
                timeout=60,
                what="the queued append dropped",
            )
            assert not first.done()
        finally:
            await lock.rollback()
    answer = await first
    assert answer.status_code == 201, answer.text
    assert answer.json() == {"first_sequence": 1, "last_sequence": 1}
    await nothing_happens_for_a_while()
    assert await latest_sequence(http, headers, run_id, sid) == 1
    after = await scrape(http)
    assert after[STAGED] == before[STAGED]
    assert await active_appends(pool) == []


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def lone_server(settings: Settings, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of this test alone: its memory is this test's."""
    with ServerProcess(settings, log_path=tmp_path / "serve.log") as server:
        yield server


WAITERS = 4


@pytest.mark.timeout(300)
async def test_another_tenants_appends_go_on_and_memory_comes_back(
    lone_server: ServerProcess,
    auth: TokenFactory,
    run_id: str,
    pool: asyncpg.Pool,
    big_body: bytes,
) -> None:
    """Four 24 MB appends wait on a full stream while another tenant appends one record
    at a time; the waiting batches are sent once each, whatever the wakes. Their
    clients go: the server gives their memory back."""
    assert lone_server.process is not None
    pid = lone_server.process.pid
    headers = auth()
    other = auth(tenant=f"t-{uuid.uuid4().hex[:8]}")
    other_run = f"run-{uuid.uuid4().hex[:12]}"
    async with httpx.AsyncClient(base_url=lone_server.url, timeout=120) as http:
        sid = await full_stream(http, headers, run_id)
        created = await http.post(
            f"{API}/runs/{other_run}/streams",
            json={"stream_id": "busy", "direction": "output"},
            headers=other,
        )
        assert created.status_code == 201, created.text
        before = await scrape(http)
        rss_before = rss_mib(pid)
        writers = []
        # One at a time: two first attempts queued together would go in one staged
        # statement, and the count of statements would no longer count the batches.
        for waiting in range(1, WAITERS + 1):
            writer = await post_big(lone_server.port, run_id, sid, headers, big_body)
            writers.append(writer)
            await eventually(
                lambda: scrape(http),
                lambda m, waiting=waiting: m[WAITING] == waiting,
                timeout=120,
                what=f"append {waiting} waits",
            )
        rss_held = rss_mib(pid)
        # The other tenant appends while they wait, over several of their re-checks,
        # and its own stream wakes at each of its appends.
        sequences = []
        for i in range(40):
            answer = await http.post(
                records_url(other_run, "busy"), json={"records": [{"payload": i}]}, headers=other
            )
            assert answer.status_code == 201, answer.text
            sequences.append(answer.json()["first_sequence"])
            await asyncio.sleep(0.05)  # a steady trickle, not a flood
        assert sequences == list(range(1, 41))
        during = await scrape(http)
        assert during[STAGED] - before[STAGED] == WAITERS  # each batch sent once
        assert during[SENT] == before[SENT]
        assert during[WAITING] == WAITERS

        for writer in writers:
            await hang_up(writer)
        await watched_stops(http, pool, before, WAITING, ABANDONED, WAITERS)

        async def rss() -> float:
            return rss_mib(pid)

        rss_after = await eventually(
            rss,
            lambda mib: mib < rss_before + (rss_held - rss_before) / 4,
            timeout=30,
            what="the batches' memory given back",
        )
        print(
            f"RSS before {rss_before:.0f} MiB, {WAITERS} batches waiting {rss_held:.0f} MiB, "
            f"after their clients went {rss_after:.0f} MiB"
        )
        # They held their batches (one copy each) while they waited.
        assert rss_held - rss_before > WAITERS * BATCH_BYTES / 2**20 / 2
        assert (await scrape(http))[STAGED] - before[STAGED] == WAITERS


@pytest.mark.timeout(300)
async def test_acks_that_free_too_little_do_not_send_a_waiting_batch_again(
    http: httpx.AsyncClient,
    auth: TokenFactory,
    run_id: str,
    pool: asyncpg.Pool,
    big_body: bytes,
) -> None:
    headers = auth()
    sid = await full_stream(http, headers, run_id)
    before = await scrape(http)
    temp_before = await temp_bytes(pool)
    append = asyncio.create_task(
        http.post(
            records_url(run_id, sid),
            content=big_body,
            headers={**headers, "Content-Type": "application/json"},
        )
    )
    waiting = await eventually(
        lambda: scrape(http), lambda m: m[WAITING] == 1, timeout=60, what="the append waits"
    )
    assert waiting[STAGED] - before[STAGED] == 1
    looked = waiting[STILL_REFUSED]
    # Each ack frees 100 records: 400, 300, 200 unread + 400 still pass the ceiling.
    for acked in (100, 200, 300):
        await ack(http, headers, run_id, sid, acked)
        now = await eventually(
            lambda: scrape(http),
            lambda m, seen=looked: m[STILL_REFUSED] > seen,
            timeout=30,
            what=f"a look after the ack of {acked}",
        )
        looked = now[STILL_REFUSED]
        assert now[STAGED] == waiting[STAGED]  # nothing sent, nothing staged
        assert now[SENT] == before[SENT]
        assert now[WAITING] == 1
        assert not append.done()
    # At most the first attempt's temporary files so far.
    assert await temp_bytes(pool) - temp_before < 2 * BATCH_BYTES

    await ack(http, headers, run_id, sid, 400)  # 100 unread + 400 = the ceiling: fits
    response = await asyncio.wait_for(append, 60)
    assert response.status_code == 201, response.text
    assert response.json() == {"first_sequence": CEILING + 1, "last_sequence": CEILING + 400}
    after = await scrape(http)
    assert after[STAGED] - before[STAGED] == 2  # the first attempt and the one that fit
    assert after[SENT] - before[SENT] == 1
    assert after[WAITING] == 0
    assert after[ABANDONED] == before[ABANDONED]


@pytest.mark.timeout(120)
async def test_an_abandoned_durable_streams_append_stops_and_is_never_appended(
    gone_server: ServerProcess,
    http: httpx.AsyncClient,
    auth: TokenFactory,
    run_id: str,
    pool: asyncpg.Pool,
) -> None:
    headers = auth()
    sid = await full_stream(http, headers, run_id)
    before = await scrape(http)
    _, writer = await raw_request(
        gone_server.port,
        "POST",
        f"{API}/runs/{run_id}/ds/v1/stream/{sid}",
        {**headers, "Content-Type": "application/json"},
        b'[{"from": "ds"}]',
    )
    await eventually(
        lambda: scrape(http), lambda m: m[WAITING] == 1, timeout=30, what="the append waits"
    )
    await hang_up(writer)
    await watched_stops(http, pool, before, WAITING, ABANDONED)
    await ack(http, headers, run_id, sid, CEILING)
    await nothing_happens_for_a_while()
    assert await latest_sequence(http, headers, run_id, sid) == CEILING
    assert (await scrape(http))[SENT] == before[SENT]


@pytest.mark.timeout(120)
async def test_an_abandoned_object_commit_stops_and_is_never_committed(
    gone_server: ServerProcess,
    http: httpx.AsyncClient,
    auth: TokenFactory,
    run_id: str,
    pool: asyncpg.Pool,
) -> None:
    headers = auth()
    sid = await full_stream(http, headers, run_id)
    api = ObjectApi(http, headers, run_id, sid)
    data = b"an object whose commit waits for credit"
    prepared = await api.prepare(prepare_body(data))
    assert prepared.status_code == 201, prepared.text
    object_id = prepared.json()["object_id"]
    assert (await api.upload(object_id, data)).status_code == 200
    before = await scrape(http)
    _, writer = await raw_request(
        gone_server.port, "POST", f"{api.base}/objects/{object_id}/commit", headers
    )
    await eventually(
        lambda: scrape(http), lambda m: m[WAITING] == 1, timeout=30, what="the commit waits"
    )
    await hang_up(writer)
    await watched_stops(http, pool, before, WAITING, ABANDONED)
    await ack(http, headers, run_id, sid, CEILING)
    await nothing_happens_for_a_while()
    assert await latest_sequence(http, headers, run_id, sid) == CEILING
    state = await api.state(object_id)
    assert state.status_code == 200, state.text
    assert state.json()["state"] == "uploaded"  # not committed
    # Its caller may commit it again later: it goes in then, once.
    committed = await api.commit(object_id)
    assert committed.status_code == 201, committed.text
    assert committed.json() == {"sequence": CEILING + 1}


@pytest.mark.timeout(120)
async def test_an_abandoned_long_poll_stops_waiting(
    gone_server: ServerProcess, http: httpx.AsyncClient, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    sid = f"lp-{uuid.uuid4().hex[:8]}"
    created = await http.post(
        f"{API}/runs/{run_id}/streams",
        json={"stream_id": sid, "direction": "output"},
        headers=headers,
    )
    assert created.status_code == 201, created.text
    before = await scrape(http)
    _, writer = await raw_request(
        gone_server.port,
        "GET",
        f"{API}/runs/{run_id}/ds/v1/stream/{sid}?offset=now&live=long-poll",
        headers,
    )
    await eventually(
        lambda: scrape(http),
        lambda m: m[LONG_POLLS] == before[LONG_POLLS] + 1,
        timeout=30,
        what="the long-poll waits",
    )
    await hang_up(writer)
    await eventually(
        lambda: scrape(http),
        lambda m: (
            m[LONG_POLLS] == before[LONG_POLLS]
            and m[LONG_POLLS_ABANDONED] == before[LONG_POLLS_ABANDONED] + 1
        ),
        timeout=30,
        what="the long-poll ended as abandoned",
    )


async def test_a_queued_append_whose_caller_went_is_never_sent(pool: asyncpg.Pool) -> None:
    """The appender drops a request whose caller went before its statement was sent;
    the statement in flight meanwhile finishes and answers its own caller."""
    store = Store(pool)
    ref = await make_stream(store)
    appender = Appender(pool)
    async with pool.acquire() as locker, locker.transaction():
        # The stream's row locked elsewhere: the first statement waits in Postgres.
        await locker.execute(
            "SELECT 1 FROM workflow_streams.streams WHERE stream_pk = $1 FOR UPDATE",
            ref.stream_pk,
        )
        first = asyncio.create_task(appender.append(ref.stream_pk, encode_batch(["first"])))

        async def sent() -> int:
            return appender.statements

        await eventually(sent, lambda n: n == 1, what="the first statement sent")
        queued = asyncio.create_task(appender.append(ref.stream_pk, encode_batch(["gone"])))
        await asyncio.sleep(0)  # queued behind the statement in flight
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert not first.done()
    assert (await first).first_sequence == 1
    after = await appender.append(ref.stream_pk, encode_batch(["after"]))
    assert (after.first_sequence, after.last_sequence) == (2, 2)
    assert appender.statements == 2
    page = await store.read(ref, 0, 10)
    assert [r.payload for r in page.records] == ['"first"', '"after"']
