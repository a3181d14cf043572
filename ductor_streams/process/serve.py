"""Runs the HTTP app under uvicorn (uvloop + httptools, one worker process).

Shutdown on SIGTERM or SIGINT, within ``DUCTOR_STREAMS_SHUTDOWN_TIMEOUT_SECONDS``:
1. stop accepting connections;
2. end every SSE response with a reconnect event (``StreamsApp.begin_shutdown``);
3. let the requests in flight finish: each append is answered, committed or not;
4. stop the workers and close the pool (the app's lifespan).
Requests still running after most of the budget are cancelled: an append cancelled
before its commit is not stored, and its client retries with its Idempotency-Key.
"""

from __future__ import annotations

import functools

import uvicorn

from ductor_streams.compat.uvicorn_protocol import (
    ConnectionLimits,
    default_max_connections,
    guarded,
)
from ductor_streams.compat.uvicorn_server import DrainingServer
from ductor_streams.config import Settings
from ductor_streams.foundation.logs import configure_logging
from ductor_streams.foundation.tracing import configure_tracing
from ductor_streams.http import create_app
from ductor_streams.http.access import bearer_tenant
from ductor_streams.http.app import StreamsApp
from ductor_streams.process.services import worker_services
from ductor_streams.runtime.gc_tuning import tuned_after_start

# The part of the shutdown budget left for the lifespan (workers, pool) after requests.
LIFESPAN_SHARE = 0.3


def serve(settings: Settings, *, workers: bool) -> int:
    """Serve on ``settings.host``:``settings.port`` until SIGTERM or SIGINT."""
    settings.require_database()
    settings.require_session_database()
    settings.require_jwt_secret()
    configure_logging(settings.log_level_number)
    configure_tracing(settings, service="ductor-streams")
    # The garbage collector is tuned once everything has started (runtime/gc_tuning.py).
    services = [*(worker_services(settings) if workers else []), tuned_after_start]
    app = create_app(settings, services=services)
    DrainingServer(uvicorn_config(settings, app), on_shutdown=app.begin_shutdown).run()
    return 0


def uvicorn_config(settings: Settings, app: StreamsApp, *, loop: str = "uvloop") -> uvicorn.Config:
    """How ``serve`` runs ``app`` under uvicorn: the connection guard, logging and the
    shutdown budget. ``loop="none"`` serves on a loop already running (tests)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop=loop,
        http=guarded(
            ConnectionLimits(
                head_timeout=settings.head_timeout_seconds,
                max_head_bytes=settings.max_header_bytes,
                max_connections=settings.max_connections or default_max_connections(),
                # At the cap, whose request is asking decides whose place it may take.
                tenant_of=functools.partial(bearer_tenant, settings.require_jwt_secret()),
            )
        ),
        # uvicorn's loggers propagate to the root handler (logs.configure_logging): its
        # error and access lines are JSON like every other, with the request ID.
        log_config=None,
        log_level=settings.log_level_number,
        access_log=settings.access_log,
        # Nothing here reads the client's address or scheme (links are paths), so
        # uvicorn's X-Forwarded-* middleware, a layer and a dict of the headers per
        # request, would be work for nobody; the access log shows the peer's address.
        proxy_headers=False,
        lifespan="on",
        timeout_graceful_shutdown=int(settings.shutdown_timeout_seconds * (1 - LIFESPAN_SHARE)),
    )
