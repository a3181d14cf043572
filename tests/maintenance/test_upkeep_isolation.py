"""One failing item does not stop an upkeep pass: a stream that cannot be pruned, a
batch of expiry that fails, a region that cannot be listed, a deletion whose bookkeeping
fails. Each is one JSON warning line (no payload) and one count of
``ductor_streams_upkeep_errors_total{step=...}``; the pass goes on with the rest, in
``run_pass`` and in ``ductor-streams prune``. Streams whose stored retention is past the
definition bounds (written with SQL, as before the bounds) are pruned within them."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from litestar.testing import AsyncTestClient

from ductor_streams.config import Settings
from ductor_streams.foundation import metrics
from ductor_streams.foundation.logs import JsonFormatter
from ductor_streams.maintenance import deletions, run_pass
from ductor_streams.maintenance.deletions import run_deletions
from ductor_streams.maintenance.sweep import expire_intents, sweep_orphans
from ductor_streams.objects.blobstore import StoredBlob, storage_key, temp_key
from ductor_streams.objects.stores import BlobStores
from ductor_streams.schema import QUERIES
from tests.conftest import API, TokenFactory
from tests.support.server import settings_env

MARKER = f"PAYLOAD-{uuid.uuid4().hex}"


def upkeep_errors(step: str) -> float:
    value = metrics.REGISTRY.get_sample_value("ductor_streams_upkeep_errors_total", {"step": step})
    return value or 0.0


async def _stream(
    client: AsyncTestClient[Any], headers: dict[str, str], run_id: str, stream_id: str
) -> None:
    """A stream keeping 2 records, holding 5 (sequences 1..5)."""
    base = f"{API}/runs/{run_id}/streams"
    response = await client.post(
        base,
        json={"stream_id": stream_id, "direction": "output", "retention": {"max_records": 2}},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    await _append(client, headers, run_id, stream_id, 5)


async def _append(
    client: AsyncTestClient[Any], headers: dict[str, str], run_id: str, stream_id: str, n: int
) -> None:
    response = await client.post(
        f"{API}/runs/{run_id}/streams/{stream_id}/records",
        json={"records": [{"payload": {"m": MARKER, "i": i}} for i in range(n)]},
        headers=headers,
    )
    assert response.status_code == 201, response.text


@dataclass
class Streams:
    """Three streams of one run, in stream_pk order: one whose retention cannot be read,
    one whose retention is past the bounds, one that retention should prune."""

    broken: int
    huge: int
    kept: int


async def _pk(pool: asyncpg.Pool, tenant: str, run_id: str, stream_id: str) -> int:
    return int(
        await pool.fetchval(
            "SELECT stream_pk FROM workflow_streams.streams "
            "WHERE tenant = $1 AND run_id = $2 AND stream_id = $3",
            tenant,
            run_id,
            stream_id,
        )
    )


async def _earliest(pool: asyncpg.Pool, pk: int) -> int:
    return int(
        await pool.fetchval(
            "SELECT earliest_sequence FROM workflow_streams.streams WHERE stream_pk = $1", pk
        )
    )


@pytest.fixture
async def streams(
    client: AsyncTestClient[Any], auth: TokenFactory, pool: asyncpg.Pool, tenant: str, run_id: str
) -> AsyncIterator[Streams]:
    headers = auth()
    for stream_id in ("broken", "huge", "kept"):
        await _stream(client, headers, run_id, stream_id)
    made = Streams(
        broken=await _pk(pool, tenant, run_id, "broken"),
        huge=await _pk(pool, tenant, run_id, "huge"),
        kept=await _pk(pool, tenant, run_id, "kept"),
    )
    assert made.broken < made.huge < made.kept  # the pass meets the failure first
    set_retention = (
        "UPDATE workflow_streams.streams "
        "SET definition = jsonb_set(definition, '{retention}', $2::jsonb) WHERE stream_pk = $1"
    )
    # Not a number at all: the store cannot read it, so this stream fails to prune.
    await pool.execute(set_retention, made.broken, json.dumps({"max_records": "many"}))
    await pool.execute(
        set_retention, made.huge, json.dumps({"max_records": 2**70, "max_age_seconds": 10**18})
    )
    try:
        yield made
    finally:
        # Later tests' passes should not meet this session's broken stream.
        await pool.execute("DELETE FROM workflow_streams.streams WHERE stream_pk = $1", made.broken)


def _upkeep_warnings(records: list[logging.LogRecord]) -> list[dict[str, Any]]:
    lines = [json.loads(JsonFormatter().format(r)) for r in records]
    return [line for line in lines if line["message"] == "upkeep step failed"]


async def test_a_stream_that_fails_to_prune_does_not_stop_the_pass(
    streams: Streams,
    pool: asyncpg.Pool,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = upkeep_errors("retention")
    with caplog.at_level(logging.WARNING):
        report = await run_pass(pool, BlobStores(settings.object_stores), sweep_orphans_now=False)

    assert await _earliest(pool, streams.kept) == 4  # pruned to its last 2 records
    assert await _earliest(pool, streams.huge) == 1  # within the bounds: keeps all 5
    assert await _earliest(pool, streams.broken) == 1
    assert report.retention.records >= 3
    assert upkeep_errors("retention") == before + 1
    warnings = _upkeep_warnings(caplog.records)
    assert len(warnings) == 1, warnings
    warning = warnings[0]
    assert warning["level"] == "WARNING"
    assert warning["step"] == "retention"
    assert warning["stream_pk"] == streams.broken
    assert warning["error_type"] == "InvalidTextRepresentationError"
    assert MARKER not in caplog.text and "many" not in caplog.text


async def test_prune_command_steps_over_a_stream_that_fails(
    streams: Streams,
    client: AsyncTestClient[Any],
    auth: TokenFactory,
    pool: asyncpg.Pool,
    settings: Settings,
    run_id: str,
) -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "ductor_streams.process.cli", "prune"],
        env={**os.environ, **settings_env(settings), "DUCTOR_STREAMS_ORPHAN_GRACE": "3600"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert await _earliest(pool, streams.kept) == 4
    assert await _earliest(pool, streams.huge) == 1
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    warnings = [line for line in lines if line["message"] == "upkeep step failed"]
    assert [(w["step"], w["stream_pk"]) for w in warnings] == [("retention", streams.broken)]
    assert MARKER not in done.stderr and MARKER not in done.stdout

    # The next pass prunes what arrived since: the stream still fails, the rest goes on.
    await _append(client, auth(), run_id, "kept", 3)  # sequences 6..8
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "ductor_streams.process.cli", "prune"],
        env={**os.environ, **settings_env(settings), "DUCTOR_STREAMS_ORPHAN_GRACE": "3600"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert await _earliest(pool, streams.kept) == 7


# --- the object steps ---------------------------------------------------------------


class _ListFails:
    """A store whose listing fails (a bucket without permission, say)."""

    url = "memory://fails"

    async def list_blobs(self, prefix: str = "") -> list[StoredBlob]:
        raise RuntimeError("listing refused")


class _Listed:
    """A store that lists the given keys (old) and records what it is asked to delete."""

    url = "memory://listed"

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.deleted: list[str] = []

    async def list_blobs(self, prefix: str = "") -> list[StoredBlob]:
        old = datetime.now(UTC) - timedelta(days=1)
        return [StoredBlob(key, old) for key in self.keys]

    async def delete(self, key: str) -> None:
        self.deleted.append(key)


def _stores(**by_region: Any) -> BlobStores:
    stores = BlobStores({})
    for region, store in by_region.items():
        stores.put(region, store)
    return stores


async def test_a_region_that_cannot_be_listed_does_not_stop_the_sweep_or_deletions(
    pool: asyncpg.Pool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    suffix = uuid.uuid4().hex[:8]
    # A part left behind by an upload cut off (stream 0: no stream, nothing holds it).
    orphan = temp_key(storage_key(0, uuid.uuid4()), suffix)
    listed = _Listed([orphan])
    # "a-..." sorts first: the failing region is met before the other.
    stores = _stores(**{f"a-{suffix}": _ListFails(), f"b-{suffix}": listed})
    before = upkeep_errors("orphan_sweep")
    with caplog.at_level(logging.WARNING):
        queued = await sweep_orphans(pool, stores, grace_seconds=60)
        report = await run_deletions(pool, stores)
    assert queued == 1
    assert report.deleted == 1 and listed.deleted == [orphan]
    assert upkeep_errors("orphan_sweep") == before + 1
    warnings = _upkeep_warnings(caplog.records)
    assert [(w["step"], w["region"], w["error_type"]) for w in warnings] == [
        ("orphan_sweep", f"a-{suffix}", "RuntimeError")
    ]
    assert "listing refused" not in caplog.text  # the type only, never the text


async def test_a_deletion_that_fails_does_not_stop_the_others(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    region = f"d-{uuid.uuid4().hex[:8]}"
    keys = [storage_key(0, uuid.uuid4()) for _ in range(3)]
    rows = await pool.fetch(QUERIES["deletion_insert"], region, keys, "orphan", None)
    first = min(r["deletion_id"] for r in rows)
    listed = _Listed([])
    attempt = deletions._attempt

    async def failing_first(
        pool_: asyncpg.Pool, stores_: BlobStores, deletion_id: int, *rest: Any
    ) -> bool:
        if deletion_id == first:
            raise RuntimeError("bookkeeping failed")
        return await attempt(pool_, stores_, deletion_id, *rest)

    monkeypatch.setattr(deletions, "_attempt", failing_first)
    before = upkeep_errors("deletion")
    with caplog.at_level(logging.WARNING):
        report = await run_deletions(pool, _stores(**{region: listed}))
    assert (report.deleted, report.failed) == (2, 1)
    assert len(listed.deleted) == 2 and set(listed.deleted) < set(keys)
    assert upkeep_errors("deletion") == before + 1
    states = dict(
        await pool.fetch(
            "SELECT deletion_id, state FROM workflow_streams.deletion_outbox WHERE region = $1",
            region,
        )
    )
    assert states.pop(first) == "pending"  # claimed again once its lease ends
    assert set(states.values()) == {"done"}
    warnings = _upkeep_warnings(caplog.records)
    assert [(w["step"], w["deletion_id"]) for w in warnings] == [("deletion", first)]


class _FailingPool:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def fetchval(self, *args: Any) -> Any:
        raise self.error


async def test_expiry_that_fails_is_counted_and_the_pass_goes_on() -> None:
    before = upkeep_errors("expiry")
    assert await expire_intents(_FailingPool(RuntimeError("boom"))) == 0  # type: ignore[arg-type]
    assert upkeep_errors("expiry") == before + 1


async def test_an_unavailable_database_is_the_whole_pass_not_one_step() -> None:
    """It propagates, so that the upkeep loop backs off instead of stepping over every
    item (and nothing is counted as a step's failure)."""
    before = upkeep_errors("expiry")
    error = asyncpg.exceptions.AdminShutdownError("terminating connection")
    with pytest.raises(asyncpg.exceptions.AdminShutdownError):
        await expire_intents(_FailingPool(error))  # type: ignore[arg-type]
    assert upkeep_errors("expiry") == before
