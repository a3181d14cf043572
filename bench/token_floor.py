"""The floor under ``bench.activity_streams``' concurrent load: the same tokens, the same
durable commits and the same SSE followers, with no product code in between.

    python -m bench.token_floor --serve --dsn DSN          # the SSE side (prints its port)
    python -m bench.token_floor --produce '<json>'         # the producing side

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

What the product adds on top of this is Temporal's activities, the writer and its
idempotency keys, credit, the streams' rows and counters, the wakes' format and the
HTTP framework; the floor is what the machine costs for this load without them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import asyncpg

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


# -- the SSE side ---------------------------------------------------------------------------


async def serve(dsn: str) -> None:
    """Accepts ``GET /floor/<n>`` and writes stream n's notified records to it; prints
    the port, then runs until a line arrives on stdin."""
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

    await conn.add_listener(CHANNEL, on_notify)
    print(server.sockets[0].getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    await conn.close()
    server.close()


def start_server(dsn: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.token_floor", "--serve", "--dsn", dsn],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    return process, int(process.stdout.readline())


# -- the producing side ---------------------------------------------------------------------


async def produce(config: dict[str, Any]) -> None:
    """``config``: dsn, tokens, rate, start_at (wall time) and offsets (one per stream:
    its first token's delay after start_at). Prints ``done`` once every token has
    committed, then exits on a line on stdin (its CPU is read before it goes)."""
    conn = await asyncpg.connect(config["dsn"])
    tokens: int = config["tokens"]
    rate: float = config["rate"]
    offsets: list[float] = config["offsets"]
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
            await conn.fetchval(
                APPEND, [s for s, _, _ in batch], [n for _, n, _ in batch], [p for *_, p in batch]
            )
            left -= len(batch)

    await asyncio.gather(
        committer(), *(producer(i + 1, offset) for i, offset in enumerate(offsets))
    )
    await conn.close()
    print("done", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def start_producer(
    dsn: str, tokens: int, rate: float, start_at: float, offsets: list[float]
) -> subprocess.Popen[str]:
    config = {"dsn": dsn, "tokens": tokens, "rate": rate, "start_at": start_at, "offsets": offsets}
    return subprocess.Popen(
        [sys.executable, "-m", "bench.token_floor", "--produce", json.dumps(config)],
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
    parser.add_argument("--produce", metavar="JSON")
    args = parser.parse_args(argv)
    import uvloop

    if args.serve and args.dsn:
        uvloop.run(serve(args.dsn))
    elif args.produce:
        uvloop.run(produce(json.loads(args.produce)))
    else:
        parser.error("--serve --dsn DSN or --produce JSON (bench.activity_streams runs both)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
