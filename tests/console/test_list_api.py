"""Listing streams: ``GET /streams`` (the tenant's, filtered, newest activity first,
keyset pages) and ``GET /runs/{run}/streams``, against real Postgres. A token sees only
its tenant, its runs and the streams whose readers name it; bad parameters are problems
with stable codes."""

from __future__ import annotations

from typing import Any

from tests.conftest import API
from tests.ops.helpers import assert_problem

READ = ["streams:read"]


async def _stream(
    client: Any, headers: dict[str, str], run: str, stream: str, **extra: Any
) -> None:
    body = {"stream_id": stream, "direction": "output", **extra}
    r = await client.post(f"{API}/runs/{run}/streams", json=body, headers=headers)
    assert r.status_code == 201, r.text


async def _append(client: Any, headers: dict[str, str], run: str, stream: str, n: int) -> None:
    r = await client.post(
        f"{API}/runs/{run}/streams/{stream}/records",
        json={"records": [{"payload": {"n": i}} for i in range(n)]},
        headers=headers,
    )
    assert r.status_code == 201, r.text


def _keys(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["run_id"], s["stream_id"]) for s in body["streams"]]


async def _world(client: Any, auth: Any, tenant: str) -> dict[str, str]:
    admin = auth(tenant=tenant)
    await _stream(client, admin, "job-1", "a", credit={"max_unread_items": 7})
    await _stream(client, admin, "job-1", "b", consumers=["ui"])
    await _stream(client, admin, "job-2", "a")
    await _stream(client, admin, "other-9", "c", direction="input")
    await _stream(client, admin, "job-2", "secret", authorization={"readers": ["bob"]})
    # Activity order, newest last: job-1/b gets records after every create.
    await _append(client, admin, "job-1", "b", 3)
    r = await client.post(f"{API}/runs/job-2/streams/a/close", headers=admin)
    assert r.status_code == 200, r.text
    return admin


async def test_tenant_list_newest_activity_first_with_state_and_ceilings(
    client: Any, auth: Any, tenant: str
) -> None:
    await _world(client, auth, tenant)
    r = await client.get(f"{API}/streams", headers=auth(tenant=tenant, scopes=READ))
    assert r.status_code == 200, r.text
    body = r.json()
    # "secret" names only bob as reader: not listed for "tester".
    assert _keys(body) == [
        ("job-2", "a"),
        ("job-1", "b"),
        ("other-9", "c"),
        ("job-1", "a"),
    ]
    assert body["next_page"] is None
    b = body["streams"][1]
    assert (b["latest_sequence"], b["total_items"], b["unread_items"]) == (3, 3, 3)
    assert b["unread_bytes"] == b["total_bytes"] > 0
    assert b["last_append_at"] is not None and b["closed"] is False
    a = body["streams"][3]
    assert a["credit"] == {
        "max_unread_items": 7,
        "max_unread_bytes": 16 * 1024 * 1024,
        "max_total_items": None,
        "max_total_bytes": None,
    }
    assert a["last_append_at"] is None and a["unread_items"] == 0
    closed = body["streams"][0]
    assert closed["closed"] is True and closed["closed_at"] is not None
    assert body["streams"][2]["direction"] == "input"
    # bob sees the stream that names him.
    r = await client.get(f"{API}/streams", headers=auth(tenant=tenant, scopes=READ, sub="bob"))
    assert ("job-2", "secret") in _keys(r.json())


async def test_filters_narrow_the_list(client: Any, auth: Any, tenant: str) -> None:
    await _world(client, auth, tenant)
    reader = auth(tenant=tenant, scopes=READ)

    async def keys(**params: str) -> list[tuple[str, str]]:
        r = await client.get(f"{API}/streams", params=params, headers=reader)
        assert r.status_code == 200, r.text
        return _keys(r.json())

    assert await keys(run_prefix="job-") == [("job-2", "a"), ("job-1", "b"), ("job-1", "a")]
    assert await keys(run_prefix="job-1") == [("job-1", "b"), ("job-1", "a")]
    assert await keys(direction="input") == [("other-9", "c")]
    assert await keys(closed="true") == [("job-2", "a")]
    assert await keys(closed="false", run_prefix="job") == [("job-1", "b"), ("job-1", "a")]
    assert await keys(run_prefix="nothing") == []


async def test_keyset_pages_cover_every_stream_once(client: Any, auth: Any, tenant: str) -> None:
    await _world(client, auth, tenant)
    reader = auth(tenant=tenant, scopes=READ)
    seen: list[tuple[str, str]] = []
    page: str | None = None
    pages = 0
    while True:
        params = {"limit": "1", **({"page": page} if page else {})}
        r = await client.get(f"{API}/streams", params=params, headers=reader)
        assert r.status_code == 200, r.text
        seen += _keys(r.json())
        pages += 1
        page = r.json()["next_page"]
        if page is None:
            break
    assert seen == [("job-2", "a"), ("job-1", "b"), ("other-9", "c"), ("job-1", "a")]
    assert pages == 4


async def test_token_runs_and_tenant_bound_what_is_listed(
    client: Any, auth: Any, tenant: str
) -> None:
    await _world(client, auth, tenant)
    only_job1 = auth(tenant=tenant, scopes=READ, runs=["job-1"])
    r = await client.get(f"{API}/streams", headers=only_job1)
    assert _keys(r.json()) == [("job-1", "b"), ("job-1", "a")]
    r = await client.get(f"{API}/runs/job-2/streams", headers=only_job1)
    assert_problem(r, 404, "not_found")
    other = auth(tenant=tenant + "-x", scopes=READ)
    r = await client.get(f"{API}/streams", headers=other)
    assert r.json() == {"streams": [], "next_page": None}
    r = await client.get(f"{API}/runs/job-1/streams", headers=other)
    assert_problem(r, 404, "not_found")
    r = await client.get(f"{API}/streams", headers=auth(tenant=tenant, scopes=["streams:ops"]))
    assert_problem(r, 403, "forbidden")


async def test_run_list_pages_its_streams(client: Any, auth: Any, tenant: str) -> None:
    await _world(client, auth, tenant)
    reader = auth(tenant=tenant, scopes=READ)
    r = await client.get(f"{API}/runs/job-1/streams", headers=reader)
    assert r.status_code == 200, r.text
    assert _keys(r.json()) == [("job-1", "b"), ("job-1", "a")]
    r = await client.get(f"{API}/runs/job-1/streams", params={"limit": "1"}, headers=reader)
    assert _keys(r.json()) == [("job-1", "b")]
    token = r.json()["next_page"]
    r = await client.get(
        f"{API}/runs/job-1/streams", params={"limit": "1", "page": token}, headers=reader
    )
    assert _keys(r.json()) == [("job-1", "a")] and r.json()["next_page"] is None
    # Only a stream bob may not read: the run does not exist for him... and the reverse.
    r = await client.get(f"{API}/runs/job-2/streams", headers=reader)
    assert _keys(r.json()) == [("job-2", "a")]
    r = await client.get(f"{API}/runs/nope/streams", headers=reader)
    assert_problem(r, 404, "not_found")


async def test_bad_parameters_are_problems(client: Any, auth: Any, tenant: str) -> None:
    reader = auth(tenant=tenant, scopes=READ)
    cases = [
        ({"direction": "sideways"}, "invalid_filter"),
        ({"closed": "yes"}, "invalid_filter"),
        ({"run_prefix": ""}, "invalid_filter"),
        ({"run_prefix": "a b"}, "invalid_filter"),
        ({"unknown": "1"}, "invalid_filter"),
        ({"limit": "0"}, "invalid_limit"),
        ({"limit": "1001"}, "invalid_limit"),
        ({"page": "12"}, "invalid_page"),
        ({"page": "999999999999999999-1"}, "invalid_page"),
        ({"page": "-1"}, "invalid_page"),
        ({"page": "1-99999999999999999999"}, "invalid_page"),
    ]
    for params, code in cases:
        r = await client.get(f"{API}/streams", params=params, headers=reader)
        assert_problem(r, 400, code)
    r = await client.get(f"{API}/streams?closed=true&closed=false", headers=reader)
    assert_problem(r, 400, "invalid_filter")
    r = await client.get(f"{API}/runs/job-1/streams", params={"direction": "input"}, headers=reader)
    assert_problem(r, 400, "invalid_filter")
