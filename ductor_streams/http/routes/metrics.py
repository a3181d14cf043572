"""``GET /metrics``: Prometheus text, at the server root like the health checks.

Unauthenticated, as scrapers expect: the metrics carry counts and timings only, never a
tenant, run, stream or payload.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response, get

from ductor_streams.foundation import metrics
from ductor_streams.http.state import runtime_of
from ductor_streams.ops.gauges import refresh_from_database
from ductor_streams.store.db import DRIVER_ERRORS
from ductor_streams.store.identity import check_identity

log = logging.getLogger(__name__)


@get("/metrics", include_in_schema=False)
async def prometheus_metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every metric of this process, plus delivery states read from Postgres now."""
    try:
        pool = runtime_of(request).pool
        # The database's identity too: a pooler may keep the pool's connections
        # through a failover, so new connections alone would not show it.
        await check_identity(pool)
        await refresh_from_database(pool)
    except (*DRIVER_ERRORS, TimeoutError) as exc:
        # The process's own counters are still worth a scrape; the gauges keep their
        # last values.
        log.warning("delivery gauges not refreshed", extra={"error_type": type(exc).__name__})
    # As a header, not ``media_type``: Litestar appends "; charset=utf-8" to a text/*
    # media type, and prometheus_client's already names its charset.
    return Response(metrics.render(), headers={"Content-Type": metrics.CONTENT_TYPE})


ROUTES = [prometheus_metrics]
