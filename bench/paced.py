"""What a lone request costs back to back and when requests are paced (an idle machine
between them), as in the SSE benchmark's 200 appends/s.

    python -m bench.paced [--rate 200] [--calls 300] [--rounds 2]

Against a real ``serve --no-workers`` on an isolated database, one at a time, median
milliseconds of: ``SELECT 1`` and the append statement (``records_append_group``, one
record, notifying) on one asyncpg connection; an HTTP request the service answers 404
(uvicorn and Litestar, nothing else); an HTTP append of one record (pre-built request,
raw keep-alive connection). Each is run back to back (the next as soon as the answer
is in) and then paced at ``--rate`` per second. The gap between the two columns is what
waking an idle machine costs; bench/README.md uses it to explain the SSE figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import asyncpg
import httpx
import uvloop

from bench.environment import bench_token, isolated_database, postgres_server, service
from bench.sse_latency import Producer, RawConnection
from ductor_streams.schema import QUERIES
from ductor_streams.schema.migrate import migrate
from tests.support.server import ServerProcess

API = "/api/workflow-streams"
Request = Callable[[int], Awaitable[object]]


async def _median_ms(request: Request, calls: int, rate: float | None) -> float:
    latencies = []
    for i in range(calls):
        started = time.perf_counter()
        await request(i)
        latencies.append(time.perf_counter() - started)
        if rate:
            await asyncio.sleep(max(0.0, started + 1 / rate - time.perf_counter()))
    return statistics.median(latencies) * 1000


async def _not_found(server: ServerProcess) -> tuple[Request, Callable[[], None]]:
    """A GET the service answers 404: the HTTP round trip and nothing else."""
    transport, conn = await asyncio.get_running_loop().create_connection(
        RawConnection, "127.0.0.1", server.port
    )
    request = b"GET /no-such-page HTTP/1.1\r\nHost: bench\r\n\r\n"

    async def get(_i: int) -> None:
        status, _ = await conn.send(request)
        assert status == 404, status

    return get, transport.close


async def _appends(server: ServerProcess, token: str) -> tuple[Request, Callable[[], None]]:
    """One-record HTTP appends on one raw keep-alive connection."""
    producer = Producer("127.0.0.1", server.port, f"{API}/runs/paced/streams/s/records", token)
    await producer.connect(1)
    return producer.append, producer.close


async def run(dsn: str, server: ServerProcess, token: str, args: argparse.Namespace) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        created = await client.post(
            f"{API}/runs/paced/streams",
            json={"stream_id": "s", "direction": "output"},
            headers={"Authorization": f"Bearer {token}"},
        )
        created.raise_for_status()
    conn = await asyncpg.connect(dsn)
    try:
        pk = await conn.fetchval("SELECT stream_pk FROM workflow_streams.streams")
        query = QUERIES["records_append_group"]

        async def on_conn(request: Request) -> tuple[Request, Callable[[], None]]:
            return request, lambda: None

        # HTTP connections are opened per measurement: uvicorn closes a keep-alive
        # connection idle for 5 s, as each is while the others are measured.
        requests: list[tuple[str, Callable[[], Awaitable[tuple[Request, Callable[[], None]]]]]] = [
            ("SELECT 1", lambda: on_conn(lambda _i: conn.fetchval("SELECT 1"))),
            (
                "the append statement",
                lambda: on_conn(
                    lambda _i: conn.fetch(query, pk, [1], [None], ["h"], '{"i":1}', "7", None, True)
                ),
            ),
            ("HTTP 404 (uvicorn + Litestar)", lambda: _not_found(server)),
            ("HTTP append", lambda: _appends(server, token)),
        ]
        print(f"{'request':<32} {'back to back ms':>16} {f'paced {args.rate:g}/s ms':>18}")
        for _ in range(args.rounds):
            for title, open_request in requests:
                request, close = await open_request()
                try:
                    closed = await _median_ms(request, args.calls, None)
                    paced = await _median_ms(request, args.calls, args.rate)
                finally:
                    close()
                print(f"{title:<32} {closed:>16.3f} {paced:>18.3f}")
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paced", description=__doc__)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
        asyncio.run(migrate(dsn))
        with service(dsn) as (server, settings):
            assert settings.jwt_secret is not None
            token = bench_token(settings.jwt_secret)
            uvloop.run(run(dsn, server, token, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
