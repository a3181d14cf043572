"""The appender's held connection (store/held.py): reused while statements keep coming,
back in the pool soon after, and never reused once broken or after a failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from ductor_streams.store import Store
from ductor_streams.store.held import HeldConnection
from tests.support.credit import append, make_stream
from tests.support.live import eventually

PID = "SELECT pg_backend_pid() AS pid"


@pytest.fixture
async def small_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=3)
    assert pool is not None
    try:
        yield pool
    finally:
        pool.terminate()


def gone(conn: object) -> bool:
    """Whether a held pool connection is closed (or already taken back by the pool)."""
    try:
        return bool(conn.is_closed())  # type: ignore[attr-defined]
    except asyncpg.InterfaceError:
        return True


async def pid(held: HeldConnection) -> int:
    rows = await held.fetch(PID)
    return int(rows[0]["pid"])


async def test_back_to_back_statements_share_one_connection_then_it_goes_back(
    small_pool: asyncpg.Pool,
) -> None:
    held = HeldConnection(small_pool, idle_seconds=0.2)
    pids = {await pid(held) for _ in range(20)}
    assert len(pids) == 1
    assert small_pool.get_idle_size() < small_pool.get_size()  # one is out of the pool
    await eventually(
        lambda: small_pool.get_idle_size() == small_pool.get_size(), what="back in the pool"
    )


async def test_a_failed_statement_gives_its_connection_back_at_once(
    small_pool: asyncpg.Pool,
) -> None:
    held = HeldConnection(small_pool, idle_seconds=3600)
    with pytest.raises(asyncpg.exceptions.DivisionByZeroError):
        await held.fetch("SELECT 1 / 0")
    await eventually(
        lambda: small_pool.get_idle_size() == small_pool.get_size(), what="back in the pool"
    )
    assert await pid(held) > 0  # and the next statement works


async def test_a_broken_held_connection_is_replaced(
    small_pool: asyncpg.Pool, pool: asyncpg.Pool
) -> None:
    held = HeldConnection(small_pool, idle_seconds=3600)
    first = await pid(held)
    await pool.execute("SELECT pg_terminate_backend($1)", first)
    # The held connection learns that its server went away once the socket closes.
    await eventually(lambda: gone(held._idle), timeout=5, what="the held connection closed")
    second = await pid(held)
    assert second != first
    assert await pid(held) == second


async def test_statements_beside_each_other_use_the_pool_and_one_is_kept(
    small_pool: asyncpg.Pool,
) -> None:
    held = HeldConnection(small_pool, idle_seconds=3600)
    sleepers = [held.fetch("SELECT pg_backend_pid() AS pid, pg_sleep(0.2)") for _ in range(3)]
    rows = await asyncio.gather(*sleepers)
    assert len({r[0]["pid"] for r in rows}) == 3  # three connections at once
    await eventually(
        lambda: small_pool.get_idle_size() == small_pool.get_size() - 1, what="two back"
    )
    held.release()
    await eventually(lambda: small_pool.get_idle_size() == small_pool.get_size(), what="all back")


async def test_closing_the_pool_right_after_appends_does_not_wait_long(
    database_url: str,
) -> None:
    # asyncpg's Pool.close waits for every acquired connection: the held one is given
    # back by its idle timer (50 ms by default), so a Store's owner closes as before.
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=3)
    assert pool is not None
    store = Store(pool)
    ref = await make_stream(store)
    for n in range(5):
        await append(store, ref, [n])
    # Closed at all (a connection never given back would keep close() waiting for it):
    # the deadline is the failure, long enough for any load.
    await asyncio.wait_for(pool.close(), timeout=30)
    assert pool.is_closing()
