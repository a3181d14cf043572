"""Test activities that use the object helpers for activity code."""

from __future__ import annotations

import hashlib

from temporalio import activity
from temporalio.exceptions import ApplicationError

from ductor_streams.activities import objects


def artifact_bytes(size: int) -> bytes:
    return bytes((i * 7 + 3) % 251 for i in range(size))


@activity.defn
async def make_artifact(size: int) -> dict[str, object]:
    """Uploads an artifact; the first attempt loses its answer after the commit."""
    info = activity.info()
    stored = await objects.upload_object(
        info.workflow_id,
        "artifacts",
        artifact_bytes(size),
        content_type="application/octet-stream",
        idempotency_key=f"{info.workflow_id}:{info.activity_id}",
        metadata={"name": "report.bin"},
    )
    if info.attempt == 1:
        raise ApplicationError("injected: the answer was lost after the commit")
    return {"object_id": stored.object_id, "sequence": stored.sequence, "sha256": stored.sha256}


@activity.defn
async def read_artifact(object_id: str) -> str:
    data = await objects.download_object(activity.info().workflow_id, "artifacts", object_id)
    return hashlib.sha256(data).hexdigest()
