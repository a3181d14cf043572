"""The authentication and scope rules (docs/security.md) on the foundation routes."""

from __future__ import annotations

import jwt
import pytest

from tests.conftest import JWT_SECRET
from tests.foundation.helpers import append, assert_problem, create, state, stream_url


async def test_missing_bad_expired_malformed_tokens_are_401(client, auth, run_id):
    await create(client, auth(), run_id)
    url = stream_url(run_id, "s")
    expired = auth(ttl=-60)
    wrong_key = auth(secret="another-secret-" + "y" * 30)
    for headers in [
        {},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer not.a.jwt"},
        expired,
        wrong_key,
        {"Authorization": "Bearer " + jwt.encode({"sub": "x"}, JWT_SECRET, algorithm="HS256")},
    ]:
        r = await client.get(url, headers=headers)
        assert_problem(r, 401, "unauthenticated")


async def test_run_outside_token_other_tenant_unknown_stream_are_404(client, auth, run_id):
    await create(client, auth(), run_id)
    assert_problem(
        await client.get(stream_url(run_id, "s"), headers=auth(runs=["other-run"])),
        404,
        "not_found",
    )
    assert_problem(
        await client.get(stream_url(run_id, "s"), headers=auth(tenant="elsewhere")),
        404,
        "not_found",
    )
    assert_problem(await client.get(stream_url(run_id, "nope"), headers=auth()), 404, "not_found")
    assert_problem(
        await client.get(stream_url("never-made", "s"), headers=auth()), 404, "not_found"
    )
    # A token scoped to exactly this run sees it.
    assert (
        await client.get(stream_url(run_id, "s"), headers=auth(runs=[run_id]))
    ).status_code == 200


async def test_not_found_does_not_depend_on_scope(client, auth, run_id):
    # Even with no useful scope, another run's stream is 404, not 403.
    await create(client, auth(), run_id)
    r = await client.get(stream_url(run_id, "s"), headers=auth(runs=["x"], scopes=["streams:ops"]))
    assert_problem(r, 404, "not_found")


@pytest.mark.parametrize(
    ("method", "suffix", "scope", "body"),
    [
        ("GET", "", "streams:read", None),
        ("GET", "/records", "streams:read", None),
        ("POST", "/records", "streams:write", {"records": [{"payload": 1}]}),
        ("POST", "/close", "streams:admin", None),
        ("PUT", "/legal-hold", "streams:admin", {"enabled": True}),
        ("POST", "/consumers/c/ack", "streams:ack", {"sequence": 0}),
    ],
)
async def test_each_route_needs_its_scope(client, auth, run_id, method, suffix, scope, body):
    await create(client, auth(), run_id, consumers=["c"])
    others = [
        s
        for s in (
            "streams:read",
            "streams:write",
            "streams:ack",
            "streams:admin",
            "streams:read_unredacted",
            "streams:ops",
        )
        if s != scope
    ]
    r = await client.request(
        method, stream_url(run_id, "s", suffix), json=body, headers=auth(scopes=others)
    )
    assert_problem(r, 403, "forbidden")
    r = await client.request(
        method, stream_url(run_id, "s", suffix), json=body, headers=auth(scopes=[scope])
    )
    assert r.status_code == (201 if (method, suffix) == ("POST", "/records") else 200), r.text
    st = await state(client, auth(), run_id)
    assert st["closed"] == (suffix == "/close")


async def test_create_needs_admin(client, auth, run_id):
    r = await client.post(
        stream_url(run_id),
        json={"stream_id": "s", "direction": "output"},
        headers=auth(scopes=["streams:read", "streams:write"]),
    )
    assert_problem(r, 403, "forbidden")
    assert_problem(await client.get(stream_url(run_id, "s"), headers=auth()), 404, "not_found")


async def test_authorization_pins_readers_and_writers(client, auth, run_id):
    await create(client, auth(), run_id, authorization={"readers": ["alice"], "writers": ["bob"]})
    alice, bob = auth(sub="alice"), auth(sub="bob")
    assert_problem(await append(client, alice, run_id, [1]), 403, "forbidden")
    assert (await append(client, bob, run_id, [1])).status_code == 201
    assert_problem(
        await client.get(stream_url(run_id, "s", "/records"), headers=bob), 403, "forbidden"
    )
    r = await client.get(stream_url(run_id, "s", "/records"), headers=alice)
    assert [rec["payload"] for rec in r.json()["records"]] == [1]


async def test_egress_region_is_checked_on_reads_not_on_metadata(client, auth, run_id):
    await create(client, auth(), run_id)
    await append(client, auth(), run_id, [1])
    abroad = auth(region="eu-west1")
    assert_problem(
        await client.get(stream_url(run_id, "s", "/records"), headers=abroad), 403, "egress_denied"
    )
    assert (await client.get(stream_url(run_id, "s"), headers=abroad)).status_code == 200
    home = auth(region="local")
    assert (await client.get(stream_url(run_id, "s", "/records"), headers=home)).status_code == 200
