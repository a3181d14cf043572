"""Placement, races, retries, blocking credit and signed uploads."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import psutil
import pytest
from litestar.testing import AsyncTestClient

from ductor_streams.errors import ObjectAborted
from ductor_streams.http import create_app
from ductor_streams.maintenance.deletions import run_deletions
from ductor_streams.objects import BlobStores, PrepareRequest
from ductor_streams.objects.blobstore import BlobStore, StoredBlob
from ductor_streams.objects.intents import ObjectService
from ductor_streams.store import Store, StreamKey
from tests.conftest import TokenFactory
from tests.support.objects import (
    API,
    BUCKET,
    MiB,
    ObjectApi,
    ObjectEnv,
    create_stream,
    prepare_body,
    sha256_hex,
    stream_pk,
)


async def test_process_outside_metadata_home_refuses_to_write(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    api = ObjectApi(objects_env.client, headers, run_id)
    await create_stream(api.client, headers, run_id)
    object_id = (await api.prepare(prepare_body(b"abc"))).json()["object_id"]
    elsewhere = objects_env.settings.with_overrides(
        region="us-east1",
        object_stores={**objects_env.settings.object_stores, "us-east1": "file:///nonexistent"},
    )
    async with AsyncTestClient(
        app=create_app(elsewhere.with_overrides(pool_min_size=1, pool_max_size=2))
    ) as client:
        other = ObjectApi(client, headers, run_id)
        for response in (
            await other.prepare(prepare_body(b"abc")),
            await other.upload(object_id, b"abc"),
            await other.commit(object_id),
            await other.abort(object_id),
        ):
            assert response.status_code == 422, response.text
            assert response.json()["code"] == "placement_mismatch"
    assert (await api.state(object_id)).json()["state"] == "prepared"


async def _abort_midway(
    service: ObjectService, ref: Any, object_id: str, data: bytes
) -> AsyncIterator[bytes]:
    yield data[: len(data) // 2]
    await service.abort(ref, object_id)  # the intent ends while bytes are on their way
    yield data[len(data) // 2 :]


async def test_bytes_landing_after_abort_are_deleted(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    headers = auth()
    await create_stream(objects_env.client, headers, run_id)
    store = Store(pool)
    service = ObjectService(store, objects_env.stores, region="local")
    ref = await store.get_stream(StreamKey(tenant, run_id, "artifacts"))
    data = os.urandom(2 * MiB)
    request = PrepareRequest.parse(
        idempotency_key="race",
        sha256=sha256_hex(data),
        size=len(data),
        content_type="application/octet-stream",
        schema=None,
        region=None,
        metadata={},
    )
    prepared = await service.prepare(ref, request, principal="tester", scopes=["streams:write"])
    object_id = str(prepared.intent.object_id)
    with pytest.raises(ObjectAborted):
        await service.upload(ref, object_id, _abort_midway(service, ref, object_id, data))
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    await run_deletions(pool, objects_env.stores)
    assert await objects_env.keys(pk) == []
    reasons = await pool.fetch(
        "SELECT reason, state FROM workflow_streams.deletion_outbox WHERE object_id = $1 "
        "ORDER BY deletion_id",
        uuid.UUID(object_id),
    )
    assert [tuple(r) for r in reasons] == [("aborted", "done"), ("orphan", "done")]


class FlakyStore:
    """Wraps a store; its first ``failures`` deletes fail (a store outage)."""

    def __init__(self, inner: BlobStore, failures: int) -> None:
        self.inner = inner
        self.url = inner.url
        self.failures = failures
        self.deletes = 0

    async def delete(self, key: str) -> None:
        self.deletes += 1
        if self.deletes <= self.failures:
            raise ConnectionError("store unavailable")
        await self.inner.delete(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def list_blobs(self, prefix: str = "ductor-streams/") -> list[StoredBlob]:
        return await self.inner.list_blobs(prefix)


async def test_failed_deletions_are_retried_with_backoff(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    headers = auth()
    api = ObjectApi(objects_env.client, headers, run_id)
    await create_stream(api.client, headers, run_id)
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    data = b"to be aborted"
    object_id = (await api.prepare(prepare_body(data))).json()["object_id"]
    assert (await api.upload(object_id, data)).status_code == 200

    flaky = FlakyStore(objects_env.store, failures=1)
    stores = BlobStores({})
    stores.put("local", flaky)  # type: ignore[arg-type]
    store = Store(pool)
    service = ObjectService(store, stores, region="local")
    ref = await store.get_stream(StreamKey(tenant, run_id, "artifacts"))
    assert (await service.abort(ref, object_id)).state == "aborted"
    row = await pool.fetchrow(
        "SELECT state, attempts, last_error, next_attempt_at > now() AS later "
        "FROM workflow_streams.deletion_outbox WHERE object_id = $1",
        uuid.UUID(object_id),
    )
    assert (row["state"], row["attempts"], row["later"]) == ("pending", 1, True)
    assert row["last_error"] == "ConnectionError: store unavailable"
    assert len(await objects_env.keys(pk)) == 1
    # Not due yet: nothing is attempted.
    assert (await run_deletions(pool, stores)).deleted == 0
    assert flaky.deletes == 1

    deadline = time.monotonic() + 15
    while (await run_deletions(pool, stores)).deleted == 0:
        assert time.monotonic() < deadline, "the retry never came"
        await asyncio.sleep(0.2)
    row = await pool.fetchrow(
        "SELECT state, attempts, last_error FROM workflow_streams.deletion_outbox "
        "WHERE object_id = $1",
        uuid.UUID(object_id),
    )
    assert tuple(row) == ("done", 2, None)
    assert await objects_env.keys(pk) == []


async def test_commit_blocks_for_credit_under_block_policy(
    objects_env: ObjectEnv, object_server: Any, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    async with httpx.AsyncClient(base_url=object_server.url, timeout=60) as http:
        api = ObjectApi(http, headers, run_id)
        await create_stream(
            http,
            headers,
            run_id,
            consumers=["ui"],
            credit={"max_unread_items": 1, "on_unread_full": "block", "block_timeout_ms": 20_000},
        )
        data = b"waits for an ack"
        object_id = (await api.prepare(prepare_body(data))).json()["object_id"]
        assert (await api.upload(object_id, data)).status_code == 200
        inline = await http.post(
            f"{api.base}/records", json={"records": [{"payload": 0}]}, headers=headers
        )
        assert inline.status_code == 201
        commit = asyncio.ensure_future(api.commit(object_id))
        done, _ = await asyncio.wait({commit}, timeout=0.5)
        assert not done  # waiting for credit, not refused
        assert (await api.stream_state())["latest_sequence"] == 1
        ack = await http.post(f"{api.base}/consumers/ui/ack", json={"sequence": 1}, headers=headers)
        assert ack.status_code == 200
        response = await asyncio.wait_for(commit, 20)
        assert response.status_code == 201 and response.json() == {"sequence": 2}


def _service_account_key() -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return {
        "type": "service_account",
        "project_id": "test",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": "dev@test.iam.gserviceaccount.com",
        "token_uri": "https://oauth2.googleapis.com/token",
    }


async def test_gcs_signed_upload_then_commit_checks_evidence(
    gcs_emulator: str,
    settings: Any,
    auth: TokenFactory,
    run_id: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    key_file = tmp_path / "sa.json"
    key_file.write_text(json.dumps(_service_account_key()))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    url = f"gs://{BUCKET}/signed-{uuid.uuid4().hex[:6]}?signed_uploads=1"
    signed_settings = settings.with_overrides(
        object_stores={"local": url}, google_application_credentials=str(key_file)
    )
    headers = auth()
    async with AsyncTestClient(
        app=create_app(signed_settings.with_overrides(pool_min_size=1, pool_max_size=2))
    ) as client:
        api = ObjectApi(client, headers, run_id)
        await create_stream(client, headers, run_id)
        data = os.urandom(MiB + 3)
        prepared = await api.prepare(prepare_body(data, content_type="application/pdf"))
        assert prepared.status_code == 201
        upload = prepared.json()["upload"]
        assert upload["method"] == "PUT"
        assert upload["url"].startswith(gcs_emulator) and "X-Goog-Signature=" in upload["url"]
        assert upload["headers"] == {"Content-Type": "application/pdf"}
        object_id = prepared.json()["object_id"]

        early = await api.commit(object_id)
        assert early.status_code == 409 and early.json()["code"] == "object_not_uploaded"
        async with httpx.AsyncClient() as raw:
            wrong = await raw.put(
                upload["url"], content=data[:-1] + b"?", headers=upload["headers"]
            )
            assert wrong.status_code == 200
            bad = await api.commit(object_id)
            assert bad.status_code == 422 and bad.json()["code"] == "object_evidence_mismatch"
            assert (await api.stream_state())["latest_sequence"] == 0
            good = await raw.put(upload["url"], content=data, headers=upload["headers"])
            assert good.status_code == 200
        committed = await api.commit(object_id)
        assert committed.status_code == 201 and committed.json() == {"sequence": 1}
        downloaded = await api.download(object_id)
        assert sha256_hex(downloaded.content) == sha256_hex(data)
        assert downloaded.headers["content-type"].startswith("application/pdf")


async def test_signed_urls_need_the_option(objects_env: ObjectEnv) -> None:
    from datetime import UTC, datetime

    expires = datetime.now(UTC) + timedelta(minutes=5)
    assert objects_env.store.signed_upload("k", content_type="a/b", expires_at=expires) is None


async def test_upload_through_real_server_streams_32_mib(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str
) -> None:
    """uvicorn hands the body over in many chunks; the bytes arrive whole and verified."""
    from tests.support.server import ServerProcess

    headers = auth()
    data = os.urandom(32 * MiB)
    base = f"{API}/runs/{run_id}/streams/artifacts"
    with ServerProcess(objects_env.settings) as server:
        assert server.process is not None
        process = psutil.Process(server.process.pid)
        peak = [0]
        sampling = asyncio.Event()

        async def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], process.memory_info().rss)
                await asyncio.sleep(0.002)

        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as http:
            created = await http.post(
                f"{API}/runs/{run_id}/streams",
                json={"stream_id": "artifacts", "direction": "output"},
            )
            assert created.status_code == 201
            prepared = await http.post(f"{base}/objects", json=prepare_body(data))
            object_id = prepared.json()["object_id"]
            wrong = await http.put(f"{base}/objects/{object_id}/content", content=b"\0" + data[1:])
            assert wrong.status_code == 422
            assert wrong.json()["code"] == "object_evidence_mismatch"
            before = process.memory_info().rss
            sampler = asyncio.ensure_future(sample())
            put = await http.put(f"{base}/objects/{object_id}/content", content=data)
            sampling.set()
            await sampler
            assert put.status_code == 200, put.text
            # Streamed in ~1 MiB blocks: the server never holds the 32 MiB body (one copy
            # alone would add 32 MiB to its resident size).
            assert before <= peak[0] < before + 16 * MiB, (before, peak[0])
            commit = await http.post(f"{base}/objects/{object_id}/commit")
            assert commit.status_code == 201 and commit.json() == {"sequence": 1}
            got = await http.get(f"{base}/objects/{object_id}/content")
            assert got.status_code == 200
            assert int(got.headers["content-length"]) == 32 * MiB
            assert sha256_hex(got.content) == sha256_hex(data)
