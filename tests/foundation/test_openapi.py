"""The OpenAPI document describes the API exactly: its paths and nothing else, every
status each operation can answer (problems with the Problem schema), no token on the
health routes; 405 names the allowed methods; an integral float is an integer."""

from __future__ import annotations

from typing import Any

import pytest

from ductor_streams.http.routes.openapi import OPERATIONS
from ductor_streams.names import API_MOUNT
from tests.foundation.helpers import append, assert_problem, create, stream_url

PROBLEM_REF = "#/components/schemas/Problem"


@pytest.fixture
async def document(client: Any) -> dict[str, Any]:
    r = await client.get("/schema/openapi.json")
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    return body


async def test_the_document_has_the_api_and_health_routes_only(document):
    documented = {
        (method, path)
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "post", "put", "delete", "patch")
    }
    expected = {(m, API_MOUNT + p) for m, p in OPERATIONS} | {
        ("get", "/healthz"),
        ("get", "/readyz"),
    }
    assert documented == expected


async def test_every_operation_names_its_problems_and_health_needs_no_token(document):
    ids = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            ids.append(operation["operationId"])
            responses = operation["responses"]
            assert any(s.startswith("2") for s in responses), (method, path)
            errors = {s: r for s, r in responses.items() if not s.startswith("2")}
            assert "431" in errors and "503" in errors, (method, path)
            for status, answer in errors.items():
                schema = answer["content"]["application/problem+json"]["schema"]
                assert schema == {"$ref": PROBLEM_REF}, (method, path, status)
            if path in ("/healthz", "/readyz"):
                assert operation["security"] == [], path
            else:
                assert "security" not in operation, path  # the document's bearer default
                assert {"401", "403"} <= set(errors), (method, path)
    assert len(ids) == len(set(ids))
    assert document["security"] == [{"bearer": []}]
    reads = document["paths"][API_MOUNT + "/runs/{run_id}/streams/{stream_id}/records"]["get"]
    assert "`cursor_in_future`" in reads["responses"]["400"]["description"]
    append_op = document["paths"][API_MOUNT + "/runs/{run_id}/streams/{stream_id}/records"]
    assert "`invalid_idempotency_key`" in append_op["post"]["responses"]["400"]["description"]
    # A problem body may carry members of its own (request_id among them).
    problem = document["components"]["schemas"]["Problem"]
    assert problem["additionalProperties"] is True and "request_id" in problem["properties"]


async def test_405_carries_allow_on_litestar_and_records_front_paths(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    for path, allowed in (
        (stream_url(run_id), {"GET", "POST"}),
        (stream_url(run_id, "s"), {"GET"}),
        (stream_url(run_id, "s", "/records"), {"GET", "POST"}),
        (stream_url(run_id, "s", "/close"), {"POST"}),
    ):
        r = await client.request("TRACE", path, headers=h)
        body = assert_problem(r, 405, "method_not_allowed")
        assert body["status"] == 405
        methods = {m.strip() for m in r.headers["allow"].split(",")}
        assert allowed <= methods <= allowed | {"OPTIONS", "HEAD"}, (path, r.headers["allow"])


async def test_an_integral_float_is_the_integer_it_spells(client, auth, run_id):
    h = auth()
    made = await create(
        client, h, run_id, consumers=["c"], credit={"max_total_items": 5.0, "block_timeout_ms": 0e0}
    )
    assert made["definition"]["credit"]["max_total_items"] == 5
    assert made["definition"]["credit"]["block_timeout_ms"] == 0
    assert isinstance(made["definition"]["credit"]["max_total_items"], int)
    await append(client, h, run_id, [1.0, 2])
    acked = await client.post(
        stream_url(run_id, "s", "/consumers/c/ack"), json={"sequence": 2.0}, headers=h
    )
    assert acked.status_code == 200, acked.text
    assert acked.json() == {"consumer_id": "c", "acked_sequence": 2}
    # Payloads are stored as sent: 1.0 stays 1.0.
    read = await client.get(stream_url(run_id, "s", "/records"), headers=h)
    assert [r["payload"] for r in read.json()["records"]] == [1.0, 2]


async def test_a_float_with_a_fraction_is_refused_where_an_integer_goes(client, auth, run_id):
    h = auth()
    r = await client.post(
        stream_url(run_id),
        json={"stream_id": "s", "direction": "output", "credit": {"max_total_items": 5.5}},
        headers=h,
    )
    assert_problem(r, 422, "invalid_definition")
    await create(client, h, run_id, consumers=["c"])
    await append(client, h, run_id, [1, 2])
    for sequence in (1.5, "1", True):
        r = await client.post(
            stream_url(run_id, "s", "/consumers/c/ack"), json={"sequence": sequence}, headers=h
        )
        assert_problem(r, 400, "invalid_body")
    # Query parameters are text: a cursor is digits only.
    r = await client.get(stream_url(run_id, "s", "/records?cursor=1.0"), headers=h)
    assert_problem(r, 400, "invalid_cursor")


async def test_the_definition_schema_names_the_regions_this_deployment_serves(
    document, client, auth, run_id
):
    """A definition the document calls valid is never refused for its placement: the
    metadata home is this deployment's region, object regions those with a store."""
    placement = document["components"]["schemas"]["Placement"]["properties"]
    assert placement["metadata_home"]["anyOf"][0]["enum"] == ["local"]
    assert placement["object_regions"]["anyOf"][0]["items"]["enum"] == ["local"]
    r = await client.post(
        f"{API_MOUNT}/runs/{run_id}/streams",
        json={"stream_id": "s", "direction": "output", "placement": {"object_regions": ["mars"]}},
        headers=auth(),
    )
    assert_problem(r, 422, "placement_mismatch")
