"""The input delivery rows in Postgres: claim with a lease, record each outcome.

Every statement on claimed rows names their stream as well as their ids (a claim returns
both): each stays on one shard with the tables distributed by stream (docs/scale.md).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from ductor_streams.delivery.wait_service import InputEvent
from ductor_streams.schema import QUERIES


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """One leased delivery row with the record it carries."""

    delivery_id: int
    stream_pk: int
    attempts: int
    created_at: datetime
    event: InputEvent
    # The appending request's W3C traceparent (``trace_context``), when it was traced.
    trace_context: str | None = None


async def claim(
    pool: asyncpg.Pool,
    *,
    owner: str,
    tenant: str,
    lease_seconds: float,
    max_streams: int,
    per_stream: int,
    stream: int | None = None,
) -> dict[int, list[ClaimedDelivery]]:
    """Lease due deliveries: ``{stream_pk: [deliveries in sequence order]}``; of
    ``stream`` only when given (a wake named it), else of every stream of the tenant."""
    args = (owner, lease_seconds, max_streams, per_stream, tenant)
    if stream is None:
        rows = await pool.fetch(QUERIES["delivery_claim"], *args)
    else:
        rows = await pool.fetch(QUERIES["delivery_claim_stream"], *args, stream)
    claimed: dict[int, list[ClaimedDelivery]] = {}
    for row in rows:
        payload = row["payload"]
        event = InputEvent(
            tenant=row["tenant"],
            run_id=row["run_id"],
            stream_id=row["stream_id"],
            sequence=row["sequence"],
            # A record pruned by retention before delivery arrives as null: its sequence
            # still reaches the run, so nothing after it waits forever.
            payload=json.loads(payload) if payload is not None else None,
            object=json.loads(row["object"]) if row["object"] is not None else None,
            appended_at=row["appended_at"].isoformat() if row["appended_at"] else None,
        )
        claimed.setdefault(row["stream_pk"], []).append(
            ClaimedDelivery(
                row["delivery_id"],
                row["stream_pk"],
                row["attempts"],
                row["created_at"],
                event,
                row["trace_context"],
            )
        )
    for deliveries in claimed.values():
        deliveries.sort(key=lambda d: d.event.sequence)
    return claimed


async def mark_delivered(pool: asyncpg.Pool, stream_pk: int, sequences: list[int]) -> None:
    """Record the signals of stream ``stream_pk``'s deliveries ``sequences``."""
    if sequences:
        await pool.execute(QUERIES["delivery_mark_delivered"], sequences, stream_pk)


async def mark_retrying(
    pool: asyncpg.Pool, stream_pk: int, sequence: int, *, owner: str, error: str, delay: float
) -> None:
    await pool.execute(QUERIES["delivery_mark_retrying"], sequence, owner, error, delay, stream_pk)


async def mark_dead(
    pool: asyncpg.Pool, stream_pk: int, sequences: list[int], *, attempted: int, error: str
) -> None:
    """Stream ``stream_pk``'s deliveries ``sequences`` are dead; ``attempted`` (a sequence)
    counts an attempt."""
    await pool.execute(QUERIES["delivery_mark_dead"], sequences, attempted, error, stream_pk)


async def release(
    pool: asyncpg.Pool, stream_pk: int, sequences: list[int], *, owner: str, wake: bool = False
) -> int:
    """Give back ``owner``'s leases of stream ``stream_pk``'s deliveries ``sequences``;
    with ``wake``, every dispatcher hears of it at commit (when anything was given back).
    Returns how many were."""
    if not sequences:
        return 0
    row = await pool.fetchrow(QUERIES["delivery_release"], sequences, owner, wake, stream_pk)
    return int(row["released"])


async def renew(
    conn: asyncpg.Connection,
    held: Mapping[int, Collection[int]],
    *,
    owner: str,
    lease_seconds: float,
    timeout: float | None = None,  # noqa: ASYNC109 - asyncpg's statement timeout
) -> dict[int, set[int]]:
    """Extend ``owner``'s live leases of ``held`` (``{stream_pk: sequences}``) to
    ``lease_seconds`` from now; returns what was renewed, the same way (a lapsed or taken
    lease is not among it). One statement per stream, all of them sent in one round trip
    (asyncpg pipelines ``fetchmany``) and committed together."""
    streams = [(stream_pk, sorted(sequences)) for stream_pk, sequences in held.items() if sequences]
    if not streams:
        return {}
    rows = await conn.fetchmany(
        QUERIES["delivery_renew"],
        [(sequences, owner, lease_seconds, stream_pk) for stream_pk, sequences in streams],
        timeout=timeout,
    )
    renewed: dict[int, set[int]] = {stream_pk: set() for stream_pk, _ in streams}
    for row in rows:
        renewed[row["stream_pk"]].add(row["sequence"])
    return renewed


async def seconds_until_due(pool: asyncpg.Pool, tenant: str) -> float | None:
    """Seconds until some stream's head is claimable; None when nothing is open."""
    value = await pool.fetchval(QUERIES["delivery_next_due"], tenant)
    return None if value is None else float(value)
