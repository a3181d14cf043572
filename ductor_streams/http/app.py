"""The Litestar application: routes under /api/workflow-streams, health at the root."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from litestar import Litestar, Router
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from ductor_streams.config import Settings
from ductor_streams.http.access import authorize
from ductor_streams.http.codecs.append_worker import close_workers
from ductor_streams.http.codecs.headers import is_api_path
from ductor_streams.http.codecs.problems import handle_exception, refuse
from ductor_streams.http.fronts.ds.front import DS_TEMPLATE, answer_ds, ds_route
from ductor_streams.http.fronts.records import RECORDS_TEMPLATE, answer_records, records_route
from ductor_streams.http.middleware.cors import CorsPolicy
from ductor_streams.http.middleware.host import host_error
from ductor_streams.http.middleware.live_reads import LiveReads, tenant_live_limit
from ductor_streams.http.middleware.observe import Request, route_template
from ductor_streams.http.routes import browse as routes_browse
from ductor_streams.http.routes import consumers as routes_consumers
from ductor_streams.http.routes import health
from ductor_streams.http.routes import metrics as routes_metrics
from ductor_streams.http.routes import objects as routes_objects
from ductor_streams.http.routes import ops as routes_ops
from ductor_streams.http.routes import records as routes_records
from ductor_streams.http.routes import streams as routes_streams
from ductor_streams.http.routes import subscribe as routes_subscribe
from ductor_streams.http.routes.openapi import ContractJsonRenderPlugin, SchemaRouter
from ductor_streams.http.state import runtime_in
from ductor_streams.names import API_MOUNT
from ductor_streams.runtime import Runtime, Service, open_runtime

# Each edge module contributes its route handlers here; all of them are guarded.
API_ROUTES: list[Any] = [
    *routes_streams.ROUTES,
    *routes_browse.ROUTES,
    *routes_records.ROUTES,
    *routes_consumers.ROUTES,
    *routes_subscribe.ROUTES,
    *routes_ops.ROUTES,
    *routes_objects.ROUTES,
]


def create_app(
    settings: Settings,
    *,
    services: Sequence[Service] = (),
) -> StreamsApp:
    """Build the app. ``services`` are extra lifespans (workers), started after the
    runtime (ductor_streams/runtime/__init__.py) with it, and stopped before it."""
    settings.require_jwt_secret()
    settings.require_database()
    settings.require_session_database()

    @contextlib.asynccontextmanager
    async def store_lifespan(app: Litestar) -> AsyncIterator[None]:
        try:
            async with open_runtime(settings, name="serve") as runtime:
                # Handlers reach its parts through http/state.py's runtime_of.
                app.state.runtime = runtime
                # The fronts read it as an attribute: the state's attribute lookup
                # (Litestar's State.__getattr__) showed in the append path's profile.
                assert isinstance(app, StreamsApp)
                app.runtime = runtime
                async with contextlib.AsyncExitStack() as stack:
                    for service in services:
                        await stack.enter_async_context(service(runtime))
                    yield
        finally:
            await close_workers()

    api = Router(path=API_MOUNT, route_handlers=API_ROUTES, guards=[authorize])
    app = StreamsApp(
        route_handlers=[
            api,
            *health.ROUTES,
            *routes_metrics.ROUTES,
            *routes_ops.page_routes(API_MOUNT),
        ],
        lifespan=[store_lifespan],
        exception_handlers={Exception: handle_exception},
        openapi_config=OpenAPIConfig(
            title="ductor-streams",
            version="0.1.0",
            path="/schema",
            render_plugins=[ContractJsonRenderPlugin()],
            openapi_router=SchemaRouter("/schema"),
            components=Components(
                security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}
            ),
            security=[{"bearer": []}],
        ),
        debug=False,
        # Logging is ours (logs.configure_logging: JSON lines); Litestar's default config
        # would replace the root handler with its plain-text one.
        logging_config=None,
    )
    app.cors = CorsPolicy(settings.cors_origins) if settings.cors_origins else None
    app.live_reads = LiveReads(tenant_live_limit(settings))
    return app


class StreamsApp(Litestar):
    """The Litestar app with the records front (http/fronts/records.py) and the Durable
    Streams endpoint (http/fronts/ds/) before it: appends and reads of records and DS requests
    are answered there, everything else by Litestar. The CORS layer (http/middleware/cors.py), when
    configured, comes before all of them, and the ``Host`` check (http/middleware/host.py) before
    that. Every HTTP request is observed (http/middleware/observe.py: request ID, metrics, span)."""

    cors: CorsPolicy | None = None
    runtime: Runtime | None = None  # set by the lifespan, as the state's ``runtime``
    # Each tenant's live reads in this process (http/middleware/live_reads.py); set by create_app.
    live_reads: LiveReads | None = None

    def _runtime(self) -> Runtime:
        runtime = self.runtime
        if runtime is None:  # a request before the lifespan started (no such server)
            return runtime_in(self.state)
        return runtime

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        bad_host = host_error(scope["headers"])
        if bad_host is not None:
            await refuse(scope, send, bad_host)
            return
        if self.cors is not None:
            screened = await self.cors.screen(scope, send)
            if screened is None:
                return  # a preflight, answered by the CORS layer
            send = screened
        request = Request(scope)
        route = records_route(scope)
        if route is not None:
            status = 0  # no answer (the client went away, or the server is stopping)
            try:
                status = await answer_records(
                    self._runtime(), scope, receive, send, route, request.request_id
                )
            finally:
                request.end(RECORDS_TEMPLATE, status)
            return
        ds = ds_route(scope)
        if ds is not None:
            try:
                runtime = self._runtime()
                await answer_ds(
                    runtime,
                    scope,
                    receive,
                    request.tagged_send(send),
                    ds,
                    live_reads=self.live_reads,
                )
            finally:
                request.end(DS_TEMPLATE)
            return
        try:
            await self.without_front(scope, receive, send, request)
        finally:
            request.end(route_template(scope))

    async def without_front(
        self, scope: Any, receive: Any, send: Any, request: Request | None = None
    ) -> None:
        """Litestar's answer, with the headers every response carries (http/codecs/headers.py;
        the records front's answers carry them too) and the request's ID."""
        if scope["type"] == "http":
            request = request or Request(scope)
            send = request.observed_send(send, api=is_api_path(scope["path"]))
        await super().__call__(scope, receive, send)

    def begin_shutdown(self) -> None:
        """The server stops: end every SSE response now, with a reconnect hint (the
        clients resume on another replica from their Last-Event-ID). In-flight appends
        are left to finish; the server waits for them."""
        runtime = self.runtime
        if runtime is not None:
            runtime.followers.drain()
