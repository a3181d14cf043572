"""Crash between upload and commit, orphaned bytes, the prune command and the periodic
worker (both stores; the crash and the worker use a real server subprocess)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import httpx

from ductor_streams.maintenance import run_pass
from ductor_streams.maintenance.retention import prune_stream
from ductor_streams.objects import Pins
from ductor_streams.objects.blobstore import storage_key, temp_key
from tests.conftest import TokenFactory
from tests.support.objects import (
    API,
    ObjectApi,
    ObjectEnv,
    create_stream,
    prepare_body,
    sha256_hex,
    stream_pk,
)
from tests.support.server import ServerProcess, settings_env


async def poll(check: Callable[[], Awaitable[bool]], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


async def intent_state(pool: asyncpg.Pool, object_id: str) -> str:
    state: str = await pool.fetchval(
        "SELECT state FROM workflow_streams.object_intents WHERE object_id = $1",
        uuid.UUID(object_id),
    )
    return state


async def test_crash_between_upload_and_commit_is_swept(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    headers = auth()
    base = f"{API}/runs/{run_id}/streams/artifacts"
    server = ServerProcess(
        objects_env.settings, extra_env={"DUCTOR_STREAMS_OBJECT_INTENT_TTL": "3"}
    )
    with server:
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
            created = await http.post(
                f"{API}/runs/{run_id}/streams",
                json={"stream_id": "artifacts", "direction": "output"},
            )
            assert created.status_code == 201
            kept = os.urandom(300_000)
            body = prepare_body(kept)
            kept_id = (await http.post(f"{base}/objects", json=body)).json()["object_id"]
            assert (
                await http.put(f"{base}/objects/{kept_id}/content", content=kept)
            ).status_code == 200
            assert (await http.post(f"{base}/objects/{kept_id}/commit")).status_code == 201

            lost = os.urandom(200_000)
            lost_id = (await http.post(f"{base}/objects", json=prepare_body(lost))).json()[
                "object_id"
            ]
            assert (
                await http.put(f"{base}/objects/{lost_id}/content", content=lost)
            ).status_code == 200
        server.kill()  # the crash: the client never commits

    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    assert await objects_env.keys(pk) == sorted(
        [storage_key(pk, uuid.UUID(kept_id)), storage_key(pk, uuid.UUID(lost_id))]
    )
    assert await intent_state(pool, lost_id) == "uploaded"

    async def swept() -> bool:
        await run_pass(pool, objects_env.stores, orphan_grace_seconds=3600)
        return await intent_state(pool, lost_id) == "expired"

    await poll(swept)
    assert await objects_env.keys(pk) == [storage_key(pk, uuid.UUID(kept_id))]
    assert await intent_state(pool, kept_id) == "committed"
    api = ObjectApi(objects_env.client, headers, run_id)
    downloaded = await api.download(kept_id)
    assert downloaded.status_code == 200 and sha256_hex(downloaded.content) == sha256_hex(kept)
    rows = await pool.fetch(
        "SELECT reason, state FROM workflow_streams.deletion_outbox WHERE stream_pk = $1", pk
    )
    assert [tuple(r) for r in rows] == [("expired", "done")]
    # Passes later never touch the committed object.
    await run_pass(pool, objects_env.stores, orphan_grace_seconds=0)
    assert await objects_env.keys(pk) == [storage_key(pk, uuid.UUID(kept_id))]


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_bytes_no_intent_owns_are_swept_after_grace(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    headers = auth()
    api = ObjectApi(objects_env.client, headers, run_id)
    await create_stream(api.client, headers, run_id)
    await create_stream(api.client, headers, run_id, stream_id="held")
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    held_pk = await stream_pk(pool, tenant, run_id, "held")
    committed_id, _ = await api.put_object(b"committed stays")
    hold = await api.client.put(
        f"{API}/runs/{run_id}/streams/held/legal-hold", json={"enabled": True}, headers=headers
    )
    assert hold.status_code == 200

    data = b"left behind"
    pins = Pins(len(data), sha256_hex(data))
    # A part cut off by a crash mid-upload, bytes no intent ever owned, and the same
    # under a stream on legal hold.
    part = temp_key(storage_key(pk, uuid.uuid4()), "dead")
    stray = storage_key(pk, uuid.uuid4())
    held = storage_key(held_pk, uuid.uuid4())
    for key in (part, stray, held):
        await objects_env.store.write(key, _once(data), pins=pins, content_type="x/y")
    committed_key = storage_key(pk, uuid.UUID(committed_id))
    assert await objects_env.keys(pk) == sorted([committed_key, part, stray])

    # Within the grace period (an upload may still be in flight): nothing is queued.
    report = await run_pass(pool, objects_env.stores, orphan_grace_seconds=3600)
    assert report.swept_orphans
    assert await objects_env.keys(pk) == sorted([committed_key, part, stray])

    await run_pass(pool, objects_env.stores, orphan_grace_seconds=0)
    assert await objects_env.keys(pk) == [committed_key]
    assert await objects_env.keys(held_pk) == [held]
    reasons = await pool.fetch(
        "SELECT storage_key, reason, state FROM workflow_streams.deletion_outbox "
        "WHERE stream_pk = $1 ORDER BY storage_key",
        pk,
    )
    assert [tuple(r) for r in reasons] == sorted(
        [(part, "orphan", "done"), (stray, "orphan", "done")]
    )
    assert (await api.download(committed_id)).content == b"committed stays"

    await api.client.put(
        f"{API}/runs/{run_id}/streams/held/legal-hold", json={"enabled": False}, headers=headers
    )
    await run_pass(pool, objects_env.stores, orphan_grace_seconds=0)
    assert await objects_env.keys(held_pk) == []


async def test_prune_command_prints_what_it_did(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = ObjectApi(objects_env.client, auth(), run_id)
    await create_stream(api.client, api.headers, run_id, retention={"max_records": 2})
    await run_pass(pool, objects_env.stores, orphan_grace_seconds=3600)  # earlier tests' leftovers
    response = await api.client.post(
        f"{api.base}/records",
        json={"records": [{"payload": i} for i in range(5)]},
        headers=api.headers,
    )
    assert response.status_code == 201
    env = {
        **os.environ,
        **settings_env(objects_env.settings),
        "DUCTOR_STREAMS_ORPHAN_GRACE": "3600",
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "ductor_streams.process.cli", "prune"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "pruned 3 records from 1 streams (0 objects queued for deletion)",
        "expired 0 object intents",
        "queued 0 orphaned objects for deletion",
        "deleted 0 stored objects (0 failed, will retry)",
        "pruned 0 append receipts",
    ]
    state = await api.stream_state()
    assert (state["earliest_sequence"], state["latest_sequence"]) == (4, 5)


async def test_serve_runs_upkeep_periodically(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    headers = auth()
    api = ObjectApi(objects_env.client, headers, run_id)
    await create_stream(api.client, headers, run_id, retention={"max_records": 1})
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    server = ServerProcess(
        objects_env.settings, workers=True, extra_env={"DUCTOR_STREAMS_MAINTENANCE_INTERVAL": "0.2"}
    )
    with server:
        for i in range(3):
            response = await api.client.post(
                f"{api.base}/records", json={"records": [{"payload": i}]}, headers=headers
            )
            assert response.status_code == 201

        async def pruned() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT earliest_sequence = 3 FROM workflow_streams.streams "
                    "WHERE stream_pk = $1",
                    pk,
                )
            )

        await poll(pruned)
    assert await prune_stream(pool, pk) == (0, 0)


async def test_two_workers_delete_each_object_once(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    from ductor_streams.maintenance.deletions import run_deletions
    from ductor_streams.maintenance.sweep import sweep_orphans

    await create_stream(objects_env.client, auth(), run_id)
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    await run_pass(pool, objects_env.stores, orphan_grace_seconds=0)  # earlier leftovers
    data = b"stray"
    pins = Pins(len(data), sha256_hex(data))
    keys = sorted(storage_key(pk, uuid.uuid4()) for _ in range(20))
    for key in keys:
        await objects_env.store.write(key, _once(data), pins=pins, content_type="x/y")
    assert await sweep_orphans(pool, objects_env.stores, grace_seconds=0) == 20
    reports = await asyncio.gather(
        run_deletions(pool, objects_env.stores, batch=3),
        run_deletions(pool, objects_env.stores, batch=3),
    )
    assert sum(r.deleted for r in reports) == 20
    assert sum(r.failed for r in reports) == 0
    rows = await pool.fetch(
        "SELECT storage_key, state, attempts FROM workflow_streams.deletion_outbox "
        "WHERE stream_pk = $1 ORDER BY storage_key",
        pk,
    )
    assert [tuple(r) for r in rows] == [(k, "done", 1) for k in keys]
    assert await objects_env.keys(pk) == []
