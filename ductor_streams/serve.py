"""Runs the HTTP app under uvicorn (uvloop + httptools, one worker process)."""

from __future__ import annotations

import uvicorn

from ductor_streams.config import Settings
from ductor_streams.http import create_app
from ductor_streams.http.protocol import HeadHoldingHttpToolsProtocol
from ductor_streams.logs import configure_logging
from ductor_streams.workers import worker_services


def serve(settings: Settings, *, workers: bool) -> int:
    """Serve on ``settings.host``:``settings.port`` until SIGTERM or SIGINT."""
    settings.require_database()
    settings.require_jwt_secret()
    configure_logging(settings.log_level_number)
    services = worker_services(settings) if workers else []
    app = create_app(settings, services=services)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=HeadHoldingHttpToolsProtocol,
        log_level="warning",
        access_log=False,
        # Nothing here reads the client's address or scheme (no access log; links are
        # paths), so uvicorn's X-Forwarded-* middleware, a layer and a dict of the
        # headers per request, would be work for nobody.
        proxy_headers=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run()
    return 0
