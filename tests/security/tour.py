"""A tour of every route of the route table with marked data, for the log tests: each
route's valid request, then bad requests that carry the markers in bodies, headers and
IDs. Everything a log could leak is in ``World``'s markers and the bearer token."""

from __future__ import annotations

import json

from tests.security.routes import api_routes
from tests.security.world import World


async def tour(world: World) -> int:
    """Send every request; return how many were sent. The stream is closed before the
    SSE routes run, so their answers end."""
    sent = 0
    routes = api_routes()
    streaming = [r for r in routes if r.template.endswith("/subscribe")]
    closing = [r for r in routes if r.template.endswith("/close")]
    for route in routes:
        if route in streaming or route in closing:
            continue
        world.forget_object()
        await world.request(route, world.admin)
        sent += 1
    marker = world.secret_marker
    bad_requests: list[tuple[str, str, bytes, dict[str, str]]] = [
        (
            "POST",
            "/records",
            json.dumps({"records": [{"payload": marker, "x": marker}]}).encode(),
            {},
        ),
        ("POST", "/records", json.dumps({"records": [{"payload": marker * 3000}]}).encode(), {}),
        ("POST", "/records", b'{"records": [{"payload": "' + marker.encode() + b'"', {}),
        (
            "POST",
            "/records",
            json.dumps({"records": [{"payload": {marker: 1}}]}).encode(),
            {"Idempotency-Key": marker},
        ),
        (
            "POST",
            "/records",
            json.dumps({"records": [{"payload": {marker: 2}}]}).encode(),
            {"Idempotency-Key": marker},
        ),
        ("POST", "/consumers/c1/ack", json.dumps({"sequence": marker}).encode(), {}),
        ("PUT", "/legal-hold", json.dumps({"enabled": marker}).encode(), {}),
        (
            "PUT",
            "/legal-hold",
            json.dumps({"enabled": True, "reason": marker + "\u0000"}).encode(),
            {},
        ),
        (
            "POST",
            "/objects",
            json.dumps({**world.object_pins(b"x"), "sha256": marker}).encode(),
            {},
        ),
        (
            "POST",
            "/objects",
            json.dumps({**world.object_pins(b"x"), "metadata": {"m": marker + "\u0000"}}).encode(),
            {},
        ),
    ]
    for method, suffix, body, headers in bad_requests:
        await world.http.request(
            method,
            world.url(suffix),
            content=body,
            headers={**world.admin, "Content-Type": "application/json", **headers},
        )
        sent += 1
    create = f"/api/workflow-streams/runs/{world.run_id}/streams"
    for definition in (
        {"stream_id": "x", "direction": "output", "schema": marker * 20},
        {"stream_id": "x", "direction": "output", "schema": marker + "\u0000"},
        {"stream_id": marker.lower()[:100], "direction": marker},
        {
            "stream_id": "x",
            "direction": "output",
            "content_class": "raw_model_reasoning",
            "n": marker,
        },
        {**world.definition, "redaction": {"json_pointers": [marker]}},
    ):
        await world.http.post(create, json=definition, headers=world.admin)
        sent += 1
    for route in closing + streaming:
        await world.request(route, world.admin)
        sent += 1
    return sent
