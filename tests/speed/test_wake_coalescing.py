"""Wakes under load (store/wakes.py): a wake whose commit has others in flight behind it
may wait, at most ``min_interval`` after the previous statement, to share a statement;
a wake with nothing behind it goes at once."""

from __future__ import annotations

import asyncio

from ductor_streams.store.wakes import WakeSender


class FakePool:
    """Stands in for asyncpg.Pool: records each statement's payloads."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def fetchval(self, _query: str, payloads: list[str]) -> int:
        self.calls.append(list(payloads))
        return len(payloads)

    def is_closing(self) -> bool:
        return False

    # The wake sender keeps a connection across statements (store/held.py): this fake
    # is its own connection.
    async def acquire(self) -> FakePool:
        return self

    async def release(self, _conn: object) -> None:
        pass

    def is_closed(self) -> bool:
        return False

    async def fetch(self, query: str, payloads: list[str]) -> list[int]:
        return [await self.fetchval(query, payloads)]


async def test_wakes_with_commits_behind_them_share_one_statement() -> None:
    fake = FakePool()
    sender = WakeSender(fake, min_interval=0.5)  # type: ignore[arg-type]
    sender.announce("r1")
    await sender.drain()
    sender.announce("r2", more_coming=True)
    for _ in range(5):  # without the interval, r2 would have gone alone by now
        await asyncio.sleep(0)
    sender.announce("r3", more_coming=True)
    async with asyncio.timeout(5):
        await sender.drain()
    assert fake.calls == [["r1"], ["r2", "r3"]]
    assert sender.statements == 2


async def test_a_wake_with_nothing_behind_it_is_not_held_back() -> None:
    fake = FakePool()
    sender = WakeSender(fake, min_interval=3600)  # type: ignore[arg-type]
    for payload in ["r1", "r2", "r3"]:
        sender.announce(payload)
        async with asyncio.timeout(5):  # an hour's interval would never end in time
            await sender.drain()
    assert fake.calls == [["r1"], ["r2"], ["r3"]]


async def test_a_held_wake_still_goes_within_the_interval() -> None:
    fake = FakePool()
    sender = WakeSender(fake, min_interval=0.05)  # type: ignore[arg-type]
    sender.announce("r1")
    await sender.drain()
    sender.announce("r2", more_coming=True)  # nothing else ever comes
    async with asyncio.timeout(5):
        await sender.drain()
    assert fake.calls == [["r1"], ["r2"]]
