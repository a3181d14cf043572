"""The streams-per-tenant quota (``DUCTOR_STREAMS_TENANT_MAX_STREAMS``; docs/security.md,
"Tenant isolation"): decided in Postgres under the tenant's row lock (``create_stream``,
``tenant_streams``), so parallel creates on several replicas stop exactly at the quota; a
stream that exists is answered as ever at the quota; other tenants are not affected;
native create, Durable Streams PUT and the activity's create refuse alike with
``tenant_quota_exhausted``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from ductor_streams.activities import error_types
from ductor_streams.activities.application_errors import to_application_error
from ductor_streams.config import Settings
from ductor_streams.errors import DefinitionConflict, TenantQuotaExhausted
from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.store import Store, StreamKey
from ductor_streams.store.db import create_pool
from tests.conftest import API, TokenFactory
from tests.support.server import ServerProcess

QUOTA = 3


def _definition(stream_id: str, **extra: Any) -> Any:
    return parse_definition(
        {"stream_id": stream_id, "direction": "output", **extra},
        region="local",
        object_store_regions=frozenset({"local"}),
    )


async def _streams_of(pool: asyncpg.Pool, tenant: str) -> tuple[int, int | None]:
    """(streams the tenant has, the tenant's count in tenant_streams)."""
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM workflow_streams.streams WHERE tenant = $1) AS n,"
        " (SELECT streams FROM workflow_streams.tenant_streams WHERE tenant = $1) AS counted",
        tenant,
    )
    assert row is not None
    return int(row["n"]), row["counted"]


@pytest.fixture
async def replica_pools(database_url: str) -> AsyncIterator[list[asyncpg.Pool]]:
    """Two pools, as two replicas of the server would have."""
    pools = [await create_pool(database_url, min_size=1, max_size=8) for _ in range(2)]
    try:
        yield pools
    finally:
        for pool in pools:
            await pool.close()


async def test_parallel_creates_on_two_replicas_stop_exactly_at_the_quota(
    replica_pools: list[asyncpg.Pool], pool: asyncpg.Pool, tenant: str
) -> None:
    quota, attempts = 15, 48
    stores = [Store(p, tenant_max_streams=quota) for p in replica_pools for _ in range(3)]

    async def create(i: int) -> str:
        store = stores[i % len(stores)]
        key = StreamKey(tenant, f"run-{i % 5}", f"s-{i}")
        try:
            _, created = await store.create_stream(key, _definition(key.stream_id))
        except TenantQuotaExhausted:
            return "quota"
        return "created" if created else "existing"

    outcomes = await asyncio.gather(*(create(i) for i in range(attempts)))
    assert outcomes.count("created") == quota
    assert outcomes.count("quota") == attempts - quota
    assert await _streams_of(pool, tenant) == (quota, quota)

    # Every stream that exists is still answered at the quota, on either replica:
    # the same definition is found (not created), another one is a conflict.
    created_ids = await pool.fetch(
        "SELECT run_id, stream_id FROM workflow_streams.streams WHERE tenant = $1", tenant
    )
    for store in (stores[0], stores[-1]):
        for row in created_ids:
            key = StreamKey(tenant, row["run_id"], row["stream_id"])
            ref, created = await store.create_stream(key, _definition(row["stream_id"]))
            assert not created and ref.key == key
            with pytest.raises(DefinitionConflict):
                await store.create_stream(key, _definition(row["stream_id"], schema="other"))
    assert await _streams_of(pool, tenant) == (quota, quota)


async def test_the_same_new_stream_created_in_parallel_at_the_last_place(
    replica_pools: list[asyncpg.Pool], pool: asyncpg.Pool, tenant: str
) -> None:
    stores = [Store(p, tenant_max_streams=2) for p in replica_pools for _ in range(4)]
    key = StreamKey(tenant, "run", "first")
    await stores[0].create_stream(key, _definition("first"))
    # Eight creates of one new stream race for the last place: one creates it, the
    # others find it (waiting behind the tenant's lock), none is refused.
    last = StreamKey(tenant, "run", "last")
    results = await asyncio.gather(*(s.create_stream(last, _definition("last")) for s in stores))
    assert sorted(created for _, created in results) == [False] * 7 + [True]
    assert len({ref.stream_pk for ref, _ in results}) == 1
    assert await _streams_of(pool, tenant) == (2, 2)
    with pytest.raises(TenantQuotaExhausted) as refused:
        await stores[1].create_stream(StreamKey(tenant, "run", "third"), _definition("third"))
    assert refused.value.code == "tenant_quota_exhausted" and refused.value.status == 409


async def test_each_tenant_has_its_own_quota_and_deleting_frees_a_place(
    pool: asyncpg.Pool, tenant: str
) -> None:
    store = Store(pool, tenant_max_streams=1)
    other = f"{tenant}-other"
    await store.create_stream(StreamKey(tenant, "run", "a"), _definition("a"))
    with pytest.raises(TenantQuotaExhausted):
        await store.create_stream(StreamKey(tenant, "run", "b"), _definition("b"))
    # The same run and stream names in another tenant: its own quota, its own stream.
    _, created = await store.create_stream(StreamKey(other, "run", "b"), _definition("b"))
    assert created
    assert await _streams_of(pool, tenant) == (1, 1)
    assert await _streams_of(pool, other) == (1, 1)
    # The count follows deletions too (the streams' delete trigger).
    await pool.execute(
        "DELETE FROM workflow_streams.streams WHERE tenant = $1 AND stream_id = 'a'", tenant
    )
    assert await _streams_of(pool, tenant) == (0, 0)
    _, created = await store.create_stream(StreamKey(tenant, "run", "b"), _definition("b"))
    assert created
    assert await _streams_of(pool, tenant) == (1, 1)


def test_the_activity_edge_names_the_quota() -> None:
    error = to_application_error(TenantQuotaExhausted())
    assert error.type == error_types.TENANT_QUOTA_EXHAUSTED
    assert error.non_retryable
    assert error.details[0]["code"] == "tenant_quota_exhausted"


def test_the_default_quota_is_high_and_configurable() -> None:
    assert Settings().tenant_max_streams == 100_000
    settings = Settings.from_env({"DUCTOR_STREAMS_TENANT_MAX_STREAMS": "7"})
    assert settings.tenant_max_streams == 7


# --- over HTTP, against a real server ------------------------------------------------


@pytest.fixture(scope="module")
def quota_server(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log = tmp_path_factory.mktemp("quota-server") / "server.log"
    env = {"DUCTOR_STREAMS_TENANT_MAX_STREAMS": str(QUOTA)}
    with ServerProcess(settings, extra_env=env, log_path=log) as proc:
        yield proc


def _assert_quota_problem(response: httpx.Response) -> None:
    assert response.status_code == 409, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "tenant_quota_exhausted", problem
    assert problem["status"] == 409


async def test_native_create_and_ds_put_refuse_past_the_quota(
    quota_server: Any, auth: TokenFactory, pool: asyncpg.Pool, tenant: str, run_id: str
) -> None:
    headers = auth()
    async with httpx.AsyncClient(base_url=quota_server.url, timeout=30) as http:
        native = f"{API}/runs/{run_id}/streams"
        for i in range(QUOTA - 1):
            r = await http.post(
                native, json={"stream_id": f"n{i}", "direction": "input"}, headers=headers
            )
            assert r.status_code == 201, r.text
        ds = f"{API}/runs/{run_id}/ds/v1/stream"
        r = await http.put(f"{ds}/d0", headers={**headers, "Content-Type": "text/plain"})
        assert r.status_code == 201, r.text
        assert await _streams_of(pool, tenant) == (QUOTA, QUOTA)

        # At the quota: a new stream is refused on both paths, and nothing is created.
        r = await http.post(native, json={"stream_id": "n9", "direction": "input"}, headers=headers)
        _assert_quota_problem(r)
        r = await http.put(
            f"{ds}/d9", headers={**headers, "Content-Type": "text/plain"}, content=b"hello"
        )
        _assert_quota_problem(r)
        assert await _streams_of(pool, tenant) == (QUOTA, QUOTA)
        assert (await http.get(f"{native}/n9", headers=headers)).status_code == 404

        # Existing streams answer as ever: 200 for the same definition, 409
        # definition_conflict for another, on both paths.
        r = await http.post(native, json={"stream_id": "n0", "direction": "input"}, headers=headers)
        assert r.status_code == 200, r.text
        r = await http.post(
            native, json={"stream_id": "n0", "direction": "output"}, headers=headers
        )
        assert r.status_code == 409 and r.json()["code"] == "definition_conflict"
        r = await http.put(f"{ds}/d0", headers={**headers, "Content-Type": "text/plain"})
        assert r.status_code == 200, r.text
        r = await http.put(f"{ds}/d0", headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 409 and r.json()["code"] == "definition_conflict"

        # Another tenant is not held back by this one's streams.
        other = auth(tenant=f"t-{uuid.uuid4().hex[:8]}")
        r = await http.post(native, json={"stream_id": "n9", "direction": "input"}, headers=other)
        assert r.status_code == 201, r.text
