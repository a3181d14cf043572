"""What a serving process shares, opened and closed in one place, in a fixed order.

``open_runtime(settings)`` opens, in this order: the connection pool, the LISTEN hub,
the store over both, the live followers (fed the process's own commits), the object
service and the tenants' read slots. The services (upkeep, the input dispatcher;
``process.services.worker_services``) start after it, each given the ``Runtime``, and
stop before it. On the way out the order is reversed: followers (their tasks stopped), hub,
pool. ``serve`` opens one in the app's lifespan (http/app.py; handlers reach it through
http/state.py), ``workers`` one of its own (process/workers.py), and a Temporal worker
with the ``StreamsPlugin`` one for the activities' life (``StreamsActivities.lifetime``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import asyncpg

from ductor_streams.config import Settings
from ductor_streams.live.followers import Followers
from ductor_streams.live.hub import NotificationHub
from ductor_streams.objects import BlobStores
from ductor_streams.objects.intents import ObjectService
from ductor_streams.runtime.tenant_reads import TenantReads
from ductor_streams.store import Store
from ductor_streams.store.db import create_pool
from ductor_streams.store.pool_metrics import track_pool, untrack_pool


@dataclass(frozen=True)
class Runtime:
    """The shared parts of one process (see the module docstring for their order)."""

    settings: Settings
    pool: asyncpg.Pool
    hub: NotificationHub
    store: Store
    followers: Followers
    objects: ObjectService
    # The tenants' catch-up read slots of this process (runtime/tenant_reads.py).
    reads: TenantReads


# A service of a process (upkeep, the input dispatcher, the GC tuning): an async context
# manager factory given the open ``Runtime``; services start after it opens and stop
# before it closes, in reverse order (process/services.py, http/app.py).
Service = Callable[[Runtime], contextlib.AbstractAsyncContextManager[None]]


@contextlib.asynccontextmanager
async def open_runtime(
    settings: Settings,
    *,
    name: str,
    pool_min_size: int | None = None,
    listen_on_demand: bool = False,
) -> AsyncIterator[Runtime]:
    """Open a ``Runtime`` from the settings; ``name`` labels the pool's metrics.
    ``listen_on_demand``: the hub LISTENs only while something in the process watches
    (live/hub.py), as a Temporal worker's does.

    The pool uses ``DATABASE_URL`` (through a transaction pooler when
    ``DATABASE_POOLER`` says so); the hub's LISTEN connection needs a session of its
    own, so it uses ``DIRECT_DATABASE_URL`` when set (``ConfigError`` when a
    transaction pooler leaves it nothing to use)."""
    dsn = settings.require_database()
    listen_dsn = settings.require_session_database()
    pool = await create_pool(
        dsn,
        min_size=settings.pool_min_size if pool_min_size is None else pool_min_size,
        max_size=settings.pool_max_size,
        warm=True,
        pooler=settings.database_pooler,
    )
    track_pool(name, pool)
    hub = NotificationHub(listen_dsn, listen_on_demand=listen_on_demand)
    followers: Followers | None = None
    try:
        await hub.start()
        store = Store(pool, hub=hub, tenant_max_streams=settings.tenant_max_streams)
        followers = Followers(pool, hub, settings.live)
        # Appends of this process reach its subscribers without a read (store/append.py).
        store.appender.feed = followers
        objects = ObjectService(
            store,
            BlobStores(
                settings.object_stores, credentials_file=settings.google_application_credentials
            ),
            region=settings.region,
            intent_ttl_seconds=settings.object_intent_ttl,
        )
        reads = TenantReads(settings.tenant_max_reads, settings.tenant_read_wait_seconds)
        yield Runtime(settings, pool, hub, store, followers, objects, reads)
    finally:
        if followers is not None:
            await followers.close()
        untrack_pool(name, pool)
        await hub.close()
        await pool.close()
