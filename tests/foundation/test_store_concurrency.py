"""Invariant 1 at the database: many processes' transactions racing on one stream row.

Each Store has its own Appender (its own group-commit queues), as separate server
replicas would, so their transactions really contend for the row lock."""

from __future__ import annotations

import asyncio

from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.store import Store, StreamKey, encode_batch


async def test_replicas_racing_on_one_row_get_gapless_sequences(pool, tenant, run_id):
    replicas = [Store(pool) for _ in range(4)]
    definition = parse_definition(
        {"stream_id": "s", "direction": "input"}, region="local", object_store_regions=frozenset()
    )
    key = StreamKey(tenant, run_id, "s")
    ref, created = await replicas[0].create_stream(key, definition)
    assert created
    got: list[tuple[int, int, int]] = []

    async def writer(w: int) -> None:
        store = replicas[w % len(replicas)]
        mine = await store.get_stream(key)
        for i in range(25):
            size = 1 + (i % 3)
            result = await store.append(mine, encode_batch([[w, i, j] for j in range(size)]))
            got.append((result.first_sequence, result.last_sequence, size))

    await asyncio.gather(*(writer(w) for w in range(16)))
    spans = sorted(got)
    expected_next = 1
    for first, last, size in spans:
        assert first == expected_next and last - first + 1 == size
        expected_next = last + 1
    total = sum(size for *_, size in spans)
    rows = await pool.fetch(
        "SELECT sequence FROM workflow_streams.records WHERE stream_pk = $1 ORDER BY 1",
        ref.stream_pk,
    )
    assert [r["sequence"] for r in rows] == list(range(1, total + 1))
    # Input streams: every record has exactly one delivery row, committed with it.
    deliveries = await pool.fetch(
        "SELECT sequence FROM workflow_streams.input_deliveries WHERE stream_pk = $1 ORDER BY 1",
        ref.stream_pk,
    )
    assert [r["sequence"] for r in deliveries] == list(range(1, total + 1))
