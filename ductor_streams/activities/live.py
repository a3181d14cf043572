"""Live delivery inside a worker: the LISTEN hub and the followers, started on first use.

A worker whose activities never read a stream live, nor wait for credit, opens no
LISTEN connection. The first ``stream_reader`` (or a ``stream_writer`` refused credit)
starts one hub for the worker's store: its followers are the same machinery as the
SSE route's (``live.Followers``), the store's credit waits are woken by it, and the
store's appends are fed to local followers without a read.
"""

from __future__ import annotations

import asyncio

from ductor_streams.live.config import LiveSettings
from ductor_streams.live.followers import Followers
from ductor_streams.live.hub import NotificationHub
from ductor_streams.store import Store


class WorkerLive:
    """The hub and followers of one worker's store, created on first use."""

    def __init__(self, store: Store, dsn: str, settings: LiveSettings) -> None:
        self._store = store
        self._dsn = dsn
        self._settings = settings
        self._lock = asyncio.Lock()
        self._hub: NotificationHub | None = None
        self._own_hub = False
        self._followers: Followers | None = None

    async def hub(self) -> NotificationHub:
        """The store's hub (started now if it has none)."""
        async with self._lock:
            if self._hub is None:
                if self._store.hub is not None:
                    self._hub = self._store.hub
                else:
                    hub = NotificationHub(self._dsn)
                    await hub.start()
                    self._hub, self._own_hub = hub, True
                    self._store.hub = hub  # credit waits wake on acks from now on
            return self._hub

    async def followers(self) -> Followers:
        """The worker's followers; its appends are fed to them (``CommitFeed``)."""
        hub = await self.hub()
        if self._followers is None:
            self._followers = Followers(self._store.pool, hub, self._settings)
            if self._store.appender.feed is None:
                self._store.appender.feed = self._followers
        return self._followers

    async def close(self) -> None:
        followers, self._followers = self._followers, None
        if followers is not None:
            if self._store.appender.feed is followers:
                self._store.appender.feed = None
            await followers.close()
        hub, self._hub = self._hub, None
        if hub is not None and self._own_hub:
            if self._store.hub is hub:
                self._store.hub = None
            await hub.close()
