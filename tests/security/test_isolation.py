"""Tenant isolation with colliding names: two tenants with the same run ID and stream ID
never see or touch each other's records, objects, consumers or deliveries."""

from __future__ import annotations

import asyncpg
import httpx

from tests.conftest import API
from tests.security.dbstate import fingerprint
from tests.security.test_auth_matrix import assert_problem
from tests.security.world import World


async def _twins(http: httpx.AsyncClient) -> tuple[World, World]:
    a = World(http, consumers=["c1", "only-a"])
    b = World(http)
    b.run_id, b.stream_id = a.run_id, a.stream_id
    b.definition["stream_id"] = a.stream_id
    await a.setup()
    await b.setup()
    return a, b


async def test_same_names_in_two_tenants_are_two_streams(http: httpx.AsyncClient) -> None:
    a, b = await _twins(http)
    ra = await http.get(a.url("/records"), headers=a.admin)
    rb = await http.get(b.url("/records"), headers=b.admin)
    assert a.open_marker in ra.text and b.open_marker not in ra.text
    assert b.open_marker in rb.text and a.open_marker not in rb.text


async def test_no_cross_tenant_objects_consumers_or_deliveries(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    a, b = await _twins(http)
    a_object = await a.committed_object()
    a_delivery = await a.delivery_id()
    before = await fingerprint(pool, a.tenant, b.tenant)
    for method, suffix in (
        ("GET", f"/objects/{a_object}"),
        ("GET", f"/objects/{a_object}/content"),
        ("POST", f"/objects/{a_object}/commit"),
        ("POST", f"/objects/{a_object}/abort"),
    ):
        r = await http.request(method, b.url(suffix), headers=b.admin)
        assert_problem(r, r.content, 404, "not_found")
    r = await http.put(b.url(f"/objects/{a_object}/content"), content=b"x", headers=b.admin)
    assert_problem(r, r.content, 404, "not_found")
    r = await http.post(b.url("/consumers/only-a/ack"), json={"sequence": 1}, headers=b.admin)
    assert_problem(r, r.content, 404, "consumer_not_found")
    for method, path in (
        ("GET", f"{API}/ops/deliveries/{a_delivery}"),
        ("POST", f"{API}/ops/deliveries/{a_delivery}/retry"),
    ):
        r = await http.request(method, path, headers=b.admin)
        assert_problem(r, r.content, 404, "not_found")
    r = await http.get(f"{API}/ops/deliveries", params={"run": a.run_id}, headers=b.admin)
    assert r.status_code == 200 and r.json()["deliveries"] == [], r.text
    assert await fingerprint(pool, a.tenant, b.tenant) == before


async def test_an_object_of_another_stream_of_the_same_run_is_not_found(
    http: httpx.AsyncClient,
) -> None:
    a = await World(http).setup()
    sibling = World(http)
    sibling.tenant, sibling.admin, sibling.run_id = a.tenant, a.admin, a.run_id
    await sibling.setup()
    a_object = await a.committed_object()
    r = await http.get(sibling.url(f"/objects/{a_object}/content"), headers=a.admin)
    assert_problem(r, r.content, 404, "not_found")


async def test_downloaded_objects_are_never_rendered_in_this_origin(
    http: httpx.AsyncClient,
) -> None:
    world = await World(http).setup(records=0)
    html = b"<html><script>alert(document.domain)</script></html>"
    pins = {**world.object_pins(html), "content_type": "text/html"}
    r = await http.post(world.url("/objects"), json=pins, headers=world.admin)
    assert r.status_code == 201, r.text
    object_id = r.json()["object_id"]
    r = await http.put(
        world.url(f"/objects/{object_id}/content"), content=html, headers=world.admin
    )
    assert r.status_code == 200, r.text
    r = await http.post(world.url(f"/objects/{object_id}/commit"), headers=world.admin)
    assert r.status_code == 201, r.text
    r = await http.get(world.url(f"/objects/{object_id}/content"), headers=world.admin)
    assert r.status_code == 200 and r.content == html
    assert r.headers["content-disposition"] == "attachment"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in r.headers["content-security-policy"]
