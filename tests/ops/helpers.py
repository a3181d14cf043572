"""Helpers for the operator tests: input streams with real appends (each input record
commits with its pending delivery row) and states moved by the delivery module's own
functions."""

from __future__ import annotations

from typing import Any

import asyncpg

from ductor_streams.delivery import outbox
from tests.conftest import API

OPS = f"{API}/ops"


async def input_stream(
    client: Any, headers: dict[str, str], run_id: str, stream_id: str = "in", **definition: Any
) -> None:
    body = {"stream_id": stream_id, "direction": "input", **definition}
    r = await client.post(f"{API}/runs/{run_id}/streams", json=body, headers=headers)
    assert r.status_code == 201, r.text


async def append(
    client: Any, headers: dict[str, str], run_id: str, payloads: list[Any], stream_id: str = "in"
) -> tuple[int, int]:
    r = await client.post(
        f"{API}/runs/{run_id}/streams/{stream_id}/records",
        json={"records": [{"payload": p} for p in payloads]},
        headers=headers,
    )
    assert r.status_code == 201, r.text
    return r.json()["first_sequence"], r.json()["last_sequence"]


async def delivery_ids(pool: asyncpg.Pool, tenant: str, run_id: str, stream_id: str) -> list[int]:
    """The stream's delivery ids in sequence order (test-side lookup)."""
    rows = await pool.fetch(
        "SELECT d.delivery_id FROM workflow_streams.input_deliveries d "
        "JOIN workflow_streams.streams s USING (stream_pk) "
        "WHERE s.tenant = $1 AND s.run_id = $2 AND s.stream_id = $3 ORDER BY d.sequence",
        tenant,
        run_id,
        stream_id,
    )
    return [r["delivery_id"] for r in rows]


async def _keys(pool: asyncpg.Pool, ids: list[int]) -> dict[int, tuple[int, int]]:
    """``{delivery_id: (stream_pk, sequence)}``: how the delivery module names a delivery
    (test-side lookup)."""
    rows = await pool.fetch(
        "SELECT delivery_id, stream_pk, sequence FROM workflow_streams.input_deliveries"
        " WHERE delivery_id = ANY($1::bigint[])",
        ids,
    )
    return {r["delivery_id"]: (r["stream_pk"], r["sequence"]) for r in rows}


def _by_stream(keys: dict[int, tuple[int, int]], ids: list[int]) -> dict[int, list[int]]:
    grouped: dict[int, list[int]] = {}
    for delivery_id in ids:
        stream_pk, sequence = keys[delivery_id]
        grouped.setdefault(stream_pk, []).append(sequence)
    return grouped


async def mark_dead(pool: asyncpg.Pool, ids: list[int], error: str) -> None:
    """``ids`` dead; the first of them attempted once more."""
    keys = await _keys(pool, ids)
    attempted = keys[ids[0]]
    for stream_pk, sequences in _by_stream(keys, ids).items():
        await outbox.mark_dead(
            pool,
            stream_pk,
            sequences,
            attempted=attempted[1] if attempted[0] == stream_pk else 0,
            error=error,
        )


async def mark_delivered(pool: asyncpg.Pool, ids: list[int]) -> None:
    keys = await _keys(pool, ids)
    for stream_pk, sequences in _by_stream(keys, ids).items():
        await outbox.mark_delivered(pool, stream_pk, sequences)


async def mark_retrying(pool: asyncpg.Pool, tenant: str, error: str, delay: float) -> list[int]:
    """Claim the tenant's due heads as a dispatcher would and fail their first attempt."""
    claimed = await outbox.claim(
        pool, owner="ops-test", tenant=tenant, lease_seconds=30, max_streams=100, per_stream=1
    )
    ids = []
    for stream_pk, deliveries in claimed.items():
        head = deliveries[0]
        await outbox.mark_retrying(
            pool, stream_pk, head.event.sequence, owner="ops-test", error=error, delay=delay
        )
        ids.append(head.delivery_id)
    return ids


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    return body
