"""The floor under ``bench.activity_streams``' concurrent load: the same tokens, the same
durable commits and the same SSE followers, with no product code in between.

    python -m tests.support.token_floor --serve --dsn DSN          # the SSE side (prints its port)
    python -m tests.support.token_floor --produce '<json>'         # the producing side

``bench.activity_streams`` runs it in the same run as the activity load (the ``floor``
row), with the same streams, rate and phases:

- a producer process (uvloop) with one task per stream, paced as the worker's stand-in
  model is, queues ``{"i", "t"}`` payloads; one asyncpg connection commits whatever is
  queued, back to back (a group commit: one statement in flight, as the appender), each
  record inserted with its stream and sequence and NOTIFYed with its SSE ``data`` in
  that statement's transaction (``synchronous_commit`` as the server has it);
- a server process (uvloop) LISTENs and writes each notified record to its stream's
  subscribers as one chunk of a ``text/event-stream`` response: no framework, no
  parsing of the record, no authorization;
- the followers are ``bench.sse_followers``, as for the activity load.

It lives with the tests' support code because tests/speed/test_token_floor.py checks
that it stores and delivers every token once, in order; ``python -m bench.token_floor``
runs it as a bench.

What the product adds on top of this is Temporal's activities, the writer and its
idempotency keys, credit, the streams' rows and counters, the wakes' format and the
HTTP framework; the floor is what the machine costs for this load without them.

``--sql`` (the ``sql floor`` row) keeps the two bare processes but puts the product's
Postgres side between them, on streams of the product's schema in a database of their
own: the producer commits each batch of a stream with the appender's statement for
several streams (``records_append_stream_groups``, every batch with an idempotency key
of the writer's shape, its NOTIFY inline, as the appender's statement alone in flight
sends it), and the server LISTENs to the product's wakes and writes each record they
carry. So ``sql floor`` against ``floor`` is what the product's SQL (credit under the
row lock, receipts, counters, the wake's format) costs this load, and ``activity``
against ``sql floor`` what the product's processes (Temporal, the writer, the appender,
``serve``) cost it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import uuid
from typing import Any

import asyncpg

from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.live.hub import CHANNEL as PRODUCT_CHANNEL
from ductor_streams.plugin.streaming.attempt import KEY_PREFIX
from ductor_streams.schema import QUERIES
from ductor_streams.schema.migrate import migrate
from ductor_streams.store.append import statement_arguments
from ductor_streams.store.encoding import batch_of_encoded
from ductor_streams.store.wake_format import parse_record_wake

CHANNEL = "bench_token_floor"
SETUP = """
DROP SCHEMA IF EXISTS bench_token_floor CASCADE;
CREATE SCHEMA bench_token_floor;
CREATE TABLE bench_token_floor.records (
    stream_id bigint NOT NULL, sequence bigint NOT NULL, payload text NOT NULL,
    appended_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (stream_id, sequence));
"""
APPEND = """
WITH r AS (INSERT INTO bench_token_floor.records (stream_id, sequence, payload)
           SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[])
           RETURNING stream_id, sequence, payload, appended_at)
SELECT count(pg_notify('bench_token_floor', stream_id || ' ' || json_build_object(
    'sequence', sequence, 'payload', payload::json, 'appended_at', appended_at)::text))
FROM r
"""
# The ``--sql`` floor's streams: the product's rows, watched (so that their appends wake).
NEW_STREAMS = """
INSERT INTO workflow_streams.streams
       (tenant, run_id, stream_id, direction, definition, watched_until)
SELECT 'bench', r, 'output', 'output', $2::jsonb, now() + interval '1 hour'
  FROM unnest($1::text[]) AS r
RETURNING stream_pk"""
# The producer's connection, as pg_stat_activity names it.
PRODUCER_APPLICATION = "bench_token_floor_producer"
# The shape of a stream_writer batch's key (plugin/streaming/attempt.py): the prefix, the
# attempt's digest, the attempt, the batch's number.
KEY = KEY_PREFIX + "{digest}:1:{number}"
RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def path(stream: int) -> str:
    """The subscribe path of the floor's stream ``stream`` (1, 2, ...)."""
    return f"/floor/{stream}"


async def setup(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SETUP)
    finally:
        await conn.close()


async def setup_sql(dsn: str, count: int) -> list[int]:
    """``count`` watched output streams of the product's schema (migrated here) with an
    activity's stream definition (``model_output``): their stream_pks."""
    await migrate(dsn)
    definition = parse_definition(
        {"stream_id": "output", "direction": "output", "content_class": "model_output"},
        region="local",
        object_store_regions=frozenset(),
    )
    conn = await asyncpg.connect(dsn)
    try:
        run_ids = [f"sql-floor-{uuid.uuid4().hex[:12]}" for _ in range(count)]
        rows = await conn.fetch(NEW_STREAMS, run_ids, json.dumps(definition.to_json_dict()))
    finally:
        await conn.close()
    return sorted(row["stream_pk"] for row in rows)


# -- the SSE side ---------------------------------------------------------------------------


async def serve(dsn: str, sql: bool = False) -> None:
    """Accepts ``GET /floor/<n>`` and writes stream n's notified records to it; prints
    the port, then runs until a line arrives on stdin. ``sql``: the records of the
    product's wakes instead, stream n being stream_pk n."""
    loop = asyncio.get_running_loop()
    subscribers: dict[str, list[asyncio.WriteTransport]] = {}

    class Subscriber(asyncio.Protocol):
        def __init__(self) -> None:
            self.head = b""
            self.subscribed = False
            self.transport: asyncio.WriteTransport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport

        def data_received(self, data: bytes) -> None:
            if self.subscribed or self.transport is None:
                return
            self.head += data
            if b"\r\n\r\n" not in self.head:
                return
            target = self.head.split(b" ", 2)[1].split(b"?", 1)[0].decode()
            stream = target.rsplit("/", 1)[1]
            subscribers.setdefault(stream, []).append(self.transport)
            self.subscribed = True
            self.transport.write(RESPONSE_HEAD)

    server = await loop.create_server(Subscriber, "127.0.0.1", 0)
    conn = await asyncpg.connect(dsn)

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        stream, _, data = payload.partition(" ")
        frame = f"event: record\ndata: {data}\n\n".encode()
        chunk = b"%x\r\n%s\r\n" % (len(frame), frame)
        for transport in subscribers.get(stream, ()):
            transport.write(chunk)

    def on_wake(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        # Read with the product's own parser (the format lives in one place). A wake
        # without its records ('r...') is not written: the followers then miss
        # records, and the run says so.
        wake = parse_record_wake(payload)
        if wake is None:
            return
        stream_pk, _, records = wake
        transports = subscribers.get(str(stream_pk))
        if not transports:
            return
        at = records[0].appended_at.isoformat()
        for record in records:
            frame = (
                f'event: record\ndata: {{"sequence":{record.sequence},'
                f'"payload":{record.payload},"appended_at":"{at}"}}\n\n'
            ).encode()
            chunk = b"%x\r\n%s\r\n" % (len(frame), frame)
            for transport in transports:
                transport.write(chunk)

    if sql:
        await conn.add_listener(PRODUCT_CHANNEL, on_wake)
    else:
        await conn.add_listener(CHANNEL, on_notify)
    print(server.sockets[0].getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    await conn.close()
    server.close()


def start_server(dsn: str, sql: bool = False) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.token_floor", "--serve", "--dsn", dsn]
        + (["--sql"] if sql else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    return process, int(process.stdout.readline())


# -- the producing side ---------------------------------------------------------------------


async def produce(config: dict[str, Any]) -> None:
    """``config``: dsn, tokens, rate, start_at (wall time) and offsets (one per stream:
    its first token's delay after start_at); with ``stream_pks`` (one per stream), the
    ``--sql`` floor's commits. Prints ``done`` once every token has committed, then
    exits on a line on stdin (its CPU is read before it goes)."""
    conn = await asyncpg.connect(
        config["dsn"], server_settings={"application_name": PRODUCER_APPLICATION}
    )
    tokens: int = config["tokens"]
    rate: float = config["rate"]
    offsets: list[float] = config["offsets"]
    stream_pks: list[int] | None = config.get("stream_pks")
    streams = stream_pks or list(range(1, len(offsets) + 1))
    batches_sent: dict[int, int] = {}
    queued: list[tuple[int, int, str]] = []
    arrived = asyncio.Event()

    async def producer(stream: int, offset: float) -> None:
        # Paced as bench/activity_streams_worker.py's stand-in model is.
        delay = config["start_at"] + offset - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        started = time.monotonic()
        for i in range(tokens):
            wait = started + i / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            queued.append((stream, i + 1, json.dumps({"i": i, "t": time.time()})))
            arrived.set()

    async def committer() -> None:
        left = tokens * len(offsets)
        while left:
            await arrived.wait()
            arrived.clear()
            batch = queued[:]
            del queued[:]
            if stream_pks is None:
                await conn.fetchval(
                    APPEND,
                    [s for s, _, _ in batch],
                    [n for _, n, _ in batch],
                    [p for *_, p in batch],
                )
            else:
                await append_sql(conn, batch, batches_sent)
            left -= len(batch)

    await asyncio.gather(
        committer(),
        *(producer(stream, offset) for stream, offset in zip(streams, offsets, strict=True)),
    )
    print("done", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    # Closed only now: the bench reads the CPU of the backends connected to the
    # database after the load, and a backend that has exited is not counted.
    await conn.close()


async def append_sql(
    conn: asyncpg.Connection, queued: list[tuple[int, int, str]], sent: dict[int, int]
) -> None:
    """The queued tokens as one batch per stream, in one ``records_append_stream_groups``
    statement (streams ascending, as the appender sends them); ``sent`` counts each
    stream's batches (their keys' numbers). Raises unless every batch was appended."""
    by_stream: dict[int, list[bytes]] = {}
    for stream_pk, _, payload in queued:
        by_stream.setdefault(stream_pk, []).append(payload.encode())
    pks = sorted(by_stream)
    batches = []
    for pk in pks:
        sent[pk] = number = sent.get(pk, 0) + 1
        key = KEY.format(digest=f"{pk:032x}", number=number)
        batches.append(batch_of_encoded(by_stream[pk], idempotency_key=key))
    rows = await conn.fetch(
        QUERIES["records_append_stream_groups"],
        pks,
        [1] * len(pks),
        [b.count for b in batches],
        *statement_arguments(batches),
        True,  # the wakes inline: one statement in flight, as the appender's alone
        None,
    )
    outcomes = {row["outcome"] for row in rows}
    if outcomes != {"appended"} or len(rows) != len(pks):
        raise RuntimeError(f"the sql floor's append answered {sorted(outcomes)}")


def start_producer(
    dsn: str,
    tokens: int,
    rate: float,
    start_at: float,
    offsets: list[float],
    stream_pks: list[int] | None = None,
) -> subprocess.Popen[str]:
    config: dict[str, Any] = {
        "dsn": dsn,
        "tokens": tokens,
        "rate": rate,
        "start_at": start_at,
        "offsets": offsets,
    }
    if stream_pks is not None:
        config["stream_pks"] = stream_pks
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.token_floor", "--produce", json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_produced(process: subprocess.Popen[str]) -> None:
    """Blocks until the producer has committed every token (it then waits to be told)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "done":
        raise RuntimeError(f"the floor's producer failed (exit {process.wait()})")


def stop(process: subprocess.Popen[str]) -> None:
    """Tells a floor process (server or producer) to exit, and reaps it."""
    assert process.stdin is not None
    process.stdin.write("stop\n")
    process.stdin.flush()
    process.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.token_floor", description=__doc__)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--dsn")
    parser.add_argument("--sql", action="store_true", help="with --serve: the product's wakes")
    parser.add_argument("--produce", metavar="JSON")
    args = parser.parse_args(argv)
    import uvloop

    if args.serve and args.dsn:
        uvloop.run(serve(args.dsn, args.sql))
    elif args.produce:
        uvloop.run(produce(json.loads(args.produce)))
    else:
        parser.error("--serve --dsn DSN or --produce JSON (bench.activity_streams runs both)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
