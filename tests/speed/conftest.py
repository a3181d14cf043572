"""Fixtures of the credit tests: a Store whose blocked producers are woken by a real hub."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from ductor_streams.live.hub import NotificationHub
from ductor_streams.store import Store


@pytest.fixture(scope="session")
async def hub(database_url: str) -> AsyncIterator[NotificationHub]:
    hub = NotificationHub(database_url)
    await hub.start()
    try:
        yield hub
    finally:
        await hub.close()


@pytest.fixture(scope="session")
async def hub_store(pool: asyncpg.Pool, hub: NotificationHub) -> Store:
    """A Store like the app's: acks wake producers blocked on credit through the hub."""
    return Store(pool, hub=hub)
