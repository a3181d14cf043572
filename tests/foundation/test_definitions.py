"""Definitions: defaults filled at every depth, immutability, validation."""

from __future__ import annotations

import pytest

from tests.foundation.helpers import assert_problem, stream_url

FULL_DEFAULTS = {
    "content_class": "json",
    "media_type": "application/json",
    "schema": None,
    "credit": {
        "max_unread_items": 1000,
        "max_unread_bytes": 16_777_216,
        "max_total_items": None,
        "max_total_bytes": None,
        "on_unread_full": "reject",
        "block_timeout_ms": 0,
    },
    "retention": {"max_age_seconds": None, "max_records": None},
    "redaction": {"json_pointers": []},
    "placement": {
        "metadata_home": "local",
        "metadata_replicas": [],
        "object_regions": ["local"],
        "client_egress_regions": ["local"],
        "log_region": "local",
    },
    "authorization": {"readers": ["*"], "writers": ["*"]},
}


async def test_minimal_definition_gets_every_default(client, auth, run_id):
    r = await client.post(
        stream_url(run_id), json={"stream_id": "out", "direction": "output"}, headers=auth()
    )
    assert r.status_code == 201
    body = r.json()
    assert body["definition"] == {
        "stream_id": "out",
        "direction": "output",
        "consumers": [],
        **FULL_DEFAULTS,
    }
    assert body["state"] == {
        "latest_sequence": 0,
        "earliest_sequence": 1,
        "closed": False,
        "legal_hold": False,
        "legal_hold_reason": None,
        "total_items": 0,
        "total_bytes": 0,
        "unread_items": 0,
        "unread_bytes": 0,
        "consumers": [],
    }


async def test_input_streams_always_have_the_workflow_consumer(client, auth, run_id):
    r = await client.post(
        stream_url(run_id),
        json={"stream_id": "in", "direction": "input", "consumers": ["ui"]},
        headers=auth(),
    )
    assert r.json()["definition"]["consumers"] == ["workflow", "ui"]
    assert r.json()["state"]["consumers"] == [
        {"consumer_id": "ui", "acked_sequence": 0},
        {"consumer_id": "workflow", "acked_sequence": 0},
    ]


async def test_partial_nested_objects_are_filled(client, auth, run_id):
    body = {
        "stream_id": "s",
        "direction": "output",
        "credit": {"max_total_items": 5},
        "retention": {"max_records": 10},
    }
    r = await client.post(stream_url(run_id), json=body, headers=auth())
    d = r.json()["definition"]
    assert d["credit"] == {**FULL_DEFAULTS["credit"], "max_total_items": 5}
    assert d["retention"] == {"max_age_seconds": None, "max_records": 10}


async def test_identical_create_is_200_with_stored_definition(client, auth, run_id):
    h = auth()
    body = {"stream_id": "s", "direction": "output", "credit": {"max_total_items": 5}}
    first = await client.post(stream_url(run_id), json=body, headers=h)
    again = await client.post(stream_url(run_id), json=body, headers=h)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["definition"] == first.json()["definition"]
    # Spelling out a default is the same definition.
    explicit = {**body, "content_class": "json"}
    assert (await client.post(stream_url(run_id), json=explicit, headers=h)).status_code == 200


async def test_any_difference_is_409_and_changes_nothing(client, auth, run_id):
    h = auth()
    body = {"stream_id": "s", "direction": "output"}
    await client.post(stream_url(run_id), json=body, headers=h)
    for other in [
        {**body, "direction": "input"},
        {**body, "credit": {"max_total_items": 1}},
        {**body, "redaction": {"json_pointers": ["/a"]}},
    ]:
        assert_problem(
            await client.post(stream_url(run_id), json=other, headers=h), 409, "definition_conflict"
        )
    d = (await client.get(stream_url(run_id, "s"), headers=h)).json()["definition"]
    assert d["direction"] == "output" and d["credit"]["max_total_items"] is None


async def test_concurrent_identical_creates_make_one_stream(client, auth, run_id):
    import asyncio

    h = auth()
    body = {"stream_id": "s", "direction": "input", "consumers": ["a", "b"]}
    rs = await asyncio.gather(
        *(client.post(stream_url(run_id), json=body, headers=h) for _ in range(10))
    )
    assert sorted(r.status_code for r in rs) == [200] * 9 + [201]


@pytest.mark.parametrize(
    "body",
    [
        {"direction": "output"},
        {"stream_id": "s"},
        {"stream_id": "S-upper", "direction": "output"},
        {"stream_id": "-lead", "direction": "output"},
        {"stream_id": "a" * 129, "direction": "output"},
        {"stream_id": "s", "direction": "sideways"},
        {"stream_id": "s", "direction": "output", "colour": "red"},
        {"stream_id": "s", "direction": "output", "credit": {"max_unread_itemz": 1}},
        {"stream_id": "s", "direction": "output", "placement": {"bogus": []}},
        {"stream_id": "s", "direction": "output", "credit": {"max_unread_items": -1}},
        {"stream_id": "s", "direction": "output", "credit": {"max_unread_items": "5"}},
        {"stream_id": "s", "direction": "output", "credit": {"on_unread_full": "drop"}},
        {"stream_id": "s", "direction": "output", "content_class": "poetry"},
        {"stream_id": "s", "direction": "output", "redaction": {"json_pointers": ["no-slash"]}},
        {"stream_id": 5, "direction": "output"},
        [],
        "s",
    ],
)
async def test_invalid_definitions_are_422(client, auth, run_id, body):
    h = auth()
    assert_problem(
        await client.post(stream_url(run_id), json=body, headers=h), 422, "invalid_definition"
    )


async def test_malformed_json_is_a_4xx_problem(client, auth, run_id):
    r = await client.post(stream_url(run_id), content=b"{nope", headers=auth())
    assert_problem(r, 400, "invalid_body")


async def test_raw_model_reasoning_is_forbidden(client, auth, run_id):
    body = {"stream_id": "s", "direction": "output", "content_class": "raw_model_reasoning"}
    assert_problem(
        await client.post(stream_url(run_id), json=body, headers=auth()),
        422,
        "content_class_forbidden",
    )
    assert_problem(await client.get(stream_url(run_id, "s"), headers=auth()), 404, "not_found")


@pytest.mark.parametrize(
    "cls", ["json", "text", "tool_io", "model_output", "model_reasoning_summary", "event"]
)
async def test_allowed_content_classes(client, auth, run_id, cls):
    body = {"stream_id": "s", "direction": "output", "content_class": cls}
    r = await client.post(stream_url(run_id), json=body, headers=auth())
    assert r.status_code == 201 and r.json()["definition"]["content_class"] == cls


@pytest.mark.parametrize(
    "placement",
    [{"metadata_home": "us-east1"}, {"object_regions": ["eu-west1"]}],
)
async def test_placement_this_deployment_cannot_serve_is_422(client, auth, run_id, placement):
    body = {"stream_id": "s", "direction": "output", "placement": placement}
    assert_problem(
        await client.post(stream_url(run_id), json=body, headers=auth()), 422, "placement_mismatch"
    )
