"""Large objects from activity code (not activities: bytes stay out of workflow history).

Inside an activity of a worker that has the ``StreamsPlugin``::

    from ductor_streams.activities import objects

    info = activity.info()
    stored = await objects.upload_object(
        info.workflow_id, "artifacts", pdf_bytes, content_type="application/pdf",
        idempotency_key=f"{info.workflow_id}:{info.activity_id}", metadata={"name": "report"},
    )
    data = await objects.download_object(info.workflow_id, "artifacts", stored.object_id)

``upload_object`` runs prepare -> upload -> commit through the same object service as
HTTP, so the same pins, evidence checks, credit and close rules apply; with the same
idempotency key a retried activity gets the original object and sequence back. Errors
are ApplicationErrors through the one mapping (``activities.application_errors``).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ductor_streams.activities.application_errors import domain_errors
from ductor_streams.activities.streams import StreamsActivities
from ductor_streams.objects import PrepareRequest
from ductor_streams.store import StreamKey, StreamRef

_BLOCK = 1024 * 1024


__all__ = ["StoredObject", "download_object", "upload_object"]


@dataclass(frozen=True)
class StoredObject:
    """A committed object and the sequence of its record."""

    object_id: str
    sequence: int
    sha256: str
    size: int


async def _ref(run_id: str, stream_id: str) -> tuple[StreamsActivities, StreamRef]:
    current = StreamsActivities.current()
    ref = await current.store.get_stream(StreamKey(current.settings.tenant, run_id, stream_id))
    return current, ref


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), _BLOCK):
        yield data[start : start + _BLOCK]


async def upload_object(
    run_id: str,
    stream_id: str,
    data: bytes,
    *,
    content_type: str,
    idempotency_key: str,
    metadata: dict[str, Any] | None = None,
    schema: str | None = None,
    region: str | None = None,
) -> StoredObject:
    """Store ``data`` as an object of the stream and commit its record (payload =
    ``metadata``); idempotent on ``idempotency_key``."""
    digest = hashlib.sha256(data).hexdigest()
    with domain_errors():
        current, ref = await _ref(run_id, stream_id)
        service = current.runtime.objects
        request = PrepareRequest.parse(
            idempotency_key=idempotency_key,
            sha256=digest,
            size=len(data),
            content_type=content_type,
            schema=schema,
            region=region,
            metadata=metadata or {},
        )
        prepared = await service.prepare(
            ref, request, principal=f"workflow:{run_id}", scopes=["streams:write"]
        )
        intent = prepared.intent
        object_id = str(intent.object_id)
        if intent.state == "committed":  # a retry after the commit's answer was lost
            sequence = intent.committed_sequence
        else:
            if intent.state == "prepared":
                await service.upload(ref, object_id, _chunks(data))
            sequence = (await service.commit(ref, object_id)).sequence
    assert sequence is not None
    return StoredObject(object_id, int(sequence), digest, len(data))


async def download_object(run_id: str, stream_id: str, object_id: str) -> bytes:
    """The bytes of a committed object of the stream."""
    with domain_errors():
        current, ref = await _ref(run_id, stream_id)
        current.check_egress(ref)
        _intent, chunks = await current.runtime.objects.download(ref, object_id)
        return b"".join([chunk async for chunk in chunks])
