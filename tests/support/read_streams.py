"""A stream for the read tests: payloads that test JSON's corners (escapes, unicode,
big numbers, nesting, a large one), and appended_at times with and without a fraction,
which the texts Postgres writes must render as ``isoformat()`` does."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from ductor_streams.store import Store
from ductor_streams.store.models import StreamRef
from tests.support.credit import append, make_stream

PAYLOADS = [
    {"n": 1, "text": "hello"},
    "plain",
    'quote " backslash \\ newline \n tab \t',
    {"unicode": "h\u00e9llo \u2028 \u4e2d\u6587 \U0001f600", "nested": {"a": [1, 2.5, None]}},
    12345678901234567890,
    -0.5,
    True,
    None,
    [],
    {},
    {"big": "x" * 5000},
]

SET_AT = (
    "UPDATE workflow_streams.records SET appended_at = $3 WHERE stream_pk = $1 AND sequence = $2"
)


async def edge_stream(store: Store, pool: asyncpg.Pool, copies: int = 2) -> StreamRef:
    """PAYLOADS ``copies`` times, the first records' times with and without a fraction."""
    ref = await make_stream(store, max_unread_items=None)
    for _ in range(copies):
        await append(store, ref, PAYLOADS)
    # isoformat() leaves out a zero fraction and writes six digits otherwise.
    times = [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ]
    for sequence, at in enumerate(times, start=1):
        await pool.execute(SET_AT, ref.stream_pk, sequence, at)
    return ref
