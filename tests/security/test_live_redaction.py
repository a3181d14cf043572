"""Redaction and egress on live SSE delivery (not only backfill): a record appended
while a restricted subscriber is connected reaches it redacted; an unrestricted
subscriber gets it whole; a subscriber from another region is refused before the
stream starts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from ductor_streams.auth import SCOPES
from tests.security.test_auth_matrix import assert_problem
from tests.security.world import World, bearer

# An SSE test that hangs (a response that never ends) fails here, well before the
# suite's 300 s: the slowest of these takes a few seconds.
pytestmark = pytest.mark.timeout(60)


async def _first_record(response: httpx.Response, sequence: int) -> dict[str, Any]:
    """The record event with ``id: sequence`` (reads until it arrives)."""
    event: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if event.get("event") == "record" and event.get("id") == str(sequence):
                record: dict[str, Any] = json.loads(event["data"])
                return record
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.lstrip(" ")
    raise AssertionError("the stream ended before the record arrived")


async def test_live_records_are_redacted_and_egress_checked(world: World) -> None:
    restricted = bearer(
        tenant=world.tenant, scopes=[s for s in SCOPES if s != "streams:read_unredacted"]
    )
    url = world.url("/subscribe")
    far = await world.http.get(
        url, params={"cursor": "2"}, headers=bearer(tenant=world.tenant, region="far-away")
    )
    assert_problem(far, far.content, 403, "egress_denied")
    async with (
        world.http.stream("GET", url, params={"cursor": "2"}, headers=restricted) as redacted,
        world.http.stream("GET", url, params={"cursor": "2"}, headers=world.admin) as full,
    ):
        assert redacted.status_code == 200 and full.status_code == 200
        r = await world.http.post(
            world.url("/records"),
            json={"records": [{"payload": world.payload}]},
            headers=world.admin,
        )
        assert r.json()["first_sequence"] == 3, r.text
        got_redacted, got_full = await asyncio.wait_for(
            asyncio.gather(_first_record(redacted, 3), _first_record(full, 3)), timeout=20
        )
    assert got_redacted["payload"] == {"secret": "[REDACTED]", "open": world.open_marker}
    assert got_full["payload"] == world.payload
