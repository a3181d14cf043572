"""Large objects from activity code: upload once under a retried activity, read back."""

from __future__ import annotations

import hashlib

from temporalio.client import Client

from ductor_streams.config import Settings
from ductor_streams.store import Store, StreamKey
from tests.temporal.activities import artifact_bytes, make_artifact, read_artifact
from tests.temporal.conftest import WorkerFactory
from tests.temporal.workflows import ArtifactWorkflow

SIZE = 3 * 1024 * 1024 + 17


async def test_activity_uploads_an_object_once_and_reads_it_back(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
) -> None:
    async with make_worker([ArtifactWorkflow], activities=[make_artifact, read_artifact]):
        stored, digest = await wf_client.execute_workflow(
            ArtifactWorkflow.run, SIZE, id=run_id, task_queue=task_queue
        )
    expected = hashlib.sha256(artifact_bytes(SIZE)).hexdigest()
    assert stored["sequence"] == 1 and stored["sha256"] == expected
    assert digest == expected
    ref = await store.get_stream(StreamKey(wf_settings.tenant, run_id, "artifacts"))
    page = await store.read(ref, 0, 10)
    assert [(r.sequence, r.payload) for r in page.records] == [(1, '{"name":"report.bin"}')]
    assert page.records[0].object == {
        "object_id": stored["object_id"],
        "sha256": expected,
        "size": SIZE,
        "content_type": "application/octet-stream",
    }
