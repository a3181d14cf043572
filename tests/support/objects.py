"""Fixtures for large objects and upkeep: both stores (a local folder, and GCS through
google-cloud-storage against gcp-storage-emulator started here, in-process), an app per
store, and helpers. Imported by tests/objects/conftest.py and tests/maintenance/conftest.py.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from litestar.testing import AsyncTestClient

from ductor_streams.config import Settings
from ductor_streams.http import create_app
from ductor_streams.objects import BlobStores
from ductor_streams.objects.blobstore import BlobStore

API = "/api/workflow-streams"
BUCKET = "ds-objects"
MiB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_EMULATOR: dict[str, str] = {}


def start_gcs_emulator() -> str:
    """gcp-storage-emulator in this process (in memory), started once per test process
    (both test folders' fixtures share it) and stopped at exit. Its URL goes in
    STORAGE_EMULATOR_HOST, so clients made here and in child processes use it."""
    if "url" not in _EMULATOR:
        from gcp_storage_emulator.server import create_server

        port = _free_port()
        server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
        server.start()
        atexit.register(server.stop)
        _EMULATOR["url"] = f"http://127.0.0.1:{port}"
        os.environ["STORAGE_EMULATOR_HOST"] = _EMULATOR["url"]
    return _EMULATOR["url"]


@pytest.fixture(scope="session")
def gcs_emulator() -> str:
    return start_gcs_emulator()


@dataclass
class ObjectEnv:
    """One store kind: its settings, its app's client, and direct access to the store."""

    kind: str
    settings: Settings
    client: AsyncTestClient[Any]
    stores: BlobStores

    @property
    def store(self) -> BlobStore:
        return self.stores.for_region("local")

    async def keys(self, stream_pk: int | None = None) -> list[str]:
        prefix = "ductor-streams/" if stream_pk is None else f"ductor-streams/{stream_pk}/"
        return sorted(b.key for b in await self.store.list_blobs(prefix))


def store_url(kind: str, tmp: Path, request: pytest.FixtureRequest) -> str:
    if kind == "local":
        return tmp.as_uri()
    request.getfixturevalue("gcs_emulator")
    return f"gs://{BUCKET}/{tmp.name}-{secrets.token_hex(3)}"


@pytest.fixture(scope="session", params=["local", "gcs"])
async def objects_env(
    request: pytest.FixtureRequest,
    settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[ObjectEnv]:
    """The app over one store kind (the test runs once per kind)."""
    kind = request.param
    url = store_url(kind, tmp_path_factory.mktemp(f"objects-{kind}"), request)
    env_settings = settings.with_overrides(object_stores={"local": url})
    app = create_app(env_settings)
    async with AsyncTestClient(app=app, timeout=60) as client:
        yield ObjectEnv(kind, env_settings, client, BlobStores(env_settings.object_stores))


@pytest.fixture(scope="session")
def object_server(objects_env: ObjectEnv) -> Iterator[Any]:
    """A real ``serve --no-workers`` subprocess over the same store (truly concurrent
    requests, unlike the in-process test client)."""
    from tests.support.server import ServerProcess

    with ServerProcess(objects_env.settings) as server:
        yield server


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def create_stream(
    client: AsyncTestClient[Any], headers: dict[str, str], run_id: str, **definition: Any
) -> dict[str, Any]:
    body = {"stream_id": "artifacts", "direction": "output", **definition}
    response = await client.post(f"{API}/runs/{run_id}/streams", json=body, headers=headers)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


async def stream_pk(pool: asyncpg.Pool, tenant: str, run_id: str, stream_id: str) -> int:
    pk = await pool.fetchval(
        "SELECT stream_pk FROM workflow_streams.streams "
        "WHERE tenant = $1 AND run_id = $2 AND stream_id = $3",
        tenant,
        run_id,
        stream_id,
    )
    assert pk is not None
    return int(pk)


def prepare_body(data: bytes, key: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "idempotency_key": key or secrets.token_hex(8),
        "sha256": sha256_hex(data),
        "size": len(data),
        "content_type": "application/octet-stream",
        "metadata": {"name": "artifact.bin"},
        **extra,
    }


@dataclass
class ObjectApi:
    """Calls of the object routes of one stream (in-process client or httpx to a server)."""

    client: Any
    headers: dict[str, str]
    run_id: str
    stream_id: str = "artifacts"

    @property
    def base(self) -> str:
        return f"{API}/runs/{self.run_id}/streams/{self.stream_id}"

    async def prepare(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        return await self.client.post(
            f"{self.base}/objects", json=body, headers=headers or self.headers
        )

    async def upload(
        self, object_id: str, data: bytes, headers: dict[str, str] | None = None
    ) -> Any:
        return await self.client.put(
            f"{self.base}/objects/{object_id}/content",
            content=data,
            headers={**(headers or self.headers), "Content-Type": "application/octet-stream"},
        )

    async def commit(self, object_id: str, headers: dict[str, str] | None = None) -> Any:
        return await self.client.post(
            f"{self.base}/objects/{object_id}/commit", headers=headers or self.headers
        )

    async def abort(self, object_id: str, headers: dict[str, str] | None = None) -> Any:
        return await self.client.post(
            f"{self.base}/objects/{object_id}/abort", headers=headers or self.headers
        )

    async def download(self, object_id: str, headers: dict[str, str] | None = None) -> Any:
        return await self.client.get(
            f"{self.base}/objects/{object_id}/content", headers=headers or self.headers
        )

    async def state(self, object_id: str) -> Any:
        return await self.client.get(f"{self.base}/objects/{object_id}", headers=self.headers)

    async def records(self, cursor: int = 0) -> Any:
        return await self.client.get(
            f"{self.base}/records", params={"cursor": cursor}, headers=self.headers
        )

    async def stream_state(self) -> dict[str, Any]:
        response = await self.client.get(self.base, headers=self.headers)
        assert response.status_code == 200, response.text
        state: dict[str, Any] = response.json()["state"]
        return state

    async def put_object(self, data: bytes, **extra: Any) -> tuple[str, int]:
        """Prepare, upload and commit; returns (object_id, sequence)."""
        prepared = await self.prepare(prepare_body(data, **extra))
        assert prepared.status_code == 201, prepared.text
        object_id = prepared.json()["object_id"]
        uploaded = await self.upload(object_id, data)
        assert uploaded.status_code == 200, uploaded.text
        committed = await self.commit(object_id)
        assert committed.status_code == 201, committed.text
        return object_id, committed.json()["sequence"]
