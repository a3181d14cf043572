"""Everything through a transaction pooler: Debian's PgBouncer 1.18 in
``pool_mode = transaction`` (no prepared-statement tracking) in front of the test
Postgres, with ``DUCTOR_STREAMS_DATABASE_POOLER=transaction`` and LISTEN and the
migration lock on ``DUCTOR_STREAMS_DIRECT_DATABASE_URL``.

Real ``serve`` and ``workers`` subprocesses, real Temporal for input delivery. The
pooler has few server connections (``POOL_SIZE``) so that the servers' many client
connections share them, transaction by transaction, as on a hosted pooler; the first
test shows that the fixture does break what it should (named prepared statements).
Live delivery is checked with the periodic re-read off (``LIVE_POLL_SECONDS`` 3600): a
record reaches a subscriber on another replica only through LISTEN.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from ductor_streams.compat.asyncpg_statements import UnnamedStatementConnection
from ductor_streams.config import Settings
from ductor_streams.plugin import StreamsPlugin
from ductor_streams.schema.migrate import available_migrations
from ductor_streams.store.db import create_pool
from examples.workflows.echo import TASK_QUEUE, EchoWorkflow
from tests.conftest import TokenFactory
from tests.support.credit import ack_url, definition_body, records_url, stream_url
from tests.support.live import Collected, collect_sse
from tests.support.pgbouncer import PgBouncer
from tests.support.postgres import TestDatabase
from tests.support.server import ServerProcess, settings_env
from tests.temporal.conftest import (  # noqa: F401 - fixtures
    strict_runner,
    temporal_address,
    temporal_env,
)
from tests.temporal.polling import eventually

API = "/api/workflow-streams"
# Server connections per database at the pooler: fewer than the servers' pools hold.
POOL_SIZE = 4
# The periodic re-read off: live records can only come through LISTEN.
NO_POLL = {"DUCTOR_STREAMS_LIVE_POLL_SECONDS": "3600"}


def _database_name(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


@pytest.fixture(scope="module")
def bouncer(test_database: TestDatabase) -> Iterator[PgBouncer]:
    with PgBouncer(test_database.server_dsn, mode="transaction", pool_size=POOL_SIZE) as b:
        yield b


def pooled(settings: Settings, bouncer: PgBouncer, **changes: Any) -> Settings:
    """``settings`` with DATABASE_URL through the pooler and the direct one beside it."""
    direct = settings.require_database()
    return settings.with_overrides(
        database_url=bouncer.dsn(_database_name(direct)),
        direct_database_url=direct,
        database_pooler="transaction",
        **changes,
    )


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ductor_streams.process.cli", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_the_pooler_shares_server_sessions_and_the_pool_works_through_it(
    bouncer: PgBouncer, database_url: str
) -> None:
    dsn = bouncer.dsn(_database_name(database_url))
    # asyncpg's defaults: a named statement, prepared on the server session the first
    # transaction ran on. While another client holds that session, the next
    # transaction runs on another one, where the statement does not exist.
    # (The statements they leave behind say "control", see below.)
    first = await asyncpg.connect(dsn)
    second = await asyncpg.connect(dsn)
    try:
        before = await first.fetchval("SELECT pg_backend_pid() AS control")
        async with second.transaction():
            assert await second.fetchval("SELECT pg_backend_pid() AS control") == before
            with pytest.raises(asyncpg.exceptions.InvalidSQLStatementNameError):
                await first.fetchval("SELECT pg_backend_pid() AS control")
    finally:
        await first.close()
        await second.close()

    pool = await create_pool(dsn, min_size=2, max_size=12, warm=True, pooler="transaction")
    try:

        async def one(i: int) -> tuple[int, int]:
            async with pool.acquire() as conn:
                value = await conn.fetchval("SELECT $1::int + 1", i)
                pid = await conn.fetchval("SELECT pg_backend_pid()")
                async with conn.transaction():
                    in_transaction = await conn.fetchval("SELECT pg_backend_pid()")
                    assert await conn.fetchval("SELECT pg_backend_pid()") == in_transaction
                return int(value), int(pid)

        results = await asyncio.gather(*(one(i) for i in range(48)))
        # Nothing named was left on any server session; each connection described each
        # query once (compat/asyncpg_statements.py) and ran it unnamed from then on.
        named = await asyncio.gather(
            *(
                pool.fetchval(
                    "SELECT count(*) FROM pg_prepared_statements"
                    " WHERE statement NOT LIKE '%AS control'"
                )
                for _ in range(24)
            )
        )
        async with pool.acquire() as conn:
            raw = conn._con  # the connection under the pool's proxy
            assert isinstance(raw, UnnamedStatementConnection)
            assert await conn.fetchval("SELECT $1::int * 2", 21) == 42
            assert await conn.fetchval("SELECT $1::int * 2", 50) == 100
            described = [key[0] for key in raw._described]
            assert described.count("SELECT $1::int * 2") == 1
    finally:
        await pool.close()
    assert [v for v, _ in results] == list(range(1, 49))
    # Twelve client connections, at most POOL_SIZE server sessions.
    assert len({pid for _, pid in results}) <= POOL_SIZE
    assert named == [0] * 24


@pytest.mark.parametrize("command", ["serve", "workers"])
def test_serve_and_workers_refuse_a_transaction_pooler_without_a_direct_url(
    bouncer: PgBouncer, settings: Settings, command: str
) -> None:
    env = settings_env(settings.with_overrides(database_url=bouncer.dsn("any")))
    env["DUCTOR_STREAMS_DATABASE_POOLER"] = "transaction"
    env["DUCTOR_STREAMS_DIRECT_DATABASE_URL"] = ""
    process = _cli([command], env)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ductor-streams: DUCTOR_STREAMS_DIRECT_DATABASE_URL is not set")
    assert "DUCTOR_STREAMS_DATABASE_POOLER=transaction" in lines[0]


@pytest.mark.parametrize("direct", [True, False], ids=["direct-url", "pooler-only"])
def test_concurrent_migrate_runs_through_the_pooler_apply_each_migration_once(
    bouncer: PgBouncer, test_database: TestDatabase, direct: bool
) -> None:
    dsn, drop = test_database.fresh()
    try:
        env = {
            "DUCTOR_STREAMS_DATABASE_URL": bouncer.dsn(_database_name(dsn)),
            "DUCTOR_STREAMS_DATABASE_POOLER": "transaction",
            "DUCTOR_STREAMS_DIRECT_DATABASE_URL": dsn if direct else "",
        }
        runners = [_cli(["migrate"], env) for _ in range(3)]
        outputs = [runner.communicate(timeout=120) for runner in runners]
        for runner, (out, err) in zip(runners, outputs, strict=True):
            assert runner.returncode == 0, (out, err)
        applied = [
            line.removeprefix("applied ")
            for out, _ in outputs
            for line in out.splitlines()
            if line.startswith("applied ")
        ]
        wanted = [f"{m.version:04d}_{m.name}" for m in available_migrations()]
        assert sorted(applied) == wanted  # each exactly once, by one runner or another

        async def stored() -> list[int]:
            conn = await asyncpg.connect(dsn)
            try:
                rows = await conn.fetch(
                    "SELECT version FROM workflow_streams.schema_migrations ORDER BY 1"
                )
                return [r["version"] for r in rows]
            finally:
                await conn.close()

        assert asyncio.run(stored()) == [m.version for m in available_migrations()]
    finally:
        drop()


def _start_workers(settings: Settings, log_path: Path) -> subprocess.Popen[bytes]:
    """``ductor-streams workers`` with ``settings``, its output in ``log_path``."""
    env = {**os.environ, **settings_env(settings), **NO_POLL}
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ductor_streams.process.cli", "workers"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@pytest.fixture
async def replicas(
    bouncer: PgBouncer, settings: Settings, tmp_path: Path
) -> AsyncIterator[tuple[ServerProcess, ServerProcess]]:
    """Two ``serve`` replicas through the pooler, LISTEN on the direct URL, no polls."""
    through = pooled(settings, bouncer)
    with (
        ServerProcess(through, extra_env=NO_POLL, log_path=tmp_path / "a.log") as a,
        ServerProcess(through, extra_env=NO_POLL, log_path=tmp_path / "b.log") as b,
    ):
        yield a, b


async def test_streams_records_live_delivery_and_credit_through_the_pooler(
    replicas: tuple[ServerProcess, ServerProcess],
    bouncer: PgBouncer,
    database_url: str,
    auth: TokenFactory,
    run_id: str,
) -> None:
    a, b = replicas
    headers = auth()
    carried_before = bouncer.transactions(_database_name(database_url))
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(base_url=a.url, timeout=30, limits=limits) as on_a,
        httpx.AsyncClient(base_url=b.url, timeout=30, limits=limits) as on_b,
    ):
        assert (await on_a.get("/readyz")).status_code == 200
        assert (await on_b.get("/readyz")).status_code == 200

        # Create; append with an idempotency key and replay it.
        created = await on_a.post(
            f"{API}/runs/{run_id}/streams",
            json={"stream_id": "s", "direction": "output"},
            headers=headers,
        )
        assert created.status_code == 201, created.text
        keyed = {**headers, "Idempotency-Key": "k-1"}
        body = {"records": [{"payload": {"i": 1}}, {"payload": {"i": 2}}]}
        first = await on_b.post(records_url(run_id, "s"), json=body, headers=keyed)
        assert first.status_code == 201, first.text
        assert first.json() == {"first_sequence": 1, "last_sequence": 2}
        replay = await on_a.post(records_url(run_id, "s"), json=body, headers=keyed)
        assert replay.status_code == 200, replay.text
        assert replay.json() == {"first_sequence": 1, "last_sequence": 2}
        assert replay.headers["idempotent-replayed"] == "true"
        reused = await on_a.post(
            records_url(run_id, "s"), json={"records": [{"payload": 0}]}, headers=keyed
        )
        assert reused.status_code == 422 and reused.json()["code"] == "idempotency_key_reused"

        # Live: a subscriber on A, records appended on B (only LISTEN can tell A).
        got = Collected()
        follower = asyncio.create_task(
            collect_sse(
                a.url,
                stream_url(run_id, "s") + "/subscribe",
                headers,
                params={"cursor": 2},
                until=27,
                into=got,
            )
        )
        await asyncio.wait_for(got.connected.wait(), 30)
        for i in range(25):
            answer = await on_b.post(
                records_url(run_id, "s"),
                json={"records": [{"payload": {"i": 3 + i}}]},
                headers=headers,
            )
            assert answer.json() == {"first_sequence": 3 + i, "last_sequence": 3 + i}
        await asyncio.wait_for(follower, 30)
        assert got.sequences == list(range(3, 28))
        assert [r["payload"] for r in got.records] == [{"i": n} for n in range(3, 28)]

        # Reads, paged.
        page = await on_a.get(records_url(run_id, "s"), params={"cursor": 20}, headers=headers)
        assert page.status_code == 200
        assert [r["sequence"] for r in page.json()["records"]] == list(range(21, 28))

        # Credit: 32 concurrent appends across both replicas, exactly 10 admitted; an
        # ack on A frees room for a producer blocked on B.
        body = definition_body(max_unread_items=10)
        sid = str(body["stream_id"])
        created = await on_a.post(f"{API}/runs/{run_id}/streams", json=body, headers=headers)
        assert created.status_code == 201, created.text
        answers = await asyncio.gather(
            *(
                (on_a if i % 2 else on_b).post(
                    records_url(run_id, sid), json={"records": [{"payload": i}]}, headers=headers
                )
                for i in range(32)
            )
        )
        assert sorted(r.status_code for r in answers) == [201] * 10 + [429] * 22
        assert sorted(r.json()["first_sequence"] for r in answers if r.status_code == 201) == (
            list(range(1, 11))
        )
        assert {r.json()["code"] for r in answers if r.status_code == 429} == {"credit_exhausted"}

        blocking = definition_body(
            max_unread_items=1, on_unread_full="block", block_timeout_ms=30_000
        )
        bid = str(blocking["stream_id"])
        created = await on_a.post(f"{API}/runs/{run_id}/streams", json=blocking, headers=headers)
        assert created.status_code == 201, created.text
        one = await on_b.post(
            records_url(run_id, bid), json={"records": [{"payload": 1}]}, headers=headers
        )
        assert one.status_code == 201
        waiting = asyncio.create_task(
            on_b.post(records_url(run_id, bid), json={"records": [{"payload": 2}]}, headers=headers)
        )
        done, _ = await asyncio.wait({waiting}, timeout=0.3)
        assert not done, "the append should wait for credit"
        ack = await on_a.post(ack_url(run_id, bid, "c"), json={"sequence": 1}, headers=headers)
        assert (ack.status_code, ack.json()) == (200, {"consumer_id": "c", "acked_sequence": 1})
        unblocked = await asyncio.wait_for(waiting, 25)
        assert (unblocked.status_code, unblocked.json()) == (
            201,
            {"first_sequence": 2, "last_sequence": 2},
        )
        state = (await on_b.get(stream_url(run_id, bid), headers=headers)).json()["state"]
        assert state["consumers"] == [{"consumer_id": "c", "acked_sequence": 1}]

    # It all went through PgBouncer, and neither server logged a prepared-statement error.
    # (At least one transaction for each of the 25 appends made one after the other.)
    assert bouncer.transactions(_database_name(database_url)) >= carried_before + 25
    for server in replicas:
        assert server.log_path is not None
        log = server.log_path.read_text()
        assert "PreparedStatement" not in log and "prepared statement" not in log, log[-2000:]


@pytest.mark.timeout(180)
async def test_input_records_reach_a_workflow_through_the_pooler(
    bouncer: PgBouncer,
    settings: Settings,
    temporal_address: str,  # noqa: F811 - the fixture imported above
    auth: TokenFactory,
    tmp_path: Path,
) -> None:
    """``workers`` (the dispatcher) and the workflow worker's activities through the
    pooler: 20 input records reach the EchoWorkflow and its echoes come back over SSE."""
    through = pooled(
        settings, bouncer, temporal_address=temporal_address, tenant=f"wf-{uuid.uuid4().hex[:8]}"
    )
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    headers = auth(tenant=through.tenant, runs=[run_id])
    base = f"{API}/runs/{run_id}/streams"
    workers = _start_workers(through, tmp_path / "workers.log")
    try:
        client = await Client.connect(
            temporal_address, plugins=[StreamsPlugin(through, tune_gc=False)]
        )
        with ServerProcess(through, extra_env=NO_POLL, log_path=tmp_path / "serve.log") as server:
            async with (
                Worker(
                    client,
                    task_queue=TASK_QUEUE,
                    workflows=[EchoWorkflow],
                    workflow_runner=strict_runner(),
                ),
                httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http,
            ):
                handle = await client.start_workflow(
                    "EchoWorkflow", id=run_id, task_queue=TASK_QUEUE, result_type=int
                )
                for stream_id in ("input", "output"):
                    await eventually(
                        lambda s=stream_id: http.get(f"{base}/{s}"),
                        lambda r: r.status_code == 200,
                        what=f"{stream_id} created",
                    )
                got = Collected()
                follower = asyncio.create_task(
                    collect_sse(
                        server.url,
                        f"{base}/output/subscribe",
                        headers,
                        params={"cursor": 0},
                        until=20,
                        into=got,
                    )
                )
                sent = 0
                for size in (1, 4, 15):
                    body = {"records": [{"payload": {"i": sent + k}} for k in range(size)]}
                    answer = await http.post(f"{base}/input/records", json=body)
                    assert answer.status_code == 201, answer.text
                    sent += size
                done = await http.post(
                    f"{base}/input/records", json={"records": [{"payload": {"done": True}}]}
                )
                assert done.json() == {"first_sequence": 21, "last_sequence": 21}
                assert await asyncio.wait_for(handle.result(), 60) == 20
                await asyncio.wait_for(follower, 30)
                assert [r["payload"] for r in got.records] == [
                    {"echo": {"i": n}} for n in range(20)
                ]
                state = await eventually(
                    lambda: http.get(f"{base}/input"),
                    lambda r: r.json()["state"]["consumers"][0]["acked_sequence"] == 21,
                    what="the workflow's ack of every input",
                )
                assert state.json()["state"]["consumers"] == [
                    {"consumer_id": "workflow", "acked_sequence": 21}
                ]
    finally:
        workers.terminate()
        workers.wait(20)
    assert workers.returncode == 0, (tmp_path / "workers.log").read_text()[-2000:]
    log = (tmp_path / "workers.log").read_text()
    assert "prepared statement" not in log and "PreparedStatement" not in log, log[-2000:]
