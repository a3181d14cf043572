"""A statement over STAGED_STATEMENT_BYTES sends its payloads with COPY into a temporary
table in its own transaction (store/append.py ``_fetch_staged``) instead of as one
argument. Staged statements must answer and store exactly as plain ones: the group and
several-stream tests run again with every statement staged, and a real large batch
takes the staged path and comes back byte for byte."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from ductor_streams.store import Store, encode_batch
from ductor_streams.store import append as append_module
from tests.speed import test_stream_groups as groups
from tests.speed.test_group_commit import stored_log
from tests.support.credit import make_stream


@pytest.fixture
def every_statement_staged(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Stage every statement, and count the staged ones."""
    monkeypatch.setattr(append_module, "STAGED_STATEMENT_BYTES", -1)
    staged: list[int] = []
    inner = append_module.Appender._fetch_staged

    async def counting(self: Any, batches: Any, query: str, *args: Any) -> Any:
        staged.append(sum(b.count for b in batches))
        return await inner(self, batches, query, *args)

    monkeypatch.setattr(append_module.Appender, "_fetch_staged", counting)
    return staged


async def test_staged_groups_answer_as_plain_ones(
    pool: asyncpg.Pool, every_statement_staged: list[int]
) -> None:
    await groups.test_each_stream_of_a_combined_transaction_answers_as_if_alone(pool)
    assert every_statement_staged


async def test_staged_records_come_back_exact(
    pool: asyncpg.Pool, every_statement_staged: list[int]
) -> None:
    await groups.test_records_travel_joined_and_come_back_exact(pool)
    assert every_statement_staged


async def test_a_staged_bad_group_does_not_fail_the_other_streams(
    pool: asyncpg.Pool, every_statement_staged: list[int]
) -> None:
    await groups.test_one_streams_bad_group_does_not_fail_the_other_streams(pool)
    assert every_statement_staged


async def test_a_large_batch_is_staged_and_replays(pool: asyncpg.Pool) -> None:
    store = Store(pool)
    ref = await make_stream(store)
    staged: list[int] = []
    inner = store.appender._fetch_staged

    async def counting(batches: Any, query: str, *args: Any) -> Any:
        staged.append(sum(b.count for b in batches))
        return await inner(batches, query, *args)

    store.appender._fetch_staged = counting  # type: ignore[method-assign]
    payloads = [{"n": n, "text": f"{n}-" + "é" * 30_000} for n in range(200)]  # ~12 MB
    batch = encode_batch(payloads, idempotency_key="big-1")
    assert sum(batch.sizes) > append_module.STAGED_STATEMENT_BYTES
    first = await store.append(ref, batch)
    again = await store.append(ref, encode_batch(payloads, idempotency_key="big-1"))
    small = await store.append(ref, encode_batch(["after"]))
    assert (first.first_sequence, first.last_sequence, first.replayed) == (1, 200, False)
    assert (again.first_sequence, again.last_sequence, again.replayed) == (1, 200, True)
    assert (small.first_sequence, small.last_sequence) == (201, 201)
    assert staged == [200, 200]  # the big batch and its replay; the small one went plain
    stored = await stored_log(pool, ref)
    assert [stored[n] for n in range(1, 201)] == batch.payloads
    assert stored[201] == '"after"'
