"""Everything through a session pooler, as docs/deploy.md ("Session pooler") says to run
it: Debian's PgBouncer 1.18 in ``pool_mode = session`` in front of the test Postgres,
``DUCTOR_STREAMS_DATABASE_URL`` naming it and nothing else set (``DATABASE_POOLER`` at
its default, ``session``; no direct URL).

On a fresh database: ``migrate`` through the pooler applies every migration (its
advisory lock is a session lock, which a session pooler keeps); a real ``serve``
subprocess through it creates a stream, appends with an ``Idempotency-Key`` and replays
it, takes concurrent appends, answers reads, and delivers live records to an SSE
subscriber with the periodic re-read off (``LIVE_POLL_SECONDS`` 3600), so that they
can only have come through LISTEN, whose connection is one of PgBouncer's server
connections; ``doctor`` calls it a direct connection or session pooler, LISTEN ok.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from ductor_streams.config import Settings
from ductor_streams.schema.migrate import available_migrations
from tests.conftest import TokenFactory
from tests.support.credit import records_url, stream_url
from tests.support.live import Collected, collect_sse
from tests.support.pgbouncer import PgBouncer
from tests.support.server import ServerProcess

if TYPE_CHECKING:  # imported for the annotation only: pytest would try to collect it
    from tests.support.postgres import TestDatabase

API = "/api/workflow-streams"
# The periodic re-read off: live records can only come through LISTEN.
NO_POLL = {"DUCTOR_STREAMS_LIVE_POLL_SECONDS": "3600"}


@pytest.fixture(scope="module")
def fresh_database(test_database: TestDatabase) -> Iterator[str]:
    """An empty database for ``migrate`` to migrate through the pooler."""
    dsn, drop = test_database.fresh()
    try:
        yield dsn
    finally:
        drop()  # WITH (FORCE): PgBouncer's server connections do not hold it up


@pytest.fixture(scope="module")
def bouncer(test_database: TestDatabase) -> Iterator[PgBouncer]:
    with PgBouncer(test_database.server_dsn, mode="session", pool_size=20) as b:
        yield b


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``ductor-streams ARGS`` with only ``env``'s settings."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("DUCTOR_STREAMS_", "TEMPORAL_"))
    }
    return subprocess.run(
        [sys.executable, "-m", "ductor_streams.process.cli", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def _listen_backends(dsn: str) -> list[int]:
    """Server pids of the LISTEN connections on ``dsn``'s database (asked directly)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND query ILIKE 'LISTEN %'"
        )
        return [r["pid"] for r in rows]
    finally:
        await conn.close()


async def test_migrate_and_serve_through_a_session_pooler(
    bouncer: PgBouncer,
    fresh_database: str,
    settings: Settings,
    auth: TokenFactory,
    run_id: str,
    tmp_path: Path,
) -> None:
    name = urlsplit(fresh_database).path.lstrip("/")
    pooled = bouncer.dsn(name)
    env = {"DUCTOR_STREAMS_DATABASE_URL": pooled}

    # migrate, through the pooler, on an empty database: every migration, once.
    migrated = _cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    applied = [
        line.removeprefix("applied ")
        for line in migrated.stdout.splitlines()
        if line.startswith("applied ")
    ]
    assert applied == [f"{m.version:04d}_{m.name}" for m in available_migrations()]
    assert bouncer.transactions(name) > 0  # it did go through PgBouncer

    headers = auth()
    through = settings.with_overrides(database_url=pooled)
    with ServerProcess(through, extra_env=NO_POLL, log_path=tmp_path / "serve.log") as server:
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
            assert (await http.get("/readyz")).status_code == 200

            # Create; append with an Idempotency-Key and replay it.
            created = await http.post(
                f"{API}/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
            )
            assert created.status_code == 201, created.text
            keyed = {"Idempotency-Key": "k-1"}
            body = {"records": [{"payload": {"i": 1}}, {"payload": {"i": 2}}]}
            first = await http.post(records_url(run_id, "s"), json=body, headers=keyed)
            assert (first.status_code, first.json()) == (
                201,
                {"first_sequence": 1, "last_sequence": 2},
            )
            replay = await http.post(records_url(run_id, "s"), json=body, headers=keyed)
            assert (replay.status_code, replay.json()) == (
                200,
                {"first_sequence": 1, "last_sequence": 2},
            )
            assert replay.headers["idempotent-replayed"] == "true"

            # Live: a subscriber from cursor 2, then records appended one at a time and
            # then concurrently (8 producers); with the poll off only LISTEN wakes it.
            got = Collected()
            follower = asyncio.create_task(
                collect_sse(
                    server.url,
                    stream_url(run_id, "s") + "/subscribe",
                    headers,
                    params={"cursor": 2},
                    until=44,
                    into=got,
                )
            )
            await asyncio.wait_for(got.connected.wait(), 30)
            for i in range(3, 13):
                answer = await http.post(
                    records_url(run_id, "s"), json={"records": [{"payload": {"i": i}}]}
                )
                assert answer.json() == {"first_sequence": i, "last_sequence": i}

            async def producer(p: int) -> list[int]:
                sequences = []
                for n in range(4):
                    answer = await http.post(
                        records_url(run_id, "s"),
                        json={"records": [{"payload": {"p": p, "n": n}}]},
                    )
                    assert answer.status_code == 201, answer.text
                    sequences.append(answer.json()["first_sequence"])
                return sequences

            produced = await asyncio.gather(*(producer(p) for p in range(8)))
            assert sorted(s for seqs in produced for s in seqs) == list(range(13, 45))
            await asyncio.wait_for(follower, 30)
            assert got.sequences == list(range(3, 45))

            # Reads, paged.
            page = await http.get(records_url(run_id, "s"), params={"cursor": 10, "limit": 5})
            assert page.status_code == 200, page.text
            assert [r["sequence"] for r in page.json()["records"]] == list(range(11, 16))
            assert page.json()["latest_sequence"] == 44

        # The LISTEN that woke the subscriber is a server connection of PgBouncer's:
        # the server has no other way to Postgres.
        listening = await _listen_backends(fresh_database)
        servers = {int(row["remote_pid"]) for row in bouncer.show("SERVERS")}
        assert listening and set(listening) <= servers, (listening, servers)

    log = (tmp_path / "serve.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    entries = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert not [e for e in entries if e["level"] in ("ERROR", "CRITICAL")], log[-3000:]

    # doctor's verdict on this deployment: the guarantees hold.
    done = _cli(env, "doctor", "--json")
    assert done.returncode in (0, 1), done.stderr  # 1: this test server has no standby
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["pooler"]["status"] == "ok", checks["pooler"]
    assert "direct connection or session pooler" in checks["pooler"]["detail"]
    assert checks["listen"]["status"] == "ok", checks["listen"]
    assert checks["migrations"]["status"] == "ok", checks["migrations"]
