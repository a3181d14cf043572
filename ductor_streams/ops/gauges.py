"""The delivery gauges that Postgres knows, set just before a scrape (``GET /metrics``):
deliveries by state and the age of the oldest delivery still owed, over every tenant,
because each replica would otherwise see only its own share."""

from __future__ import annotations

import asyncpg

from ductor_streams.foundation import metrics
from ductor_streams.ops.models import Visibility
from ductor_streams.ops.overview import count_by_state


async def refresh_from_database(pool: asyncpg.Pool) -> None:
    """Set the gauges that Postgres knows (all tenants) just before a scrape."""
    counts, oldest = await count_by_state(pool, Visibility.everything())
    for state, value in counts.items():
        metrics.DELIVERIES.labels(state=state).set(value)
    metrics.DELIVERY_OLDEST_OWED.set(oldest or 0.0)
