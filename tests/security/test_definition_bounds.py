"""Every number of a definition has an upper bound the store can hold and compute with
(docs/decisions.md, "Definitions"): past it (or below its minimum) create answers 422
``invalid_definition`` naming the field and creates nothing. A stream whose stored row
already holds a larger number (made before the bounds, here written with SQL) is read
within the bounds: it can be read, appended to, and pruned."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from litestar.testing import AsyncTestClient

from ductor_streams.foundation.definitions import (
    MAX_AGE_SECONDS,
    MAX_BLOCK_TIMEOUT_MS,
    MAX_CONSUMERS,
    MAX_COUNT,
    MAX_PRINCIPALS,
    MAX_REDACTION_POINTERS,
    MAX_REGIONS,
    parse_definition,
)
from ductor_streams.maintenance.retention import prune_stream
from ductor_streams.store import Store, StreamKey
from tests.conftest import API, TokenFactory

# (section, field, largest allowed value, smallest allowed value)
FIELDS = [
    ("credit", "max_unread_items", MAX_COUNT, 0),
    ("credit", "max_unread_bytes", MAX_COUNT, 0),
    ("credit", "max_total_items", MAX_COUNT, 0),
    ("credit", "max_total_bytes", MAX_COUNT, 0),
    ("credit", "block_timeout_ms", MAX_BLOCK_TIMEOUT_MS, 0),
    ("retention", "max_age_seconds", MAX_AGE_SECONDS, 1),
    ("retention", "max_records", MAX_COUNT, 1),
]
FIELD_IDS = [f"{section}.{name}" for section, name, _, _ in FIELDS]


def test_the_documented_bounds() -> None:
    assert MAX_COUNT == 2**53
    assert MAX_AGE_SECONDS == 3_153_600_000  # 100 years of 365 days
    assert MAX_BLOCK_TIMEOUT_MS == 300_000


async def _streams_of(pool: asyncpg.Pool, tenant: str, run_id: str) -> int:
    count: int = await pool.fetchval(
        "SELECT count(*) FROM workflow_streams.streams WHERE tenant = $1 AND run_id = $2",
        tenant,
        run_id,
    )
    return count


@pytest.mark.parametrize(("section", "name", "largest", "smallest"), FIELDS, ids=FIELD_IDS)
async def test_numbers_out_of_bounds_are_refused_and_create_nothing(
    client: AsyncTestClient[Any],
    auth: TokenFactory,
    pool: asyncpg.Pool,
    tenant: str,
    run_id: str,
    section: str,
    name: str,
    largest: int,
    smallest: int,
) -> None:
    for value in (2**70, 10**18, largest + 1, smallest - 1, -(2**70)):
        response = await client.post(
            f"{API}/runs/{run_id}/streams",
            json={"stream_id": "bounded", "direction": "output", section: {name: value}},
            headers=auth(),
        )
        assert response.status_code == 422, (value, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["code"] == "invalid_definition", problem
        assert f"{section}/{name}" in problem["detail"], problem
    assert await _streams_of(pool, tenant, run_id) == 0
    response = await client.get(f"{API}/runs/{run_id}/streams/bounded", headers=auth())
    assert response.status_code == 404 and response.json()["code"] == "not_found"


@pytest.mark.parametrize(("section", "name", "largest", "smallest"), FIELDS, ids=FIELD_IDS)
async def test_the_bounds_themselves_are_accepted(
    client: AsyncTestClient[Any],
    auth: TokenFactory,
    run_id: str,
    section: str,
    name: str,
    largest: int,
    smallest: int,
) -> None:
    for i, value in enumerate((largest, smallest)):
        stream_id = f"edge-{i}"
        response = await client.post(
            f"{API}/runs/{run_id}/streams",
            json={"stream_id": stream_id, "direction": "output", section: {name: value}},
            headers=auth(),
        )
        assert response.status_code == 201, (value, response.text)
        assert response.json()["definition"][section][name] == value
        response = await client.get(f"{API}/runs/{run_id}/streams/{stream_id}", headers=auth())
        assert response.status_code == 200, response.text
        assert response.json()["definition"][section][name] == value


# What a row made before the bounds may hold: far past every bound.
HUGE_CREDIT = {
    "max_unread_items": 2**70,
    "max_unread_bytes": 2**70,
    "max_total_items": 10**18,
    "max_total_bytes": 2**70,
}
HUGE_RETENTION = {"max_records": 2**70, "max_age_seconds": 10**18}


async def _stream_with_huge_numbers(
    store: Store, pool: asyncpg.Pool, tenant: str, run_id: str, stream_id: str
) -> int:
    """A stream (with a consumer, so that unread credit applies) whose stored definition
    holds numbers past the bounds, written with SQL as an older version could have.

    Made through the test's own Store, so that the app under test has not cached it."""
    definition = parse_definition(
        {"stream_id": stream_id, "direction": "output", "consumers": ["c1"]},
        region="local",
        object_store_regions=frozenset({"local"}),
    )
    ref, created = await store.create_stream(StreamKey(tenant, run_id, stream_id), definition)
    assert created
    stored = definition.to_json_dict()
    stored["credit"].update(HUGE_CREDIT)
    stored["retention"].update(HUGE_RETENTION)
    await pool.execute(
        "UPDATE workflow_streams.streams SET definition = $2::jsonb WHERE stream_pk = $1",
        ref.stream_pk,
        json.dumps(stored),
    )
    return ref.stream_pk


async def test_a_stored_definition_past_the_bounds_still_reads_appends_and_prunes(
    client: AsyncTestClient[Any],
    auth: TokenFactory,
    store: Store,
    pool: asyncpg.Pool,
    tenant: str,
    run_id: str,
) -> None:
    pk = await _stream_with_huge_numbers(store, pool, tenant, run_id, "old")
    base = f"{API}/runs/{run_id}/streams/old"

    # Reading the definition works; it shows the numbers as they are enforced.
    response = await client.get(base, headers=auth())
    assert response.status_code == 200, response.text
    definition = response.json()["definition"]
    assert definition["credit"]["max_unread_items"] == MAX_COUNT
    assert definition["credit"]["max_total_items"] == MAX_COUNT
    assert definition["retention"] == {"max_records": MAX_COUNT, "max_age_seconds": MAX_AGE_SECONDS}

    # Appends work, both ways the append function decides: a batch without an
    # idempotency key (appended whole) and one with a key (request by request).
    for i, extra in enumerate(({}, {"Idempotency-Key": "k-1"}, {})):
        response = await client.post(
            f"{base}/records",
            json={"records": [{"payload": {"i": i}}, {"payload": {"i": i, "j": 1}}]},
            headers={**auth(), **extra},
        )
        assert response.status_code == 201, response.text
        assert response.json() == {"first_sequence": 2 * i + 1, "last_sequence": 2 * i + 2}
    response = await client.get(f"{base}/records", params={"cursor": 0}, headers=auth())
    assert response.status_code == 200, response.text
    assert len(response.json()["records"]) == 6

    # Retention reads them within the bounds: nothing is old or many enough to go.
    assert await prune_stream(pool, pk) == (0, 0)


def test_stored_numbers_are_read_within_the_bounds_without_failing() -> None:
    from ductor_streams.foundation.definitions import definition_from_json

    stored = parse_definition(
        {"stream_id": "s", "direction": "output"},
        region="local",
        object_store_regions=frozenset(),
    ).to_json_dict()
    stored["credit"].update({**HUGE_CREDIT, "block_timeout_ms": 10**18})
    stored["retention"].update(HUGE_RETENTION)
    definition = definition_from_json(stored)
    assert definition.credit.max_unread_items == MAX_COUNT
    assert definition.credit.max_total_items == MAX_COUNT
    assert definition.credit.block_timeout_ms == MAX_BLOCK_TIMEOUT_MS
    assert definition.retention.max_records == MAX_COUNT
    assert definition.retention.max_age_seconds == MAX_AGE_SECONDS
    # Within the bounds, a stored definition is read as it is.
    assert (
        definition_from_json(
            parse_definition(
                {"stream_id": "s", "direction": "output"},
                region="local",
                object_store_regions=frozenset(),
            ).to_json_dict()
        ).credit.max_unread_items
        == 1000
    )


# Every list of a definition: (section or None, field, its bound, an item of it). A
# stored definition is read on every request that looks its stream up: a list of
# 300,001 readers (3.2 MB) made each of those parse megabytes.
LISTS = [
    (None, "consumers", MAX_CONSUMERS, None),
    ("redaction", "json_pointers", MAX_REDACTION_POINTERS, None),
    ("placement", "metadata_replicas", MAX_REGIONS, "local"),
    ("placement", "object_regions", MAX_REGIONS, "local"),
    ("placement", "client_egress_regions", MAX_REGIONS, "local"),
    ("authorization", "readers", MAX_PRINCIPALS, None),
    ("authorization", "writers", MAX_PRINCIPALS, None),
]
LIST_IDS = [f"{section}.{name}" if section else name for section, name, _, _ in LISTS]


def test_the_documented_list_bounds() -> None:
    assert (MAX_CONSUMERS, MAX_REDACTION_POINTERS, MAX_REGIONS, MAX_PRINCIPALS) == (
        64,
        100,
        64,
        1000,
    )


def _list_body(stream_id: str, section: str | None, name: str, items: list[str]) -> Any:
    body: dict[str, Any] = {"stream_id": stream_id, "direction": "output"}
    if section is None:
        body[name] = items
    else:
        body[section] = {name: items}
    return body


def _items(name: str, n: int, item: str | None) -> list[str]:
    if item is not None:
        return [item] * n
    if name == "json_pointers":
        return [f"/p{i}" for i in range(n)]
    return [f"c{i}" for i in range(n)]


@pytest.mark.parametrize(("section", "name", "bound", "item"), LISTS, ids=LIST_IDS)
async def test_lists_past_their_bound_are_refused_and_create_nothing(
    client: AsyncTestClient[Any],
    auth: TokenFactory,
    pool: asyncpg.Pool,
    tenant: str,
    run_id: str,
    section: str | None,
    name: str,
    bound: int,
    item: str | None,
) -> None:
    for n in (bound + 1, 300_001 if name == "readers" else bound * 10):
        response = await client.post(
            f"{API}/runs/{run_id}/streams",
            json=_list_body("listed", section, name, _items(name, n, item)),
            headers=auth(),
        )
        assert response.status_code == 422, (n, response.text[:300])
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["code"] == "invalid_definition", problem
        where = f"{section}/{name}" if section else name
        assert problem["detail"].startswith(f"{where}: List should have at most {bound} items")
    assert await _streams_of(pool, tenant, run_id) == 0
    # At the bound, the definition is taken and stored whole.
    response = await client.post(
        f"{API}/runs/{run_id}/streams",
        json=_list_body("listed", section, name, _items(name, bound, item)),
        headers=auth(),
    )
    assert response.status_code == 201, response.text[:300]
    stored = response.json()["definition"]
    assert len(stored[section][name] if section else stored[name]) == bound


async def test_a_stored_definition_with_a_longer_list_still_reads(
    client: AsyncTestClient[Any],
    auth: TokenFactory,
    store: Store,
    pool: asyncpg.Pool,
    tenant: str,
    run_id: str,
) -> None:
    """A stream made before the list bounds (here written with SQL) keeps working."""
    definition = parse_definition(
        {"stream_id": "wide", "direction": "output"},
        region="local",
        object_store_regions=frozenset({"local"}),
    )
    ref, created = await store.create_stream(StreamKey(tenant, run_id, "wide"), definition)
    assert created
    stored = definition.to_json_dict()
    stored["authorization"]["readers"] = [f"r{i}" for i in range(MAX_PRINCIPALS * 2)] + ["*"]
    await pool.execute(
        "UPDATE workflow_streams.streams SET definition = $2::jsonb WHERE stream_pk = $1",
        ref.stream_pk,
        json.dumps(stored),
    )
    response = await client.get(f"{API}/runs/{run_id}/streams/wide", headers=auth())
    assert response.status_code == 200, response.text[:300]
    assert len(response.json()["definition"]["authorization"]["readers"]) == MAX_PRINCIPALS * 2 + 1
