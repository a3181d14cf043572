"""Record fingerprints: the same on every path that shows a record, and a resume with
one after a lost commit answered ``409 history_diverged`` (reads, subscribe, the Python
client, the activities' reader). Real Postgres; a real server subprocess for HTTP/SSE."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import asyncpg
import httpx
import msgspec
import pytest
from temporalio.exceptions import ApplicationError

from ductor_streams.activities import error_types
from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.client import HistoryDivergedError, StreamsClient
from ductor_streams.errors import (
    CursorExpired,
    CursorInFuture,
    HistoryDiverged,
    InvalidFingerprint,
)
from ductor_streams.http.codecs.json_bodies import encode_record, record_json
from ductor_streams.plugin.streaming.reader import StreamReader
from ductor_streams.runtime import Runtime
from ductor_streams.store import Store
from ductor_streams.store.fingerprint import parse_fingerprint, record_fingerprint
from ductor_streams.store.read import read_page, read_page_text, verify_fingerprint
from ductor_streams.store.read_frames import read_sse_frames
from ductor_streams.store.wake_format import parse_record_wake, record_wake
from tests.conftest import JWT_SECRET, TokenFactory
from tests.support.credit import append as store_append
from tests.support.credit import make_stream
from tests.support.live import (
    Collected,
    append,
    collect_sse,
    create_stream,
    eventually,
    stream_pk,
    stream_url,
)
from tests.support.lost_commits import lose_commits_after

pytestmark = pytest.mark.timeout(90)

# A fingerprint of the right form that no record here has.
OTHER = "0000000000000001-1"

STORED = (
    "SELECT sequence, workflow_streams.record_fingerprint(sequence, appended_at, size) AS fp"
    "  FROM workflow_streams.records WHERE stream_pk = $1 ORDER BY sequence"
)


async def stored_fingerprints(pool: asyncpg.Pool, pk: int) -> dict[int, str]:
    return {r["sequence"]: r["fp"] for r in await pool.fetch(STORED, pk)}


# -- one text, written by Postgres and by Python ----------------------------------------


@pytest.mark.parametrize(
    ("sequence", "at", "size"),
    [
        (1, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), 0),
        (2, datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=UTC), 17),
        (99, datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), 65_536),
        (2**62, datetime(1999, 12, 31, 23, 59, 59, 120000, tzinfo=UTC), 2**31 - 1),
        (7, datetime(2150, 6, 1, 12, 0, 0, 5, tzinfo=UTC), 1),
        (123_456_789, datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), 300),
    ],
)
async def test_postgres_and_python_write_the_same_fingerprint(
    pool: asyncpg.Pool, sequence: int, at: datetime, size: int
) -> None:
    in_sql = await pool.fetchval(
        "SELECT workflow_streams.record_fingerprint($1, $2, $3)", sequence, at, size
    )
    assert in_sql == record_fingerprint(sequence, at, size)
    assert parse_fingerprint(in_sql, 1) == in_sql


async def test_the_fingerprint_tells_a_reused_sequence_apart() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    later = datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=UTC)
    one = record_fingerprint(5, at, 10)
    assert one != record_fingerprint(5, later, 10)  # another commit of the sequence
    assert one != record_fingerprint(5, at, 11)  # another size


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "abc",
        "1-1",  # not of this form
        "0000000000000001",
        "0000000000000001-",
        "000000000000001-1",  # 15 digits of time
        "00000000000000001-1",
        "000000000000000A-1",
        "0000000000000001-1-1",
        "0000000000000001-111111111",
        OTHER + "\n",
        " " + OTHER,
    ],
)
def test_a_malformed_fingerprint_is_invalid(raw: str) -> None:
    with pytest.raises(InvalidFingerprint):
        parse_fingerprint(raw, 3)


def test_a_fingerprint_with_cursor_zero_is_not_checked() -> None:
    assert parse_fingerprint(OTHER, 0) is None
    with pytest.raises(InvalidFingerprint):
        parse_fingerprint("nope", 0)  # still one of the right form


# -- every path of this process --------------------------------------------------------


async def test_every_read_path_writes_the_stored_fingerprint(store: Store, pool: asyncpg.Pool):
    ref = await make_stream(store, max_unread_items=None)
    await store_append(store, ref, [{"n": 1}, "two", [3, 3, 3]])
    await store_append(store, ref, [{"big": "x" * 3000}])
    await pool.execute(  # a record that refers to an object, as an object commit writes
        "UPDATE workflow_streams.records SET object = $3::jsonb"
        " WHERE stream_pk = $1 AND sequence = $2",
        ref.stream_pk,
        4,
        '{"object_id": "o-1", "size": 3}',
    )
    expected = await stored_fingerprints(pool, ref.stream_pk)
    assert len(expected) == 4

    # Paged read, JSON written by Postgres (the page before the object record).
    text = await read_page_text(pool, ref.stream_pk, 0, 3)
    assert text is not None and text.count == 3
    page_json = json.loads("[" + text.records_json + "]")
    assert {r["sequence"]: r["fingerprint"] for r in page_json} == {
        s: expected[s] for s in (1, 2, 3)
    }
    # The record path (redaction, object pages), both encodings.
    page = await read_page(pool, ref.stream_pk, 0, 10)
    assert {r.sequence: record_json(r, [])["fingerprint"] for r in page.records} == expected
    encoded = {
        r.sequence: msgspec.json.decode(encode_record(r, []))["fingerprint"] for r in page.records
    }
    assert encoded == expected
    assert record_json(page.records[3], ["/n"])["object"] == {"object_id": "o-1", "size": 3}
    # SSE backfill frames written by Postgres.
    frames = await read_sse_frames(pool, ref.stream_pk, 0, 10, max_bytes=1 << 20)
    assert frames is not None and frames.count == 3
    datas = [
        json.loads(line[len("data: ") :])
        for line in frames.frames.decode().splitlines()
        if line.startswith("data: ")
    ]
    assert [d["fingerprint"] for d in datas] == [expected[s] for s in (1, 2, 3)]
    # A wake that carries the records to another process (appended_at in microseconds).
    wake = record_wake(ref.stream_pk, page.records[:3])
    assert wake is not None
    parsed = parse_record_wake(wake)
    assert parsed is not None
    carried = [msgspec.json.decode(encode_record(r, []))["fingerprint"] for r in parsed[2]]
    assert carried == [expected[s] for s in (1, 2, 3)]


async def test_records_fed_from_a_commit_carry_the_stored_fingerprint(
    runtime: Runtime, pool: asyncpg.Pool
) -> None:
    """The live fan-out of this process's own commit (store/append.py committed_records)
    writes what a read of the same records writes."""
    ref = await make_stream(runtime.store, max_unread_items=None)
    subscription = await runtime.followers.subscribe(ref.stream_pk, 0)
    try:
        await store_append(runtime.store, ref, ["a", {"b": 2}])
        got: list[Any] = []

        async def receive() -> bool:
            item = await subscription.next(0.05)
            if isinstance(item, list):
                got.extend(r for batch in item for r in batch.records)
            return len(got) >= 2

        await eventually(receive, what="the fed records")
    finally:
        runtime.followers.release(ref.stream_pk, subscription)
    expected = await stored_fingerprints(pool, ref.stream_pk)
    fed = {r.sequence: msgspec.json.decode(encode_record(r, []))["fingerprint"] for r in got}
    assert fed == expected


# -- checks against the stored record, in the store ----------------------------------------


async def test_the_store_checks_the_record_at_the_cursor(store: Store, pool: asyncpg.Pool):
    ref = await make_stream(store, max_unread_items=None)
    # Sizes 1 to 5: records of one commit differ in their fingerprints by size alone.
    await store_append(store, ref, [1, 22, 333, 4444, 55555])
    fp = await stored_fingerprints(pool, ref.stream_pk)
    pk = ref.stream_pk

    # The stored record: both ways answer as without a fingerprint.
    text = await read_page_text(pool, pk, 3, 10, fingerprint=fp[3])
    assert text is not None and text.count == 2
    await verify_fingerprint(pool, pk, 3, fp[3])
    # Another record's fingerprint: diverged, with what is stored there.
    with pytest.raises(HistoryDiverged) as caught:
        await read_page_text(pool, pk, 3, 10, fingerprint=fp[2])
    assert caught.value.extra == {
        "sequence": 3,
        "fingerprint": fp[2],
        "stored_fingerprint": fp[3],
        "earliest_sequence": 1,
        "latest_sequence": 5,
        "resync_reason": "history_diverged",
    }
    with pytest.raises(HistoryDiverged):
        await verify_fingerprint(pool, pk, 3, fp[2])
    # Past the latest sequence: with a fingerprint, a record the stream no longer has.
    with pytest.raises(HistoryDiverged) as beyond:
        await read_page_text(pool, pk, 6, 10, fingerprint=fp[5])
    assert beyond.value.extra["stored_fingerprint"] is None
    with pytest.raises(CursorInFuture):
        await read_page_text(pool, pk, 6, 10)
    # Cursor 0 has no record: nothing to compare.
    assert (await read_page_text(pool, pk, 0, 10, fingerprint=fp[1])) is not None

    # Retention removed 1..3: the 410 comes first; a removed record at the cursor passes.
    await pool.execute(
        "DELETE FROM workflow_streams.records WHERE stream_pk = $1 AND sequence < 4", pk
    )
    await pool.execute(
        "UPDATE workflow_streams.streams SET earliest_sequence = 4 WHERE stream_pk = $1", pk
    )
    with pytest.raises(CursorExpired):
        await read_page_text(pool, pk, 2, 10, fingerprint=OTHER)
    with pytest.raises(CursorExpired):
        await verify_fingerprint(pool, pk, 2, OTHER)
    text = await read_page_text(pool, pk, 3, 10, fingerprint=OTHER)
    assert text is not None and text.count == 2
    await verify_fingerprint(pool, pk, 3, OTHER)
    # A record still there is compared as before.
    with pytest.raises(HistoryDiverged):
        await verify_fingerprint(pool, pk, 4, OTHER)


# -- over HTTP, SSE and the Python client, against a server subprocess ---------------------


def client_token(tenant: str, ttl: int = 600) -> str:
    return issue_token(
        JWT_SECRET, sub="tester", tenant=tenant, scopes=list(SCOPES), runs=["*"], ttl_seconds=ttl
    )


async def test_fingerprints_agree_across_reads_sse_and_the_client(
    server: Any, auth: TokenFactory, tenant: str, run_id: str, pool: asyncpg.Pool
) -> None:
    h = auth()
    redacted = auth(scopes=[s for s in SCOPES if s != "streams:read_unredacted"])
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "out", h, redaction={"json_pointers": ["/secret"]})
        await append(c, run_id, "out", [{"n": i, "secret": "s"} for i in range(1, 6)], h)
        url = stream_url(run_id, "out")
        plain = (await c.get(url + "/records", headers=h)).json()["records"]
        hidden = (await c.get(url + "/records", headers=redacted)).json()["records"]
        assert hidden[0]["payload"]["secret"] == "[REDACTED]"  # the record-by-record path
        # SSE: the backfill (Postgres' frames), then records fanned out live.
        got = Collected()
        task = asyncio.create_task(
            collect_sse(server.url, url + "/subscribe", h, until=8, into=got)
        )
        await eventually(lambda: len(got.sequences) == 5, what="the backfill")
        await append(c, run_id, "out", [{"n": 6}, {"n": 7}, {"n": 8}], h)
        await asyncio.wait_for(task, 30)
        everything = (await c.get(url + "/records", headers=h)).json()["records"]
    pk = await stream_pk(pool, tenant, run_id, "out")
    expected = await stored_fingerprints(pool, pk)
    assert len(expected) == 8
    assert {r["sequence"]: r["fingerprint"] for r in plain} == {s: expected[s] for s in range(1, 6)}
    assert [r["fingerprint"] for r in hidden] == [r["fingerprint"] for r in plain]
    assert [r["fingerprint"] for r in got.records] == [expected[s] for s in range(1, 9)]
    assert got.ids == [str(s) for s in range(1, 9)]  # the id stays the plain sequence
    assert [r["fingerprint"] for r in everything] == [expected[s] for s in range(1, 9)]

    async with StreamsClient(server.url, client_token(tenant)) as client:
        page = await client.read(run_id, "out", cursor=0, limit=3)
        assert [r.fingerprint for r in page.records] == [expected[s] for s in (1, 2, 3)]
        assert page.next_fingerprint == expected[3]
        following = await client.read(
            run_id, "out", cursor=page.next_cursor, fingerprint=page.next_fingerprint
        )
        assert [r.sequence for r in following.records] == [4, 5, 6, 7, 8]
        empty = await client.read(run_id, "out", cursor=8, fingerprint=expected[8])
        assert empty.records == [] and empty.next_fingerprint == expected[8]
        subscribed = []
        async for record in client.subscribe(run_id, "out", cursor=6, fingerprint=expected[6]):
            subscribed.append((record.sequence, record.fingerprint))
            if record.sequence == 8:
                break
        assert subscribed == [(7, expected[7]), (8, expected[8])]


async def test_a_lost_commit_is_history_diverged_on_read_and_subscribe(
    server: Any, auth: TokenFactory, tenant: str, run_id: str, pool: asyncpg.Pool
) -> None:
    h = auth()
    redacted = auth(scopes=[s for s in SCOPES if s != "streams:read_unredacted"])
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "out", h, redaction={"json_pointers": ["/secret"]})
        await append(c, run_id, "out", [{"n": i} for i in range(1, 6)], h)
        url = stream_url(run_id, "out")
        seen = {
            r["sequence"]: r["fingerprint"]
            for r in (await c.get(url + "/records", headers=h)).json()["records"]
        }
        pk = await stream_pk(pool, tenant, run_id, "out")

        async def read(
            cursor: int, fingerprint: str | None, headers: dict[str, str] = h
        ) -> httpx.Response:
            params: dict[str, Any] = {"cursor": cursor}
            if fingerprint is not None:
                params["fingerprint"] = fingerprint
            return await c.get(url + "/records", headers=headers, params=params)

        # Before anything was lost, a resume with the fingerprint reads as without one.
        ok = await read(3, seen[3])
        assert ok.status_code == 200 and [r["sequence"] for r in ok.json()["records"]] == [4, 5]
        assert (await read(3, seen[3], redacted)).status_code == 200
        assert (await read(0, OTHER)).status_code == 200  # cursor 0: not checked

        # The failover lost 3..5; the reader had them.
        await lose_commits_after(pool, pk, keep=2)
        beyond = await read(5, seen[5])
        assert beyond.status_code == 409, beyond.text
        assert beyond.headers["content-type"].startswith("application/problem+json")
        problem = beyond.json()
        assert problem["code"] == "history_diverged"
        assert (problem["sequence"], problem["fingerprint"], problem["stored_fingerprint"]) == (
            5,
            seen[5],
            None,
        )
        assert (problem["latest_sequence"], problem["resync_reason"]) == (2, "history_diverged")
        assert "cursor 0" in problem["detail"]
        assert (await read(5, None)).json()["code"] == "cursor_in_future"  # as today
        assert (await read(2, seen[2])).status_code == 200  # 2 survived

        # The new primary appends other records under the lost sequences.
        assert await append(
            c, run_id, "out", [{"n": "new-3"}, {"n": "new-4"}, {"n": "new-5"}], h
        ) == (3, 5)
        now = await stored_fingerprints(pool, pk)
        assert now[1] == seen[1] and now[2] == seen[2]
        assert all(now[s] != seen[s] for s in (3, 4, 5))
        for cursor in (3, 5):
            for headers in (h, redacted):  # Postgres' page, and the record-by-record path
                diverged = await read(cursor, seen[cursor], headers)
                assert diverged.status_code == 409, diverged.text
                body = diverged.json()
                assert body["code"] == "history_diverged"
                assert (body["sequence"], body["stored_fingerprint"]) == (cursor, now[cursor])
        # Without a fingerprint the reader is not told (the case this exists for).
        blind = await read(5, None)
        assert blind.status_code == 200 and blind.json()["records"] == []
        # The new records, with their own fingerprints, verify as any other.
        assert (await read(4, now[4])).status_code == 200
        # Bad input changes nothing: 400 with its own code.
        bad = await read(3, "not-a-fingerprint")
        assert (bad.status_code, bad.json()["code"]) == (400, "invalid_fingerprint")

        # Subscribe: Last-Event-ID with the fingerprint of the record at it.
        async def subscribe(last_event_id: str, fingerprint: str) -> httpx.Response:
            async with c.stream(
                "GET",
                url + "/subscribe",
                headers={**h, "Last-Event-ID": last_event_id},
                params={"fingerprint": fingerprint, "cursor": 1},
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                return response

        sse = await subscribe("5", seen[5])
        assert sse.status_code == 409 and sse.json()["code"] == "history_diverged"
        assert sse.json()["sequence"] == 5  # Last-Event-ID is the cursor it checks
        sse = await subscribe("4", "xyz")
        assert (sse.status_code, sse.json()["code"]) == (400, "invalid_fingerprint")
        resumed = await collect_sse(
            server.url,
            url + "/subscribe",
            {**h, "Last-Event-ID": "2"},
            params={"fingerprint": seen[2]},
            until=5,
        )
        assert [r["payload"]["n"] for r in resumed.records] == ["new-3", "new-4", "new-5"]

    # The Python client raises the typed error, on a read and on a subscribe.
    async with StreamsClient(server.url, client_token(tenant)) as client:
        with pytest.raises(HistoryDivergedError) as caught:
            await client.read(run_id, "out", cursor=4, fingerprint=seen[4])
        error = caught.value
        assert (error.status, error.code, error.sequence) == (409, "history_diverged", 4)
        assert (error.fingerprint, error.stored_fingerprint) == (seen[4], now[4])
        assert error.latest_sequence == 5
        with pytest.raises(HistoryDivergedError):
            async for _ in client.subscribe(run_id, "out", cursor=5, fingerprint=seen[5]):
                pass


async def test_the_client_reconnects_with_the_last_fingerprint(
    server: Any, auth: TokenFactory, tenant: str, run_id: str, pool: asyncpg.Pool
) -> None:
    """A subscription that loses its connection after a failover lost what it had read
    raises HistoryDivergedError on its reconnect instead of skipping the new records.
    The connection ends through the token's expiry (the server ends the response, the
    client reconnects at once with a fresh token, Last-Event-ID and the fingerprint)."""
    h = auth()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "out", h)
        await append(c, run_id, "out", [1, 2, 3, 4], h)
    pk = await stream_pk(pool, tenant, run_id, "out")
    tokens = 0

    def provider() -> str:
        nonlocal tokens
        tokens += 1
        return client_token(tenant, ttl=3)

    received: list[int] = []
    async with StreamsClient(server.url, provider) as client:

        async def follow() -> None:
            async for record in client.subscribe(run_id, "out", reconnect_budget=20):
                received.append(record.sequence)
                if record.sequence == 4:
                    # While the connection is up: commits after 2 are lost, and the
                    # new primary writes 3 and 4 again.
                    await lose_commits_after(pool, pk, keep=2)
                    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
                        await append(c, run_id, "out", ["other-3", "other-4"], h)

        with pytest.raises(HistoryDivergedError) as caught:
            await asyncio.wait_for(follow(), 30)
    assert received == [1, 2, 3, 4]
    assert caught.value.sequence == 4 and tokens >= 2  # raised on the reconnect


# -- the activities' reader ----------------------------------------------------------------


class _Attempt:
    """What a reader needs of its activity attempt (plugin/streaming/attempt.py): the
    previous attempt's progress, and heartbeats (counted)."""

    def __init__(self, readers: dict[str, int], fingerprints: dict[str, str]) -> None:
        self.readers = readers
        self.reader_fingerprints = fingerprints
        self.beats = 0

    def opened(self) -> None:
        self.beats += 1

    def closed(self) -> None:
        self.beats += 1

    def heartbeat(self, *, force: bool = False) -> None:
        self.beats += 1


def _activities(runtime: Runtime, tenant: str) -> Any:
    """The parts of ``StreamsActivities`` a reader uses, over the session's runtime."""
    return SimpleNamespace(
        runtime=runtime,
        store=runtime.store,
        settings=SimpleNamespace(tenant=tenant),
        check_egress=lambda ref: None,
    )


async def test_the_activity_reader_resumes_with_the_fingerprint_and_raises_on_divergence(
    runtime: Runtime, pool: asyncpg.Pool
) -> None:
    ref = await make_stream(runtime.store, max_unread_items=None)
    key = ref.key
    await store_append(runtime.store, ref, ["a", "b", "c", "d"])
    seen = await stored_fingerprints(pool, ref.stream_pk)
    current = _activities(runtime, key.tenant)
    stream_key = f"{key.run_id}/{key.stream_id}"

    # Attempt 1 consumes 1 and 2: its heartbeat details keep 2 and its fingerprint.
    first = _Attempt({}, {})
    reader = StreamReader(current, first, key.run_id, key.stream_id, cursor=None, idle_heartbeat=1)
    async with reader:
        records = [await reader.__anext__(), await reader.__anext__(), await reader.__anext__()]
    assert [r.fingerprint for r in records] == [seen[1], seen[2], seen[3]]
    assert first.readers == {stream_key: 2}
    assert first.reader_fingerprints == {stream_key: seen[2]}

    # Attempt 2 resumes after 2: the stream still has it.
    second = _Attempt(dict(first.readers), dict(first.reader_fingerprints))
    reader = StreamReader(current, second, key.run_id, key.stream_id, cursor=None, idle_heartbeat=1)
    async with reader:
        assert (await reader.__anext__()).payload == "c"

    # A failover lost 2..4 and the new primary wrote other records there.
    await lose_commits_after(pool, ref.stream_pk, keep=1)
    await store_append(runtime.store, ref, ["x", "y", "z"])
    third = _Attempt(dict(first.readers), dict(first.reader_fingerprints))
    reader = StreamReader(current, third, key.run_id, key.stream_id, cursor=None, idle_heartbeat=1)
    with pytest.raises(ApplicationError) as caught:
        await reader.__anext__()
    await reader.aclose()
    error = caught.value
    assert error.type == error_types.HISTORY_DIVERGED and error.non_retryable
    assert error.details[0]["code"] == "history_diverged"
    assert error.details[0]["sequence"] == 2

    # A caller's own cursor and fingerprint are checked the same way.
    mine = StreamReader(
        current,
        _Attempt({}, {}),
        key.run_id,
        key.stream_id,
        cursor=3,
        fingerprint=seen[3],
        idle_heartbeat=1,
    )
    with pytest.raises(ApplicationError) as again:
        await mine.__anext__()
    await mine.aclose()
    assert again.value.type == error_types.HISTORY_DIVERGED
