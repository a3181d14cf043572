"""``serve`` and ``workers`` started while Postgres is down (a managed database in
maintenance, the database container still starting) stay up: liveness answers, every
database request answers 503 ``database_unavailable``, and once Postgres is up the same
processes become ready, append, and deliver live through their LISTEN connection,
without a restart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import httpx
import pytest

from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.conftest import JWT_SECRET
from tests.support.cluster import PrivateCluster
from tests.support.server import ServerProcess, settings_env
from tests.temporal.polling import eventually

API = "/api/workflow-streams"


def _start_workers(settings: Settings, log_path: Path) -> subprocess.Popen[bytes]:
    """``ductor-streams workers`` (no Temporal: upkeep only, every half second)."""
    env = {**os.environ, **settings_env(settings), "DUCTOR_STREAMS_MAINTENANCE_INTERVAL": "0.5"}
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ductor_streams.process.cli", "workers"],
            env=env,
            stdout=log,
            stderr=log,
        )


@pytest.mark.timeout(180)
async def test_processes_started_without_the_database_serve_once_it_is_up(
    tmp_path: Path,
) -> None:
    cluster = PrivateCluster().init()
    cluster.start()
    servers: list[ServerProcess] = []
    workers: subprocess.Popen[bytes] | None = None
    try:
        conn = await asyncpg.connect(cluster.dsn())
        await conn.execute("CREATE DATABASE late")
        await conn.close()
        dsn = cluster.dsn("late")
        await migrate(dsn)
        cluster.stop("immediate")

        settings = Settings(database_url=dsn, jwt_secret=JWT_SECRET, region="local")
        # A's followers never poll: records appended on B reach its subscriber only
        # through A's LISTEN connection, which could not open when A started.
        a = ServerProcess(
            settings,
            log_path=tmp_path / "a.log",
            extra_env={"DUCTOR_STREAMS_LIVE_POLL_SECONDS": "3600"},
        )
        b = ServerProcess(settings, log_path=tmp_path / "b.log")
        servers += [a.start(), b.start()]  # start() waits for /healthz: they came up
        workers = _start_workers(settings, tmp_path / "workers.log")
        token = issue_token(
            JWT_SECRET, sub="late", tenant="t-late", scopes=list(SCOPES), runs=["*"]
        )
        headers = {"Authorization": f"Bearer {token}"}
        streams = f"{API}/runs/late-run/streams"
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.get(a.url + "/healthz")).status_code == 200
            assert (await client.get(a.url + "/readyz")).status_code == 503
            down = await client.post(
                b.url + streams, json={"stream_id": "s", "direction": "output"}, headers=headers
            )
            assert down.status_code == 503 and down.json()["code"] == "database_unavailable"
            assert int(down.headers["retry-after"]) >= 1
            assert workers.poll() is None, "workers exited while the database was down"

            cluster.start()

            async def ready() -> list[int]:
                return [(await client.get(s.url + "/readyz")).status_code for s in servers]

            await eventually(ready, lambda codes: codes == [200, 200], timeout=30, what="ready")
            created = await client.post(
                b.url + streams, json={"stream_id": "s", "direction": "output"}, headers=headers
            )
            assert created.status_code == 201
            seen: list[int] = []
            async with client.stream(
                "GET", f"{a.url}{streams}/s/subscribe", headers=headers
            ) as response:
                assert response.status_code == 200
                for n in range(3):
                    appended = await client.post(
                        f"{b.url}{streams}/s/records",
                        json={"records": [{"payload": n}]},
                        headers=headers,
                    )
                    assert appended.status_code == 201
                async for line in response.aiter_lines():
                    if line.startswith("id: "):
                        seen.append(int(line[4:]))
                    if len(seen) == 3:
                        break
            assert seen == [1, 2, 3]
            assert workers.poll() is None, "workers exited after the database came back"
    finally:
        if workers is not None:
            workers.terminate()
            workers.wait(30)
        for server in servers:
            server.stop()
        cluster.destroy()
    assert "Traceback" not in (tmp_path / "workers.log").read_text()
    for name in ("a.log", "b.log"):
        assert "Traceback" not in (tmp_path / name).read_text(), name
