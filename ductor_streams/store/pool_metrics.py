"""The connection pools of this process as metrics, read when scraped: connections in
use, idle and the ceiling, and the tasks waiting for one (``ductor_streams_db_pool_*``).
The runtime tracks its pool (runtime/__init__.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import asyncpg
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ductor_streams.compat.asyncpg_pool import waiting_acquires
from ductor_streams.foundation.metrics import REGISTRY


class _PoolCollector(Collector):
    """The connection pools of this process, read when scraped: connections in use,
    idle and the ceiling, and the tasks waiting for one."""

    def __init__(self) -> None:
        self.pools: dict[str, Any] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        connections = GaugeMetricFamily(
            "ductor_streams_db_pool_connections",
            "Postgres connections of a pool by state (in_use, idle, max).",
            labels=["pool", "state"],
        )
        waiting = GaugeMetricFamily(
            "ductor_streams_db_pool_waiting",
            "Tasks waiting for a connection of a pool (none free, at its ceiling).",
            labels=["pool"],
        )
        for name, pool in list(self.pools.items()):
            size, idle = pool.get_size(), pool.get_idle_size()
            connections.add_metric([name, "in_use"], size - idle)
            connections.add_metric([name, "idle"], idle)
            connections.add_metric([name, "max"], pool.get_max_size())
            waiting.add_metric([name], waiting_acquires(pool))
        yield connections
        yield waiting


_POOLS = _PoolCollector()
REGISTRY.register(_POOLS)


def track_pool(name: str, pool: asyncpg.Pool) -> None:
    """Report ``pool`` as ``pool="name"`` from now on (replacing one of that name)."""
    _POOLS.pools[name] = pool


def untrack_pool(name: str, pool: asyncpg.Pool) -> None:
    if _POOLS.pools.get(name) is pool:
        del _POOLS.pools[name]
