"""The notification hub: what a wake payload says, and who hears it.

A record wake carries the stream's latest sequence at its commit (``r<pk>:<seq>``,
``r<pk>:<seq>``); per-stream watchers get it, everything else gets None."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from ductor_streams.live.hub import NotificationHub, parse_wake
from tests.support.live import eventually


@pytest.mark.parametrize(
    ("payload", "wake"),
    [
        ("r5:17", (5, 17)),
        ("r5", (5, None)),  # older processes, an operator's retry
        ("c5", (5, None)),
        ("a12", (12, None)),
        ("a12:3", (12, None)),  # only a record wake's sequence means anything
        ("r5:", (5, None)),
        ("r:3", None),
        ("r5:x", None),
        ("settled", None),
        ("", None),
    ],
)
def test_parse_wake(payload: str, wake: tuple[int, int | None] | None) -> None:
    assert parse_wake(payload) == wake


async def test_watchers_get_the_announced_sequence(database_url: str, pool: asyncpg.Pool) -> None:
    hub = NotificationHub(database_url)
    await hub.start()
    heard: list[tuple[int, int | None]] = []
    heard_any: list[int] = []
    undo = hub.subscribe(9_000_001, lambda pk, latest: heard.append((pk, latest)))
    undo_any = hub.subscribe_any(lambda pk, _latest: heard_any.append(pk))
    try:
        for payload in ["r9000001:4", "c9000001", "r9000001", "junk", "r9000002:1", "end"]:
            await pool.execute("SELECT pg_notify('workflow_streams', $1)", payload)
        await eventually(lambda: 9_000_002 in heard_any, what="the last wake")
        assert heard == [(9_000_001, 4), (9_000_001, None), (9_000_001, None)]
        assert heard_any == [9_000_001, 9_000_001, 9_000_001, 9_000_002]
        with hub.watch(9_000_001) as event:
            await pool.execute("SELECT pg_notify('workflow_streams', 'r9000001:5')")
            await asyncio.wait_for(event.wait(), 5)
    finally:
        undo()
        undo_any()
        await hub.close()


async def test_a_watcher_of_some_kinds_hears_only_those_and_every_reconnect(
    database_url: str, pool: asyncpg.Pool
) -> None:
    hub = NotificationHub(database_url)
    await hub.start()
    due: list[tuple[int, int | None]] = []
    every: list[int] = []
    undo_due = hub.subscribe_any(lambda pk, latest: due.append((pk, latest)), kinds="rRd")
    undo_every = hub.subscribe_any(lambda pk, _latest: every.append(pk))
    try:
        payloads = ["a9000003", "r9000003:2", "c9000003", "R9000003:3:[]", "a9000003:3", "d0"]
        for payload in [*payloads, "r9000004"]:
            await pool.execute("SELECT pg_notify('workflow_streams', $1)", payload)
        await eventually(lambda: 9_000_004 in every, what="the last wake")
        assert due == [(9_000_003, 2), (9_000_003, 3), (0, None), (9_000_004, None)]
        assert every == [9_000_003] * 5 + [0, 9_000_004]
        due.clear()
        pid = hub.backend_pid
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", pid)
        # Anything may have happened while nobody listened: every watcher hears (0, None).
        await eventually(lambda: hub.reconnects == 1 and hub.connected, what="the reconnect")
        await eventually(lambda: due == [(0, None)], what="the reconnect's wake")
        assert every[-1] == 0
    finally:
        undo_due()
        undo_every()
        await hub.close()


# -- LISTEN on demand (a Temporal worker's hub) ---------------------------------------------


async def channels_of(hub: NotificationHub) -> int:
    """How many channels the hub's own backend LISTENs to (asked on its connection)."""
    conn = hub._conn
    assert conn is not None
    count: int = await conn.fetchval("SELECT count(*) FROM pg_listening_channels()")
    return count


async def settled(hub: NotificationHub) -> None:
    """Wait until the hub's LISTEN change under way (if any) is done."""
    task = hub._settle_task
    if task is not None:
        await asyncio.wait_for(asyncio.shield(task), 5)


@contextlib.asynccontextmanager
async def started_hub(database_url: str, **options: Any) -> AsyncIterator[NotificationHub]:
    """A hub of its own, started, closed afterwards."""
    hub = NotificationHub(database_url, **options)
    await hub.start()
    try:
        yield hub
    finally:
        await hub.close()


async def test_an_on_demand_hub_listens_only_while_watched(
    database_url: str, pool: asyncpg.Pool
) -> None:
    heard: list[tuple[int, int | None]] = []
    async with started_hub(database_url, listen_on_demand=True, listen_linger=0.2) as hub:
        assert hub.connected and not hub.listening
        assert await channels_of(hub) == 0
        # Committed while the hub does not listen (as a commit between a watcher's
        # subscribe and the LISTEN taking effect would be): never announced to it, so
        # once it listens every watcher is woken as after a reconnect, and re-reads.
        await pool.execute("SELECT pg_notify('workflow_streams', 'r9000011:1')")
        undo = hub.subscribe(9_000_011, lambda pk, latest: heard.append((pk, latest)))
        await eventually(lambda: hub.listening, what="the LISTEN")
        await settled(hub)
        assert heard == [(9_000_011, None)]
        assert await channels_of(hub) == 1
        await pool.execute("SELECT pg_notify('workflow_streams', 'r9000011:2')")
        await eventually(lambda: (9_000_011, 2) in heard, what="a wake while listening")
        undo()
        # Still listening for the linger, then not.
        assert hub.listening
        await eventually(lambda: not hub.listening, what="the UNLISTEN")
        await settled(hub)
        assert await channels_of(hub) == 0
        assert hub.listens == 1


async def test_watches_that_come_and_go_within_the_linger_keep_one_listen(
    database_url: str, pool: asyncpg.Pool
) -> None:
    # As a writer's credit watch does around each append: one LISTEN, not one each.
    async with started_hub(database_url, listen_on_demand=True, listen_linger=5.0) as hub:
        for n in range(5):
            with hub.watch(9_000_012) as event:
                await pool.execute("SELECT pg_notify('workflow_streams', $1)", f"r9000012:{n}")
                await asyncio.wait_for(event.wait(), 5)
        await settled(hub)
        assert hub.listening and hub.listens == 1
        assert await channels_of(hub) == 1


async def test_an_on_demand_hub_reconnects_listening_only_if_watched(
    database_url: str, pool: asyncpg.Pool
) -> None:
    heard: list[int] = []
    async with started_hub(database_url, listen_on_demand=True, listen_linger=0.1) as hub:
        pid = hub.backend_pid
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", pid)
        await eventually(lambda: hub.reconnects == 1 and hub.connected, what="the reconnect")
        assert not hub.listening and await channels_of(hub) == 0
        undo = hub.subscribe(9_000_013, lambda pk, _latest: heard.append(pk))
        await eventually(lambda: hub.listening, what="the LISTEN")
        await settled(hub)
        heard.clear()
        pid = hub.backend_pid
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", pid)
        # Reconnected while watched: it listens again, and the watcher re-reads.
        await eventually(lambda: hub.reconnects == 2 and hub.listening, what="the relisten")
        await eventually(lambda: heard == [9_000_013], what="the reconnect's wake")
        await pool.execute("SELECT pg_notify('workflow_streams', 'r9000013:7')")
        await eventually(lambda: heard == [9_000_013, 9_000_013], what="a wake after it")
        undo()


async def test_a_hub_not_on_demand_listens_from_the_start(database_url: str) -> None:
    async with started_hub(database_url) as hub:
        assert hub.listening and not hub.on_demand
        assert await channels_of(hub) == 1
