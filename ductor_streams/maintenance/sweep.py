"""The sweeps: intents past expiry become ``expired`` (their bytes queued for deletion),
and stored bytes that no live intent owns are queued for deletion as orphans.

An orphan is a key under the service's prefix, older than ``grace_seconds``, that no
``prepared``/``uploaded``/``committed`` intent owns: the temporary part of an upload cut
off by a crash, or bytes that landed after their intent was aborted or expired. A
committed object is owned by its intent and is never an orphan. The grace keeps the
sweep off uploads still in flight. Bytes of a stream under legal hold are left alone.

A failure is stepped over (maintenance/isolation.py): a batch of expiry that fails ends
expiry for this pass, a region whose keys cannot be listed or queued is left to the next
pass, and the pass goes on with the other regions and the deletions.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from ductor_streams.config import DEFAULT_ORPHAN_GRACE_SECONDS
from ductor_streams.maintenance.isolation import isolated
from ductor_streams.objects.blobstore import parse_key
from ductor_streams.objects.stores import BlobStores
from ductor_streams.schema import QUERIES


async def expire_intents(pool: asyncpg.Pool, *, batch: int = 500) -> int:
    """Mark every live intent past its expiry ``expired``; returns how many."""
    total = 0
    # One statement decides a whole batch, so a failure cannot be pinned on one intent:
    # expiry stops for this pass, and the next pass tries again.
    with isolated("expiry"):
        while True:
            count = int(await pool.fetchval(QUERIES["object_intents_expire"], batch))
            total += count
            if count < batch:
                break
    return total


async def sweep_orphans(
    pool: asyncpg.Pool,
    stores: BlobStores,
    *,
    grace_seconds: float = DEFAULT_ORPHAN_GRACE_SECONDS,
    now: datetime | None = None,
) -> int:
    """Queue the deletion of stored bytes no live intent owns; returns how many keys."""
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=grace_seconds)
    queued = 0
    for region in stores.regions:
        with isolated("orphan_sweep", region=region):
            queued += await _sweep_region(pool, stores, region, cutoff)
    return queued


async def _sweep_region(
    pool: asyncpg.Pool, stores: BlobStores, region: str, cutoff: datetime
) -> int:
    """Queue the deletion of the region's keys, older than ``cutoff``, that nothing owns."""
    blobs = await stores.for_region(region).list_blobs()
    old = [b.key for b in blobs if b.updated_at <= cutoff]
    # A temporary part is never owned: past the grace, its upload is over.
    temporary = [k for k in old if (p := parse_key(k)) is None or p.temporary]
    skip = set(temporary)
    final = [k for k in old if k not in skip]
    unowned = temporary + [
        r["key"] for r in await pool.fetch(QUERIES["storage_keys_unowned"], final)
    ]
    if not unowned:
        return 0
    # Parts and keys already queued are left to the queue.
    unowned = [r["key"] for r in await pool.fetch(QUERIES["storage_keys_not_queued"], unowned)]
    by_stream: dict[int | None, list[str]] = {}
    for key in unowned:
        parsed = parse_key(key)
        by_stream.setdefault(parsed.stream_pk if parsed else None, []).append(key)
    held = {
        r["stream_pk"]
        for r in await pool.fetch(
            QUERIES["streams_on_hold"], [pk for pk in by_stream if pk is not None]
        )
    }
    queued = 0
    for stream_pk, keys in by_stream.items():
        if stream_pk in held:
            continue
        rows = await pool.fetch(QUERIES["deletion_insert"], region, keys, "orphan", stream_pk)
        queued += len(rows)
    return queued
