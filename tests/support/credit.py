"""Helpers for the credit and speed tests: streams with given ceilings, on the Store and
over HTTP, and a Store wired to a real NotificationHub (acks wake blocked producers)."""

from __future__ import annotations

import uuid
from typing import Any

from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.store import Store, StreamKey, StreamRef, encode_batch
from ductor_streams.store.models import AppendResult

API = "/api/workflow-streams"


def credit(**ceilings: Any) -> dict[str, Any]:
    """A ``credit`` object with every ceiling off unless given."""
    body: dict[str, Any] = {
        "max_unread_items": None,
        "max_unread_bytes": None,
        "max_total_items": None,
        "max_total_bytes": None,
    }
    body.update(ceilings)
    return body


def definition_body(
    stream_id: str | None = None,
    *,
    direction: str = "output",
    consumers: list[str] | None = None,
    **ceilings: Any,
) -> dict[str, Any]:
    return {
        "stream_id": stream_id or f"s-{uuid.uuid4().hex[:10]}",
        "direction": direction,
        "consumers": consumers if consumers is not None else ["c"],
        "credit": credit(**ceilings),
    }


async def make_stream(
    store: Store,
    *,
    tenant: str | None = None,
    run_id: str | None = None,
    direction: str = "output",
    consumers: list[str] | None = None,
    **ceilings: Any,
) -> StreamRef:
    """Create a stream directly on the store (no HTTP)."""
    body = definition_body(direction=direction, consumers=consumers, **ceilings)
    definition = parse_definition(body, region="local", object_store_regions=frozenset())
    key = StreamKey(
        tenant or f"t-{uuid.uuid4().hex[:8]}",
        run_id or f"run-{uuid.uuid4().hex[:12]}",
        body["stream_id"],
    )
    ref, created = await store.create_stream(key, definition)
    assert created
    return ref


async def append(
    store: Store, ref: StreamRef, payloads: list[Any], key: str | None = None
) -> AppendResult:
    return await store.append(ref, encode_batch(payloads, idempotency_key=key))


def records_url(run_id: str, stream_id: str) -> str:
    return f"{API}/runs/{run_id}/streams/{stream_id}/records"


def ack_url(run_id: str, stream_id: str, consumer: str) -> str:
    return f"{API}/runs/{run_id}/streams/{stream_id}/consumers/{consumer}/ack"


def stream_url(run_id: str, stream_id: str) -> str:
    return f"{API}/runs/{run_id}/streams/{stream_id}"
