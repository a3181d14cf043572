"""The API's route table, read from the app itself, and one valid sample request per route.

Every security test iterates ``api_routes()``; a route added later is picked up
automatically, and a route without a sample in ``SAMPLES`` fails loudly (add one there),
so no route can skip the auth matrix.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ductor_streams.config import Settings
from ductor_streams.http import API_MOUNT, create_app

if TYPE_CHECKING:
    from tests.security.world import World

_PARAM = re.compile(r"\{([^}:]+)(?::[^}]+)?\}")


@dataclass(frozen=True)
class ApiRoute:
    """One (method, path) of the API with the scope its handler declares."""

    method: str
    path: str  # litestar form, e.g. /api/workflow-streams/runs/{run_id:str}/streams
    scope: str | None
    handler_name: str
    params: tuple[str, ...]

    @property
    def template(self) -> str:
        """The path below the mount with every parameter written ``{}``."""
        return _PARAM.sub("{}", self.path[len(API_MOUNT) :])

    @property
    def key(self) -> tuple[str, str]:
        return (self.method, self.template)

    @property
    def run_scoped(self) -> bool:
        return any(_kind(p) == "run" for p in self.params)

    @property
    def stream_scoped(self) -> bool:
        return any(_kind(p) == "stream" for p in self.params)

    def __str__(self) -> str:
        return f"{self.method} {self.template}"


def _kind(param: str) -> str:
    name = param.lower()
    for kind in ("run", "stream", "consumer", "object", "delivery"):
        if kind in name:
            return kind
    return name


def api_routes(*, include_public: bool = False) -> list[ApiRoute]:
    """Every route handler mounted under the API, except litestar's automatic OPTIONS
    and the data-free ``PUBLIC_ROUTES`` (tested on their own)."""
    app = create_app(Settings(database_url="postgresql://unused/none", jwt_secret="x" * 32))
    routes: list[ApiRoute] = []
    for route in app.routes:
        if not route.path.startswith(API_MOUNT):
            continue
        for handler in route.route_handlers:
            methods = getattr(handler, "http_methods", set())
            for method in sorted(methods):
                if method == "OPTIONS" and handler.opt.get("scope") is None:
                    continue  # litestar's generated OPTIONS handler (guarded: 401/403)
                api_route = ApiRoute(
                    method=method,
                    path=route.path,
                    scope=handler.opt.get("scope"),
                    handler_name=handler.handler_name,
                    params=tuple(_PARAM.findall(route.path)),
                )
                if include_public or api_route.key not in PUBLIC_ROUTES:
                    routes.append(api_route)
    return sorted(routes, key=lambda r: (r.template, r.method))


@dataclass
class Sample:
    """A valid request to one route: everything but the path and the auth header."""

    json: Any = None
    content: bytes | None = None
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def fill_path(route: ApiRoute, values: dict[str, str]) -> str:
    """The route's path with each parameter replaced by ``values[kind]``."""

    def sub(match: re.Match[str]) -> str:
        return values[_kind(match.group(1))]

    return _PARAM.sub(sub, route.path)


SampleFactory = Callable[["World"], Awaitable[Sample]]


async def _none(world: World) -> Sample:
    return Sample()


async def _create(world: World) -> Sample:
    return Sample(
        json={
            "stream_id": world.fresh_stream_id(),
            "direction": "output",
            "content_class": "text",
            "schema": "chat.message/v1",
            "consumers": ["ui"],
            "credit": {"max_unread_items": 10, "on_unread_full": "block", "block_timeout_ms": 5},
            "retention": {"max_age_seconds": 3600},
            "redaction": {"json_pointers": ["/user/email"]},
            "placement": {"metadata_home": "local", "client_egress_regions": ["local"]},
            "authorization": {"readers": ["*"], "writers": ["alice"]},
        }
    )


async def _append(world: World) -> Sample:
    return Sample(json={"records": [{"payload": {"n": 1}}]})


async def _ack(world: World) -> Sample:
    return Sample(json={"sequence": 1})


async def _hold(world: World) -> Sample:
    return Sample(json={"enabled": False, "reason": "security matrix"})


async def _read_records(world: World) -> Sample:
    return Sample(params={"cursor": "0"})


async def _prepare_object(world: World) -> Sample:
    return Sample(json=world.object_pins(b"prepared by the matrix"))


async def _upload_object(world: World) -> Sample:
    await world.prepared_object()
    return Sample(content=world.prepared_bytes)


async def _after_upload(world: World) -> Sample:
    await world.uploaded_object()
    return Sample()


async def _after_commit(world: World) -> Sample:
    await world.committed_object()
    return Sample()


async def _after_prepare(world: World) -> Sample:
    await world.prepared_object()
    return Sample()


async def _deliveries(world: World) -> Sample:
    return Sample(params={})


# (method, path below the mount with parameters as {}) -> a valid request.
SAMPLES: dict[tuple[str, str], SampleFactory] = {
    ("POST", "/runs/{}/streams"): _create,
    ("GET", "/runs/{}/streams"): _none,
    ("GET", "/streams"): _none,
    ("GET", "/runs/{}/streams/{}"): _none,
    ("POST", "/runs/{}/streams/{}/close"): _none,
    ("PUT", "/runs/{}/streams/{}/legal-hold"): _hold,
    ("POST", "/runs/{}/streams/{}/records"): _append,
    ("GET", "/runs/{}/streams/{}/records"): _read_records,
    ("POST", "/runs/{}/streams/{}/consumers/{}/ack"): _ack,
    ("GET", "/runs/{}/streams/{}/subscribe"): _read_records,
    ("POST", "/runs/{}/streams/{}/objects"): _prepare_object,
    ("PUT", "/runs/{}/streams/{}/objects/{}/content"): _upload_object,
    ("GET", "/runs/{}/streams/{}/objects/{}"): _after_prepare,
    ("GET", "/runs/{}/streams/{}/objects/{}/content"): _after_commit,
    ("POST", "/runs/{}/streams/{}/objects/{}/commit"): _after_upload,
    ("POST", "/runs/{}/streams/{}/objects/{}/abort"): _after_prepare,
    ("GET", "/ops/deliveries"): _deliveries,
    ("GET", "/ops/deliveries/{}"): _none,
    ("GET", "/ops/summary"): _none,
    ("POST", "/ops/deliveries/{}/retry"): _none,
    ("GET", "/ops/gaps"): _none,
    ("GET", "/ops"): _none,
}


# Routes under the mount that are deliberately public: they hold no data at all (the
# operator page and its static assets; its script calls the guarded JSON API).
PUBLIC_ROUTES = {("GET", "/ops"), ("GET", "/ops/static/{}")}


def sample_for(route: ApiRoute) -> SampleFactory:
    try:
        return SAMPLES[route.key]
    except KeyError:
        raise AssertionError(
            f"route {route} has no sample request in tests/security/routes.py SAMPLES: "
            "add one so that the security matrix covers it"
        ) from None
