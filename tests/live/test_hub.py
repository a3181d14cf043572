"""The notification hub: what a wake payload says, and who hears it.

A record wake carries the stream's latest sequence at its commit (``r<pk>:<seq>``,
migration 0012); per-stream watchers get it, everything else gets None."""

from __future__ import annotations

import asyncio

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
