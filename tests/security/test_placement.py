"""Placement and content classes (create definition and objects):
``metadata_home`` must be this deployment's region, object regions need a configured
store, compute in another region cannot move data (an HTTP server or an activity
configured for region B refuses to write objects of a stream pinned to A), and raw
hidden model reasoning is never a content class."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.exceptions import ApplicationError

from ductor_streams.activities import objects as activity_objects
from ductor_streams.activities.models import CreateStreamInput, ReadInput
from ductor_streams.activities.streams import StreamsActivities
from ductor_streams.config import Settings
from ductor_streams.foundation.definitions import CONTENT_CLASSES
from tests.conftest import API
from tests.security.dbstate import fingerprint
from tests.security.test_auth_matrix import assert_problem
from tests.security.world import World, bearer
from tests.support.server import ServerProcess


async def _create(http: httpx.AsyncClient, world: World, **fields: Any) -> httpx.Response:
    body = {"stream_id": world.fresh_stream_id(), "direction": "output", **fields}
    return await http.post(f"{API}/runs/{world.run_id}/streams", json=body, headers=world.admin)


async def test_placement_pins_are_checked_at_creation(world: World, pool: asyncpg.Pool) -> None:
    before = await fingerprint(pool, *world.watched)
    for placement in (
        {"metadata_home": "us-east1"},
        {"metadata_home": "LOCAL"},
        {"object_regions": ["nowhere"]},
        {"object_regions": ["local", "eu-west1"]},
    ):
        r = await _create(world.http, world, placement=placement)
        assert_problem(r, r.content, 422, "placement_mismatch")
    assert await fingerprint(pool, *world.watched) == before
    r = await _create(world.http, world, placement={"metadata_home": "local"})
    assert r.status_code == 201, r.text
    placement = r.json()["definition"]["placement"]
    assert placement == {
        "metadata_home": "local",
        "metadata_replicas": [],
        "object_regions": ["local"],
        "client_egress_regions": ["local"],
        "log_region": "local",
    }


async def test_content_classes(world: World, pool: asyncpg.Pool) -> None:
    for content_class in CONTENT_CLASSES:
        r = await _create(world.http, world, content_class=content_class)
        assert r.status_code == 201, r.text
        assert r.json()["definition"]["content_class"] == content_class
    before = await fingerprint(pool, *world.watched)
    r = await _create(world.http, world, content_class="raw_model_reasoning")
    assert_problem(r, r.content, 422, "content_class_forbidden")
    # Even with every other field wrong, the forbidden class is named as such.
    r = await _create(world.http, world, content_class="raw_model_reasoning", bogus=1)
    assert_problem(r, r.content, 422, "content_class_forbidden")
    for other in ("Raw_Model_Reasoning", "reasoning", "", 7, None):
        r = await _create(world.http, world, content_class=other)
        assert_problem(r, r.content, 422, "invalid_definition")
    assert await fingerprint(pool, *world.watched) == before


async def test_object_region_must_be_pinned(world: World, pool: asyncpg.Pool) -> None:
    before = await fingerprint(pool, *world.watched)
    pins = world.object_pins(b"data")
    for region in ("eu-west1", "LOCAL", ""):
        r = await world.http.post(
            world.url("/objects"), json={**pins, "region": region}, headers=world.admin
        )
        assert 400 <= r.status_code < 500, r.text
        if region:
            assert_problem(r, r.content, 422, "placement_mismatch")
    assert await fingerprint(pool, *world.watched) == before


@pytest.fixture
def region_b_settings(settings: Settings, tmp_path: Path) -> Settings:
    """A deployment in region ``far`` on the same database, with stores for both regions:
    it could physically write region ``local``'s bucket, and must not."""
    return settings.with_overrides(
        region="far",
        object_stores={**settings.object_stores, "far": (tmp_path / "far").as_uri()},
    )


async def test_a_server_in_region_b_refuses_to_write_objects_of_a_stream_of_a(
    world: World, pool: asyncpg.Pool, region_b_settings: Settings, tmp_path: Path
) -> None:
    data = b"bytes that must stay in local"
    # An object prepared at home, to try uploading and committing it from region B.
    home_object = await world.prepared_object()
    before = await fingerprint(pool, *world.watched)
    with ServerProcess(region_b_settings, log_path=tmp_path / "far.log") as far:
        async with httpx.AsyncClient(base_url=far.url, timeout=30) as http:
            for region in (None, "local", "far"):
                pins = {**world.object_pins(data), "region": region}
                r = await http.post(world.url("/objects"), json=pins, headers=world.admin)
                assert_problem(r, r.content, 422, "placement_mismatch")
            r = await http.put(
                world.url(f"/objects/{home_object}/content"),
                content=world.prepared_bytes,
                headers=world.admin,
            )
            assert_problem(r, r.content, 422, "placement_mismatch")
            r = await http.post(world.url(f"/objects/{home_object}/commit"), headers=world.admin)
            assert 400 <= r.status_code < 500, r.text
            # Reading is governed by egress: the token's region, or without one the
            # deployment's region (here ``far``, outside the stream's egress pins).
            r = await http.get(
                world.url("/records"), headers=bearer(tenant=world.tenant, region="local")
            )
            assert r.status_code == 200, r.text
            r = await http.get(world.url("/records"), headers=world.admin)
            assert_problem(r, r.content, 403, "egress_denied")
    assert await fingerprint(pool, *world.watched) == before
    far_store = tmp_path / "far"
    assert not far_store.exists() or not any(far_store.rglob("*")), "bytes landed in far"


async def test_an_activity_in_region_b_refuses_to_write_objects_of_a_stream_of_a(
    world: World, pool: asyncpg.Pool, region_b_settings: Settings
) -> None:
    # The activity side works in its own tenant (DUCTOR_STREAMS_TENANT).
    home = region_b_settings.with_overrides(region="local", tenant=world.tenant)
    far = region_b_settings.with_overrides(tenant=world.tenant)
    data = b"activity bytes " + secrets.token_bytes(8)
    before = await fingerprint(pool, *world.watched)
    acts = StreamsActivities(far)
    async with acts.lifetime():
        for region in (None, "local", "far"):
            with pytest.raises(ApplicationError) as caught:
                await activity_objects.upload_object(
                    world.run_id,
                    world.stream_id,
                    data,
                    content_type="application/octet-stream",
                    idempotency_key=f"k-{secrets.token_hex(4)}",
                    region=region,
                )
            assert caught.value.details[0]["code"] == "placement_mismatch"
            assert caught.value.non_retryable
    assert await fingerprint(pool, *world.watched) == before
    # The same call from an activity at home is accepted (the control).
    async with StreamsActivities(home).lifetime():
        stored = await activity_objects.upload_object(
            world.run_id,
            world.stream_id,
            data,
            content_type="application/octet-stream",
            idempotency_key="home-key",
        )
    assert stored.sha256 == hashlib.sha256(data).hexdigest()


async def test_activity_create_refuses_raw_reasoning_and_foreign_homes(
    world: World, settings: Settings, pool: asyncpg.Pool
) -> None:
    acts = StreamsActivities(settings.with_overrides(tenant=world.tenant))
    before = await fingerprint(pool, *world.watched)
    async with acts.lifetime():
        for definition, code in (
            ({"content_class": "raw_model_reasoning"}, "content_class_forbidden"),
            ({"placement": {"metadata_home": "far"}}, "placement_mismatch"),
        ):
            with pytest.raises(ApplicationError) as caught:
                await acts.create_stream(
                    CreateStreamInput(
                        run_id=world.run_id,
                        definition={"stream_id": "x", "direction": "output", **definition},
                    )
                )
            assert caught.value.details[0]["code"] == code
    assert await fingerprint(pool, *world.watched) == before


async def test_token_region_does_not_widen_egress(make_world: Any) -> None:
    world: World = await make_world(placement={"client_egress_regions": ["local", "eu"]})
    for region, allowed in (("local", True), ("eu", True), ("EU", False), ("us", False)):
        r = await world.http.get(
            world.url("/records"), headers=bearer(tenant=world.tenant, region=region)
        )
        if allowed:
            assert r.status_code == 200 and world.open_marker in r.text
        else:
            assert_problem(r, r.content, 403, "egress_denied")


async def test_an_activity_in_a_region_outside_the_egress_pins_cannot_read(
    world: World, region_b_settings: Settings
) -> None:
    """Payloads an activity reads land in workflow history: a worker of region B may not
    read records or download objects of a stream whose egress pins exclude B."""
    object_id = await world.committed_object()
    read = ReadInput(run_id=world.run_id, stream_id=world.stream_id, cursor=0)
    far = StreamsActivities(region_b_settings.with_overrides(tenant=world.tenant))
    async with far.lifetime():
        with pytest.raises(ApplicationError) as caught:
            await far.read(read)
        assert caught.value.details[0]["code"] == "egress_denied"
        with pytest.raises(ApplicationError) as caught:
            await activity_objects.download_object(world.run_id, world.stream_id, object_id)
        assert caught.value.details[0]["code"] == "egress_denied"
    home_settings = region_b_settings.with_overrides(region="local", tenant=world.tenant)
    home = StreamsActivities(home_settings)
    async with home.lifetime():
        page = await home.read(read)
        assert [r.payload for r in page.records][:2] == [world.payload, world.payload]
        data = await activity_objects.download_object(world.run_id, world.stream_id, object_id)
        assert data == world.prepared_bytes
