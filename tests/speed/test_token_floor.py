"""tests/support/token_floor.py (``python -m bench.token_floor``), the floors
bench.activity_streams prints beside the activity load (bare, and ``--sql`` with the
product's statement and wakes), and tests/support/sse_records.py, the parser with which
bench/sse_followers.py times them all: their figures are quoted, so each floor must
store and deliver every token once, in order, and the followers must time a record by
the bytes that completed it."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time

import asyncpg

from tests.support import token_floor
from tests.support.sse_records import RecordParser

STREAMS = 3
TOKENS = 20


async def _subscribe(port: int, stream: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {token_floor.path(stream)}?cursor=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    # What bench/sse_followers.py checks before it follows.
    assert b" 200 " in head.split(b"\r\n", 1)[0] and b"chunked" in head.lower()
    return reader, writer


async def _follow(reader: asyncio.StreamReader, count: int) -> RecordParser:
    """Reads until ``count`` records have arrived (a deadline of 10 s in all)."""
    parser = RecordParser(chunked=True)
    deadline = time.monotonic() + 10
    while len(parser.sequences) < count:
        data = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
        assert data, "the floor closed the response"
        parser.feed(time.time(), data)
    return parser


async def test_the_floor_stores_and_delivers_every_token_once_in_order(
    database_url: str,
) -> None:
    await token_floor.setup(database_url)
    server, port = await asyncio.to_thread(token_floor.start_server, database_url)
    producer: subprocess.Popen[str] | None = None
    try:
        subscribers = [await _subscribe(port, i + 1) for i in range(STREAMS)]
        started = time.time()
        producer = token_floor.start_producer(
            database_url, TOKENS, 200.0, started + 0.2, [0.0, 0.001, 0.002]
        )
        parsers = await asyncio.gather(*(_follow(r, TOKENS) for r, _ in subscribers))
        await asyncio.to_thread(token_floor.wait_produced, producer)
        for parser in parsers:
            assert parser.sequences == list(range(1, TOKENS + 1))
            assert all(0 < latency < 10_000 for latency in parser.latencies)
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch(
                "SELECT stream_id, array_agg(sequence ORDER BY sequence) AS seqs,"
                " array_agg((payload::json ->> 'i')::int ORDER BY sequence) AS tokens"
                " FROM bench_token_floor.records GROUP BY stream_id ORDER BY stream_id"
            )
            await conn.execute("DROP SCHEMA bench_token_floor CASCADE")
        finally:
            await conn.close()
        assert [r["stream_id"] for r in rows] == [1, 2, 3]
        for row in rows:
            assert row["seqs"] == list(range(1, TOKENS + 1))
            assert row["tokens"] == list(range(TOKENS))
        for _, writer in subscribers:
            writer.close()
    finally:
        if producer is not None:
            token_floor.stop(producer)
        token_floor.stop(server)


async def test_the_sql_floor_appends_through_the_product_and_delivers_its_wakes(
    database_url: str,
) -> None:
    stream_pks = await token_floor.setup_sql(database_url, STREAMS)
    server, port = await asyncio.to_thread(token_floor.start_server, database_url, True)
    producer: subprocess.Popen[str] | None = None
    conn = await asyncpg.connect(database_url)
    try:
        subscribers = [await _subscribe(port, pk) for pk in stream_pks]
        started = time.time()
        producer = token_floor.start_producer(
            database_url, TOKENS, 200.0, started + 0.2, [0.0, 0.001, 0.002], stream_pks
        )
        parsers = await asyncio.gather(*(_follow(r, TOKENS) for r, _ in subscribers))
        await asyncio.to_thread(token_floor.wait_produced, producer)
        for parser in parsers:
            assert parser.sequences == list(range(1, TOKENS + 1))
            assert all(0 < latency < 10_000 for latency in parser.latencies)
        # Done, and still connected: the bench reads its backend's CPU after the load.
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                token_floor.PRODUCER_APPLICATION,
            )
            == 1
        )
        rows = await conn.fetch(
            "SELECT s.stream_pk, s.latest_sequence,"
            " array_agg(r.sequence ORDER BY r.sequence) AS seqs,"
            " array_agg((r.payload::json ->> 'i')::int ORDER BY r.sequence) AS tokens"
            " FROM workflow_streams.streams s JOIN workflow_streams.records r USING (stream_pk)"
            " WHERE s.stream_pk = ANY ($1) GROUP BY s.stream_pk ORDER BY s.stream_pk",
            stream_pks,
        )
        receipts = await conn.fetch(
            "SELECT stream_pk, idempotency_key, first_sequence, last_sequence"
            " FROM workflow_streams.append_receipts WHERE stream_pk = ANY ($1)"
            " ORDER BY stream_pk, first_sequence",
            stream_pks,
        )
        assert [r["stream_pk"] for r in rows] == stream_pks
        for row in rows:
            assert row["latest_sequence"] == TOKENS
            assert row["seqs"] == list(range(1, TOKENS + 1))
            assert row["tokens"] == list(range(TOKENS))
            # One keyed batch per commit that carried the stream: numbered 1, 2, ...,
            # covering its sequences without a gap, as a writer's batches do.
            mine = [r for r in receipts if r["stream_pk"] == row["stream_pk"]]
            assert [r["idempotency_key"].rsplit(":", 1)[1] for r in mine] == [
                str(n) for n in range(1, len(mine) + 1)
            ]
            assert mine[0]["first_sequence"] == 1 and mine[-1]["last_sequence"] == TOKENS
            assert all(
                a["last_sequence"] + 1 == b["first_sequence"] for a, b in itertools.pairwise(mine)
            )
        for _, writer in subscribers:
            writer.close()
    finally:
        await conn.close()
        if producer is not None:
            token_floor.stop(producer)
        token_floor.stop(server)


def test_the_followers_time_a_record_by_the_bytes_that_completed_it() -> None:
    record = (
        b'{"sequence":1,"payload":{"i":0,"t":100.0},"appended_at":"1970-01-01T00:01:40.5+00:00"}'
    )
    frame = b"id: 1\nevent: record\ndata: " + record + b"\n\n"
    chunk = b"%x\r\n%s\r\n" % (len(frame), frame)
    parser = RecordParser(chunked=True)
    # The chunk arrives in three pieces, the size line itself split.
    parser.feed(100.001, chunk[:1])
    parser.feed(100.002, chunk[1:30])
    assert parser.sequences == []
    parser.feed(100.004, chunk[30:])
    assert parser.sequences == [1]
    assert [round(v, 3) for v in parser.latencies] == [4.0]
    assert [round(v, 3) for v in parser.in_store] == [500.0]
    assert parser.received == [100.004]
    # A comment and an event that is not a record are not timed.
    other = b": keep-alive\n\nevent: end\ndata: {}\n\n"
    parser.feed(100.01, b"%x\r\n%s\r\n" % (len(other), other))
    assert parser.sequences == [1]
