"""The wake an append statement's own commit sends (``workflow_streams.records_wake``),
for tests that wait for it: the records it appended as one record-carrying wake
(store/wake_format.py), or the plain ``r<pk>:<last>`` when they do not fit one."""

from __future__ import annotations

import asyncpg

from ductor_streams.store.read import read_page
from ductor_streams.store.wake_format import record_wake


async def commit_wake(pool: asyncpg.Pool, stream_pk: int, first: int, last: int) -> str:
    """The wake of a commit that appended records ``first..last`` of the stream, built
    from the records as stored (their payloads and ``appended_at``)."""
    page = await read_page(pool, stream_pk, first - 1, last - first + 1)
    assert [r.sequence for r in page.records] == list(range(first, last + 1))
    return record_wake(stream_pk, page.records) or f"r{stream_pk}:{last}"
