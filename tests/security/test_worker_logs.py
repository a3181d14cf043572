"""Log hygiene of the workers: a ``serve`` with its dispatcher and maintenance workers,
at DEBUG, against the real Temporal dev server, delivers (and fails to deliver) marked
input payloads; nothing of them, the token or the secret reaches its stderr."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import API, JWT_SECRET
from tests.security.world import World
from tests.support.server import ServerProcess


async def test_no_payload_in_worker_logs(
    settings: Any,
    temporal_address: str,
    tmp_path: Path,
) -> None:
    log_path = tmp_path / "workers.log"
    # The dispatcher serves one tenant (DUCTOR_STREAMS_TENANT): the world's.
    async with httpx.AsyncClient(timeout=30) as http:
        world = World(http)
        worker_settings = settings.with_overrides(
            temporal_address=temporal_address, tenant=world.tenant
        )
        with ServerProcess(
            worker_settings,
            workers=True,
            log_path=log_path,
            extra_env={"DUCTOR_STREAMS_LOG_LEVEL": "DEBUG"},
        ) as server:
            http.base_url = httpx.URL(server.url)
            await world.setup()
            delivery = await world.delivery_id()
            # The run has no workflow: the dispatcher signals it (payload and all) and
            # Temporal answers "not found"; wait for that attempt to be recorded.
            deadline = time.monotonic() + 60
            while True:
                r = await http.get(f"{API}/ops/deliveries/{delivery}", headers=world.admin)
                assert r.status_code == 200, r.text
                if r.json()["attempts"] >= 1:
                    break
                assert time.monotonic() < deadline, r.json()
                await asyncio.sleep(0.05)
    logged = log_path.read_text(encoding="utf-8", errors="replace")
    assert "input dispatcher started" in logged
    token = world.admin["Authorization"].split(" ", 1)[1]
    for secret in (world.secret_marker, world.open_marker, token, JWT_SECRET):
        assert secret not in logged, f"{secret[:12]}... leaked into the workers' log"
