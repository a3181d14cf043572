"""Retention by count and by age, the 410 after pruning, and legal hold (both stores)."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from ductor_streams.maintenance import run_pass
from ductor_streams.maintenance.retention import prune_stream
from tests.conftest import TokenFactory
from tests.support.objects import ObjectApi, ObjectEnv, create_stream, stream_pk


async def append(api: ObjectApi, n: int) -> None:
    response = await api.client.post(
        f"{api.base}/records",
        json={"records": [{"payload": {"i": i}} for i in range(n)]},
        headers=api.headers,
    )
    assert response.status_code == 201, response.text


async def test_retention_by_count_moves_earliest_and_answers_410(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = ObjectApi(objects_env.client, auth(), run_id)
    await create_stream(api.client, api.headers, run_id, retention={"max_records": 3})
    await append(api, 10)
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    cumulative_7 = await pool.fetchval(
        "SELECT cumulative_bytes FROM workflow_streams.records "
        "WHERE stream_pk = $1 AND sequence = 7",
        pk,
    )

    assert await prune_stream(pool, pk) == (7, 0)
    state = await api.stream_state()
    assert (state["earliest_sequence"], state["latest_sequence"]) == (8, 10)
    assert (
        await pool.fetchval(
            "SELECT pruned_bytes FROM workflow_streams.streams WHERE stream_pk = $1", pk
        )
        == cumulative_7
    )

    gone = await api.records(cursor=0)
    assert gone.status_code == 410
    assert gone.headers["content-type"].startswith("application/problem+json")
    body = gone.json()
    assert body["code"] == "cursor_expired"
    assert {
        k: body[k]
        for k in ("requested_sequence", "earliest_sequence", "latest_sequence", "resync_reason")
    } == {
        "requested_sequence": 1,
        "earliest_sequence": 8,
        "latest_sequence": 10,
        "resync_reason": "retention",
    }
    kept = (await api.records(cursor=7)).json()
    assert [r["sequence"] for r in kept["records"]] == [8, 9, 10]
    assert [r["payload"] for r in kept["records"]] == [{"i": 7}, {"i": 8}, {"i": 9}]

    # A second pass has nothing to do.
    assert await prune_stream(pool, pk) == (0, 0)
    await append(api, 2)
    assert await prune_stream(pool, pk) == (2, 0)
    assert (await api.stream_state())["earliest_sequence"] == 10


async def test_retention_by_age(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = ObjectApi(objects_env.client, auth(), run_id)
    await create_stream(api.client, api.headers, run_id, retention={"max_age_seconds": 1})
    await append(api, 3)
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    assert await prune_stream(pool, pk) == (0, 0)  # young: nothing goes
    deadline = time.monotonic() + 10
    pruned = 0
    while pruned == 0:
        assert time.monotonic() < deadline, "records never aged out"
        await asyncio.sleep(0.1)
        pruned, _ = await prune_stream(pool, pk)
    assert pruned == 3
    await append(api, 1)
    assert await prune_stream(pool, pk) == (0, 0)
    state = await api.stream_state()
    assert (state["earliest_sequence"], state["latest_sequence"]) == (4, 4)
    assert [r["sequence"] for r in (await api.records(cursor=3)).json()["records"]] == [4]
    assert (await api.records(cursor=2)).status_code == 410


async def test_legal_hold_prunes_and_deletes_nothing_until_lifted(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = ObjectApi(objects_env.client, auth(), run_id)
    await create_stream(api.client, api.headers, run_id, retention={"max_records": 1})
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    first, _ = await api.put_object(b"first object")
    second, _ = await api.put_object(b"second object")
    third, _ = await api.put_object(b"third object")
    assert len(await objects_env.keys(pk)) == 3

    hold = await api.client.put(
        f"{api.base}/legal-hold", json={"enabled": True, "reason": "case 7"}, headers=api.headers
    )
    assert hold.status_code == 200 and hold.json()["legal_hold"] is True
    await run_pass(pool, objects_env.stores, orphan_grace_seconds=0)
    assert await prune_stream(pool, pk) == (0, 0)
    state = await api.stream_state()
    assert (state["earliest_sequence"], state["latest_sequence"]) == (1, 3)
    assert len(await objects_env.keys(pk)) == 3
    assert (await api.download(first)).content == b"first object"

    lifted = await api.client.put(
        f"{api.base}/legal-hold", json={"enabled": False}, headers=api.headers
    )
    assert lifted.status_code == 200 and lifted.json()["legal_hold"] is False
    assert await prune_stream(pool, pk) == (2, 2)
    await run_pass(pool, objects_env.stores, orphan_grace_seconds=3600)
    assert await objects_env.keys(pk) == [f"ductor-streams/{pk}/{third}"]
    for gone in (first, second):
        response = await api.download(gone)
        assert response.status_code == 410 and response.json()["code"] == "object_pruned"
    assert (await api.download(third)).content == b"third object"


async def test_hold_set_after_pruning_keeps_queued_bytes(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    """Bytes of pruned records wait in the outbox while a hold is on."""
    api = ObjectApi(objects_env.client, auth(), run_id)
    await create_stream(api.client, api.headers, run_id, retention={"max_records": 1})
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    await api.put_object(b"old")
    await api.put_object(b"new")
    assert await prune_stream(pool, pk) == (1, 1)
    await api.client.put(f"{api.base}/legal-hold", json={"enabled": True}, headers=api.headers)
    await run_pass(pool, objects_env.stores, orphan_grace_seconds=3600)
    assert len(await objects_env.keys(pk)) == 2
    pending = await pool.fetchval(
        "SELECT count(*) FROM workflow_streams.deletion_outbox "
        "WHERE stream_pk = $1 AND state = 'pending'",
        pk,
    )
    assert pending == 1
    await api.client.put(f"{api.base}/legal-hold", json={"enabled": False}, headers=api.headers)
    await run_pass(pool, objects_env.stores, orphan_grace_seconds=3600)
    assert len(await objects_env.keys(pk)) == 1


async def test_concurrent_passes_prune_each_record_once(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = ObjectApi(objects_env.client, auth(), run_id)
    await create_stream(api.client, api.headers, run_id, retention={"max_records": 5})
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    await append(api, 200)
    results = await asyncio.gather(*(prune_stream(pool, pk, step=7) for _ in range(4)))
    assert sum(records for records, _ in results) == 195
    state = await api.stream_state()
    assert (state["earliest_sequence"], state["latest_sequence"]) == (196, 200)
    count = await pool.fetchval(
        "SELECT count(*) FROM workflow_streams.records WHERE stream_pk = $1", pk
    )
    assert count == 5
