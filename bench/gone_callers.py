"""Benchmark: blocked appends whose clients leave, beside another tenant's appends.

    python -m bench.gone_callers [--clients 15] [--records 1000] [--payload-bytes 60000]
                                 [--database-url postgresql://...]

A ``block`` stream (5-minute wait) whose unread credit is full gets ``--clients``
appends of ``--records`` x ``--payload-bytes`` (15 x 60 MB by default), each on a raw
socket; once all of them wait, another tenant appends one record at a time (20, 50 ms
apart); then every client hangs up, and the other tenant appends again. Prints how long
the waits took to end after the hang-ups, the staged statements sent (one per batch
when each is sent once), the server's RSS before, while they wait and 5 s after, the
other tenant's append latency (p50 and max, ms) during and after, and the database's
``temp_bytes`` growth over the whole run. The database is a fresh one, dropped after.
docs/security.md ("Callers that go away") quotes a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support.postgres import create_database, drop_database
from tests.support.server import ServerProcess

API = "/api/workflow-streams"
SECRET = secrets.token_hex(32)
TEMP_BYTES = "SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()"
WAITING = 'ductor_streams_requests_waiting{reason="credit"} '
STAGED = "ductor_streams_append_staged_statements_total "


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _headers(tenant: str) -> dict[str, str]:
    token = issue_token(
        SECRET,
        sub="bench",
        tenant=tenant,
        scopes=["streams:read", "streams:write", "streams:admin", "streams:ack"],
        runs=["*"],
        ttl_seconds=3600,
    )
    return {"Authorization": f"Bearer {token}"}


async def _metric(http: httpx.AsyncClient, prefix: str) -> float:
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    raise RuntimeError(f"no metric {prefix!r}")


async def _until(http: httpx.AsyncClient, done: Callable[[float], bool], every: float) -> None:
    """Poll the waiting gauge until ``done`` (the server has no event to wait on)."""
    deadline = time.monotonic() + 300
    while True:
        waiting = await _metric(http, WAITING)
        if done(waiting):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the waiting gauge stayed at {waiting}")
        await asyncio.sleep(every)


async def _latencies(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> list[float]:
    taken = []
    for i in range(20):
        started = time.perf_counter()
        answer = await http.post(url, json={"records": [{"payload": i}]}, headers=headers)
        taken.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 201, answer.text
        await asyncio.sleep(0.05)
    return taken


def _summary(taken: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(taken), 2), "max_ms": round(max(taken), 2)}


async def _run(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    await migrate(dsn)
    settings = Settings(database_url=dsn, jwt_secret=SECRET, region="local")
    owner, other = _headers("t-blocked"), _headers("t-other")
    blocked = f"{API}/runs/r1/streams/full/records"
    busy = f"{API}/runs/r2/streams/busy/records"
    with ServerProcess(settings) as server:
        assert server.process is not None
        pid = server.process.pid
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            definition = {
                "stream_id": "full",
                "direction": "output",
                "consumers": ["c"],
                "credit": {
                    "max_unread_items": args.records,
                    # The defaults' byte and total ceilings would refuse 60 MB at once.
                    "max_unread_bytes": None,
                    "max_total_items": None,
                    "max_total_bytes": None,
                    "on_unread_full": "block",
                    "block_timeout_ms": 300_000,
                },
            }
            answer = await http.post(f"{API}/runs/r1/streams", json=definition, headers=owner)
            assert answer.status_code == 201, answer.text
            answer = await http.post(
                f"{API}/runs/r2/streams",
                json={"stream_id": "busy", "direction": "output"},
                headers=other,
            )
            assert answer.status_code == 201, answer.text
            # One unread record: no batch of ``--records`` fits until it is acked.
            fill = {"records": [{"payload": 0}]}
            assert (await http.post(blocked, json=fill, headers=owner)).status_code == 201
            body = json.dumps(
                {"records": [{"payload": "x" * args.payload_bytes}] * args.records}
            ).encode()
            async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
                TEMP_BYTES = (
                    "SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()"
                )
                temp_before = await pool.fetchval(TEMP_BYTES)
                rss_before = _rss_mib(pid)
                staged_before = await _metric(http, STAGED)
                head = (
                    f"POST {blocked} HTTP/1.1\r\nHost: bench\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    f"Authorization: {owner['Authorization']}\r\n\r\n"
                ).encode()
                writers = []
                for _ in range(args.clients):
                    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
                    writer.write(head + body)
                    await writer.drain()
                    writers.append(writer)
                await _until(http, lambda waiting: waiting >= args.clients, 0.1)
                rss_waiting = _rss_mib(pid)
                during = await _latencies(http, busy, other)
                hung_up = time.monotonic()
                for writer in writers:
                    writer.close()
                await _until(http, lambda waiting: waiting == 0, 0.01)
                stopped = time.monotonic() - hung_up
                after = await _latencies(http, busy, other)
                await asyncio.sleep(5)
                rss_after = _rss_mib(pid)
                staged = await _metric(http, STAGED) - staged_before
                temp_growth = await pool.fetchval(TEMP_BYTES) - temp_before
    return {
        "clients": args.clients,
        "batch_mb": round(len(body) / 1e6, 1),
        "waits_ended_after_hang_up_s": round(stopped, 3),
        "staged_statements": staged,
        "server_rss_mib": {
            "before": round(rss_before),
            "waiting": round(rss_waiting),
            "5s_after_hang_up": round(rss_after),
        },
        "other_tenant_append_while_waiting": _summary(during),
        "other_tenant_append_after_hang_up": _summary(after),
        "temp_bytes_growth_mb": round(temp_growth / 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=15)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--payload-bytes", type=int, default=60_000)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DUCTOR_STREAMS_DATABASE_URL")
        or os.environ.get("DUCTOR_STREAMS_TEST_DATABASE_URL"),
    )
    args = parser.parse_args(argv)
    if not args.database_url:
        print("bench.gone_callers: give --database-url (a Postgres server)", file=sys.stderr)
        return 2
    name = f"ds_bench_{secrets.token_hex(4)}"
    dsn = create_database(args.database_url, name)
    try:
        result = asyncio.run(_run(args, dsn))
    finally:
        drop_database(args.database_url, name)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
