"""A Postgres outage under load: what a ``serve`` replica answers while its database is
down, and how soon it is ready again.

A private cluster (tests/support/cluster.py, never the machine's server) is crashed with
``pg_ctl stop -m immediate`` for ``--outage`` seconds and started again, while writers
append (each with its own Idempotency-Key, never retried) and readers read over real
HTTP against one server. Prints, per run, the answers by status (5xx separately), the
5xx that are not ``503 database_unavailable`` with ``Retry-After``, how long ``/readyz``
took to answer 200 after Postgres was started, and whether every acknowledged append is
stored exactly once.

    python -m bench.outage [--writers 8] [--readers 2] [--outage 3] [--runs 1]

``tests/production/test_database_outage.py`` runs a broader scenario once (acks, creates,
objects, ops, SSE, the Python client, a second replica) and asserts its bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx

from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support.cluster import PrivateCluster
from tests.support.server import ServerProcess

API = "/api/workflow-streams"
RUN = "outage-bench"
SECRET = "bench-outage-secret-" + "x" * 32


@dataclass
class OutageResult:
    """What one run saw."""

    statuses: Counter[int] = field(default_factory=Counter)
    broken: list[str] = field(default_factory=list)  # 5xx other than 503 + Retry-After
    transport_errors: int = 0
    ready_after_start: float | None = None
    acked: int = 0
    acked_missing: int = 0
    stored_twice: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "requests": sum(self.statuses.values()),
            "by_status": dict(sorted(self.statuses.items())),
            "5xx_by_status": {s: n for s, n in sorted(self.statuses.items()) if s >= 500},
            "5xx_not_503_database_unavailable": len(self.broken),
            "transport_errors": self.transport_errors,
            "readyz_200_after_start_s": self.ready_after_start,
            "appends_acknowledged": self.acked,
            "acknowledged_missing": self.acked_missing,
            "stored_twice": self.stored_twice,
        }


async def one_run(
    server: ServerProcess, cluster: PrivateCluster, args: argparse.Namespace
) -> OutageResult:
    result = OutageResult()
    token = issue_token(SECRET, sub="bench", tenant="bench", scopes=list(SCOPES), runs=["*"])
    headers = {"Authorization": f"Bearer {token}"}
    stream = f"s-{time.monotonic_ns()}"
    path = f"{API}/runs/{RUN}/streams/{stream}"
    stop = asyncio.Event()
    acked: dict[str, int] = {}
    ready: list[tuple[float, int]] = []
    limits = httpx.Limits(max_connections=args.writers + args.readers + 8)
    async with httpx.AsyncClient(
        base_url=server.url, headers=headers, timeout=30, limits=limits
    ) as http:
        created = await http.post(
            f"{API}/runs/{RUN}/streams", json={"stream_id": stream, "direction": "output"}
        )
        created.raise_for_status()

        def note(response: httpx.Response) -> None:
            result.statuses[response.status_code] += 1
            if response.status_code >= 500:
                retry_after = response.headers.get("retry-after", "")
                try:
                    code = response.json().get("code")
                except ValueError:
                    code = None
                if not (
                    response.status_code == 503
                    and code == "database_unavailable"
                    and retry_after.isdigit()
                    and int(retry_after) >= 1
                ):
                    result.broken.append(f"{response.status_code} {response.text[:200]}")

        async def writer(w: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                marker = f"{w}-{n}"
                try:
                    r = await http.post(
                        path + "/records",
                        json={"records": [{"payload": marker}]},
                        headers={"Idempotency-Key": marker},
                    )
                except httpx.TransportError:
                    result.transport_errors += 1
                    continue
                note(r)
                if r.status_code < 300:
                    acked[marker] = r.json()["first_sequence"]
                await asyncio.sleep(args.pace)

        async def reader() -> None:
            while not stop.is_set():
                try:
                    note(await http.get(path + "/records", params={"cursor": 0, "limit": 10}))
                except httpx.TransportError:
                    result.transport_errors += 1
                await asyncio.sleep(args.pace)

        async def probe() -> None:
            while not stop.is_set():
                ready.append((time.monotonic(), (await http.get("/readyz")).status_code))
                await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(writer(w)) for w in range(args.writers)]
        tasks += [asyncio.create_task(reader()) for _ in range(args.readers)]
        tasks.append(asyncio.create_task(probe()))
        try:
            await asyncio.sleep(args.before)  # load before the outage (the scenario)
            down = time.monotonic()
            await asyncio.to_thread(cluster.stop, "immediate")
            await asyncio.sleep(max(0.0, args.outage - (time.monotonic() - down)))
            await asyncio.to_thread(cluster.start)
            up = time.monotonic()
            deadline = up + 30
            while time.monotonic() < deadline:
                if any(t > up and s == 200 for t, s in ready):
                    result.ready_after_start = round(
                        min(t for t, s in ready if t > up and s == 200) - up, 2
                    )
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(args.after)  # load after it
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

        stored: Counter[str] = Counter()
        where: dict[str, int] = {}
        cursor = 0
        while True:
            page = (
                await http.get(path + "/records", params={"cursor": cursor, "limit": 1000})
            ).json()
            for record in page["records"]:
                stored[record["payload"]] += 1
                where[record["payload"]] = record["sequence"]
            if page["next_cursor"] >= page["latest_sequence"]:
                break
            cursor = page["next_cursor"]
    result.acked = len(acked)
    result.acked_missing = sum(1 for m, seq in acked.items() if where.get(m) != seq)
    result.stored_twice = sum(1 for count in stored.values() if count > 1)
    return result


async def _create_database(cluster: PrivateCluster) -> str:
    conn = await asyncpg.connect(cluster.dsn())
    try:
        await conn.execute("CREATE DATABASE bench")
    finally:
        await conn.close()
    dsn = cluster.dsn("bench")
    await migrate(dsn)
    return dsn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--outage", type=float, default=3.0, help="seconds Postgres is down")
    parser.add_argument("--before", type=float, default=2.0, help="seconds of load before")
    parser.add_argument("--after", type=float, default=2.0, help="seconds of load after")
    parser.add_argument("--pace", type=float, default=0.005, help="pause between requests")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)

    cluster = PrivateCluster().init()
    cluster.start()
    folder = Path(tempfile.mkdtemp(prefix="bench-outage-"))
    failed = False
    try:
        dsn = asyncio.run(_create_database(cluster))
        settings = Settings(database_url=dsn, jwt_secret=SECRET, region="local")
        with ServerProcess(settings, log_path=folder / "server.log") as server:
            for run in range(1, args.runs + 1):
                result = asyncio.run(one_run(server, cluster, args))
                print(json.dumps({"run": run, "outage_seconds": args.outage, **result.to_json()}))
                failed = failed or bool(
                    result.broken
                    or 500 in result.statuses
                    or result.acked_missing
                    or result.stored_twice
                )
        print(f"server log: {folder / 'server.log'}")
    finally:
        cluster.destroy()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
