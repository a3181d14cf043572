"""Append receipts (what an ``Idempotency-Key`` replays) go with their records, or after
the idempotency window (``DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS``), whichever comes
later: after a pass, a stream keeps the receipts of its retained records and of the
window's appends, no more. A key whose receipt went is a key never seen: its append is
a new one (docs/api.md)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from typing import Any

import asyncpg
from litestar.testing import AsyncTestClient

from ductor_streams.config import Settings
from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.maintenance.retention import prune_all
from ductor_streams.store import Store, StreamKey, StreamRef, encode_batch
from tests.conftest import API, TokenFactory
from tests.support.server import settings_env

HOUR = 3600.0


async def _stream(store: Store, tenant: str, run_id: str, stream_id: str, **retention: Any) -> Any:
    definition = parse_definition(
        {"stream_id": stream_id, "direction": "output", "retention": retention},
        region="local",
        object_store_regions=frozenset(),
    )
    ref, created = await store.create_stream(StreamKey(tenant, run_id, stream_id), definition)
    assert created
    return ref


async def _receipts(pool: asyncpg.Pool, stream_pk: int) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM workflow_streams.append_receipts WHERE stream_pk = $1",
            stream_pk,
        )
    )


async def _records(pool: asyncpg.Pool, stream_pk: int) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM workflow_streams.records WHERE stream_pk = $1", stream_pk
        )
    )


async def _keyed_appends(store: Store, ref: StreamRef, keys: list[str]) -> None:
    """One one-record append per key, 50 in flight at a time."""
    for start in range(0, len(keys), 50):
        chunk = keys[start : start + 50]
        results = await asyncio.gather(
            *(store.append(ref, encode_batch([{"k": k}], idempotency_key=k)) for k in chunk)
        )
        assert not any(r.replayed for r in results)


async def test_max_records_5_and_2000_keyed_appends_keep_5_receipts_after_prune(
    store: Store, pool: asyncpg.Pool, tenant: str, run_id: str
) -> None:
    ref = await _stream(store, tenant, run_id, "keyed", max_records=5)
    keys = [f"k-{i:04d}" for i in range(2000)]
    await _keyed_appends(store, ref, keys)
    assert await _receipts(pool, ref.stream_pk) == 2000

    # Inside the window, a pass prunes the records but keeps every receipt: a retry of
    # any of them is still answered with its first answer.
    await prune_all(pool, idempotency_window_seconds=HOUR)
    assert await _records(pool, ref.stream_pk) == 5
    assert await _receipts(pool, ref.stream_pk) == 2000
    first = (await store.receipts(ref, "k-0000"))[0]
    again = await store.append(ref, encode_batch([{"k": "k-0000"}], idempotency_key="k-0000"))
    assert again.replayed
    assert (again.first_sequence, again.last_sequence) == (first.first_sequence,) * 2

    # Past the window (0 here), the receipts go with their records: those of the five
    # retained records stay, whatever their age.
    report = await prune_all(pool, idempotency_window_seconds=0)
    assert report.receipts >= 1995
    assert await _receipts(pool, ref.stream_pk) == 5
    retained = await pool.fetch(
        "SELECT sequence FROM workflow_streams.records WHERE stream_pk = $1 ORDER BY 1",
        ref.stream_pk,
    )
    kept = await store.receipts(ref, "k-")  # the activity writer's lookup by prefix
    assert [r.first_sequence for r in kept] == [row["sequence"] for row in retained]
    assert [r.last_sequence for r in kept] == [row["sequence"] for row in retained]
    # A second pass finds nothing more to do.
    await prune_all(pool, idempotency_window_seconds=0)
    assert await _receipts(pool, ref.stream_pk) == 5

    # A retained record's key still replays; an expired key is a new append.
    last = kept[-1]
    replay = await store.append(
        ref, encode_batch([{"k": last.idempotency_key}], idempotency_key=last.idempotency_key)
    )
    assert replay.replayed and replay.first_sequence == last.first_sequence
    expired = await store.append(ref, encode_batch([{"k": "k-0000"}], idempotency_key="k-0000"))
    assert not expired.replayed
    assert expired.first_sequence == 2001


async def test_a_stream_retention_emptied_loses_its_receipts_on_a_later_pass(
    store: Store, pool: asyncpg.Pool, tenant: str, run_id: str
) -> None:
    ref = await _stream(store, tenant, run_id, "aged", max_age_seconds=60)
    await _keyed_appends(store, ref, ["a", "b", "c"])
    # Records older than the retention age (written back in time, as an hour later).
    await pool.execute(
        "UPDATE workflow_streams.records SET appended_at = now() - interval '1 hour'"
        " WHERE stream_pk = $1",
        ref.stream_pk,
    )
    await prune_all(pool, idempotency_window_seconds=HOUR)
    assert await _records(pool, ref.stream_pk) == 0
    assert await _receipts(pool, ref.stream_pk) == 3  # inside the window
    # Nothing is retained any more; the pass still visits the stream for its receipts.
    await prune_all(pool, idempotency_window_seconds=0)
    assert await _receipts(pool, ref.stream_pk) == 0


async def test_legal_hold_keeps_receipts(
    store: Store, pool: asyncpg.Pool, tenant: str, run_id: str
) -> None:
    ref = await _stream(store, tenant, run_id, "held", max_records=1)
    await _keyed_appends(store, ref, ["a", "b", "c"])
    await prune_all(pool, idempotency_window_seconds=HOUR)
    assert (await _records(pool, ref.stream_pk), await _receipts(pool, ref.stream_pk)) == (1, 3)
    await store.set_legal_hold(ref, True, "litigation")
    await prune_all(pool, idempotency_window_seconds=0)
    assert await _receipts(pool, ref.stream_pk) == 3
    await store.set_legal_hold(ref, False, None)
    await prune_all(pool, idempotency_window_seconds=0)
    assert await _receipts(pool, ref.stream_pk) == 1


async def test_an_expired_key_over_http_is_a_new_append(
    client: AsyncTestClient[Any], auth: TokenFactory, pool: asyncpg.Pool, tenant: str, run_id: str
) -> None:
    base = f"{API}/runs/{run_id}/streams"
    r = await client.post(
        base,
        json={"stream_id": "http", "direction": "output", "retention": {"max_records": 1}},
        headers=auth(),
    )
    assert r.status_code == 201, r.text

    async def append(key: str, payload: Any) -> Any:
        return await client.post(
            f"{base}/http/records",
            json={"records": [{"payload": payload}]},
            headers={**auth(), "Idempotency-Key": key},
        )

    assert (await append("a", {"n": 1})).json() == {"first_sequence": 1, "last_sequence": 1}
    assert (await append("b", {"n": 2})).json() == {"first_sequence": 2, "last_sequence": 2}
    await prune_all(pool, idempotency_window_seconds=0)

    # "b" answered for the retained record: replayed as ever, and reused as ever.
    r = await append("b", {"n": 2})
    assert r.status_code == 200 and r.headers["idempotent-replayed"] == "true"
    assert r.json() == {"first_sequence": 2, "last_sequence": 2}
    r = await append("b", {"n": 3})
    assert r.status_code == 422 and r.json()["code"] == "idempotency_key_reused"
    # "a" expired: the same body again is a new append, and so is another body.
    r = await append("a", {"n": 1})
    assert r.status_code == 201 and "idempotent-replayed" not in r.headers
    assert r.json() == {"first_sequence": 3, "last_sequence": 3}
    r = await append("a", {"n": 1})  # now a known key again
    assert r.status_code == 200 and r.json() == {"first_sequence": 3, "last_sequence": 3}


async def test_prune_command_uses_the_configured_window(
    settings: Settings, store: Store, pool: asyncpg.Pool, tenant: str, run_id: str
) -> None:
    ref = await _stream(store, tenant, run_id, "cli", max_records=2)
    await _keyed_appends(store, ref, [f"k{i}" for i in range(10)])

    async def prune(window: str) -> list[str]:
        env = {
            **os.environ,
            **settings_env(settings),
            "DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS": window,
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
        return done.stdout.splitlines()

    await prune("3600")
    assert (await _records(pool, ref.stream_pk), await _receipts(pool, ref.stream_pk)) == (2, 10)
    lines = await prune("0")
    assert re.fullmatch(r"pruned \d+ append receipts", lines[-1]), lines
    assert int(lines[-1].split()[1]) >= 8
    assert await _receipts(pool, ref.stream_pk) == 2
