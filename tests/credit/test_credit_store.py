"""Durable credit on the Store, against real Postgres (issue 4)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from ductor_streams.errors import (
    AckInFuture,
    AckRegression,
    ConsumerNotFound,
    CreditExhausted,
    QuotaExhausted,
    RecordTooLarge,
)
from ductor_streams.foundation import metrics
from ductor_streams.store import Store, credit_wait, encode_batch
from tests.support.credit import append, make_stream


async def test_32_concurrent_appenders_in_separate_transactions_admit_exactly_10(
    pool: asyncpg.Pool,
) -> None:
    # 32 Stores = 32 independent appenders: 32 transactions racing on the row lock.
    stores = [Store(pool) for _ in range(32)]
    ref = await make_stream(stores[0], max_unread_items=10)
    results = await asyncio.gather(
        *(append(s, ref, [{"n": i}]) for i, s in enumerate(stores)), return_exceptions=True
    )
    admitted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(admitted) == 10
    assert len(refused) == 22
    assert all(isinstance(r, CreditExhausted) for r in refused)
    assert sorted(r.first_sequence for r in admitted) == list(range(1, 11))
    state = await stores[0].state(ref)
    assert (state.latest_sequence, state.unread_items, state.total_items) == (10, 10, 10)


async def test_32_concurrent_appenders_in_one_group_admit_exactly_10(store: Store) -> None:
    ref = await make_stream(store, max_unread_items=10)
    results = await asyncio.gather(
        *(append(store, ref, [{"n": i}]) for i in range(32)), return_exceptions=True
    )
    # One process groups them, in arrival order: the first 10 fit, the rest do not.
    assert [r.first_sequence for r in results[:10]] == list(range(1, 11))  # type: ignore[union-attr]
    assert all(isinstance(r, CreditExhausted) for r in results[10:])
    assert (await store.state(ref)).latest_sequence == 10


async def test_concurrent_acks_never_move_backwards(pool: asyncpg.Pool) -> None:
    stores = [Store(pool) for _ in range(24)]
    ref = await make_stream(stores[0], consumers=["c"])
    await append(stores[0], ref, list(range(300)))
    seen: list[int] = []
    stop = asyncio.Event()

    async def observe() -> None:
        async with pool.acquire() as conn:
            while not stop.is_set():
                seen.append(
                    await conn.fetchval(
                        "SELECT acked_sequence FROM workflow_streams.consumers "
                        "WHERE stream_pk = $1 AND consumer_id = 'c'",
                        ref.stream_pk,
                    )
                )

    async def acker(i: int) -> list[tuple[int, int | str]]:
        # Each acker walks a different interleaving of 1..300, forwards and backwards.
        order = list(range(1, 301))[i % 7 :: 7]
        if i % 2:
            order.reverse()
        answers: list[tuple[int, int | str]] = []
        for sequence in order:
            try:
                answers.append((sequence, await stores[i].ack(ref, "c", sequence)))
            except AckRegression:
                answers.append((sequence, "regression"))
        return answers

    observer = asyncio.create_task(observe())
    answers = [a for batch in await asyncio.gather(*(acker(i) for i in range(24))) for a in batch]
    stop.set()
    await observer

    assert seen == sorted(seen), "an observer saw the ack move backwards"
    assert (await stores[0].state(ref)).consumers[0].acked_sequence == 300
    for sequence, answer in answers:
        # A successful ack answers exactly what was asked (acks are never lowered to it).
        assert answer == "regression" or answer == sequence
    assert {a for _, a in answers} >= {300}


def rechecks(outcome: str) -> float:
    """Looks at waiting requests' stream rows so far (store/credit_wait.py)."""
    value = metrics.REGISTRY.get_sample_value(
        "ductor_streams_credit_rechecks_total", {"outcome": outcome}
    )
    return value or 0.0


async def test_block_policy_append_completes_promptly_on_ack(
    hub_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No lost-wake re-check within the test: only the ack's notification can wake it.
    monkeypatch.setattr(credit_wait, "LOST_WAKE_RECHECK_SECONDS", 3600.0)
    ref = await make_stream(
        hub_store, max_unread_items=2, on_unread_full="block", block_timeout_ms=20_000
    )
    await append(hub_store, ref, ["a", "b"])
    waiting = asyncio.create_task(append(hub_store, ref, ["c"]))
    done, _ = await asyncio.wait({waiting}, timeout=0.3)
    assert not done, "the append should wait for credit"
    assert (await hub_store.state(ref)).latest_sequence == 2

    other = Store(hub_store.pool)  # the ack comes from another client
    sent_before = rechecks("sent")
    await other.ack(ref, "c", 1)
    result = await asyncio.wait_for(waiting, 60)
    assert (result.first_sequence, result.last_sequence) == (3, 3)
    # Woken by the ack's notification (the re-check is an hour away): one look, sent.
    assert rechecks("sent") - sent_before == 1


async def test_block_policy_without_ack_refuses_after_the_timeout(hub_store: Store) -> None:
    ref = await make_stream(
        hub_store, max_unread_items=1, on_unread_full="block", block_timeout_ms=400
    )
    await append(hub_store, ref, ["a"])
    refused_before = rechecks("still_refused")
    started = time.monotonic()
    with pytest.raises(CreditExhausted) as caught:
        await append(hub_store, ref, ["b"])
    # Not before its timeout; then one look at the row (the re-check is 1 s, the
    # timeout 0.4 s), still refused, and no other.
    assert time.monotonic() - started >= 0.4
    assert rechecks("still_refused") - refused_before == 1
    assert caught.value.retry_after >= 1
    assert (await hub_store.state(ref)).latest_sequence == 1


async def test_block_policy_does_not_wait_for_a_batch_that_can_never_fit(
    hub_store: Store,
) -> None:
    ref = await make_stream(
        hub_store, max_unread_items=3, on_unread_full="block", block_timeout_ms=20_000
    )
    looks_before = rechecks("still_refused") + rechecks("sent")
    with pytest.raises(CreditExhausted, match="split it"):
        await append(hub_store, ref, [1, 2, 3, 4])
    # Refused at once: it never waited for a wake nor looked at the row again.
    assert rechecks("still_refused") + rechecks("sent") == looks_before
    assert (await hub_store.state(ref)).latest_sequence == 0


async def test_block_policy_without_hub_polls(store: Store) -> None:
    ref = await make_stream(
        store, max_unread_items=1, on_unread_full="block", block_timeout_ms=20_000
    )
    await append(store, ref, ["a"])
    waiting = asyncio.create_task(append(store, ref, ["b"]))
    await store.ack(ref, "c", 1)
    assert (await asyncio.wait_for(waiting, 5)).first_sequence == 2


async def test_credit_is_the_minimum_over_two_consumers(store: Store) -> None:
    ref = await make_stream(store, consumers=["a", "b"], max_unread_items=3)
    await append(store, ref, [1, 2, 3])
    await store.ack(ref, "a", 3)
    with pytest.raises(CreditExhausted):
        await append(store, ref, [4])  # b has acknowledged nothing
    state = await store.state(ref)
    assert state.unread_items == 3
    assert [(c.consumer_id, c.acked_sequence) for c in state.consumers] == [("a", 3), ("b", 0)]

    await store.ack(ref, "b", 1)
    assert (await append(store, ref, [4])).first_sequence == 4
    with pytest.raises(CreditExhausted):
        await append(store, ref, [5])
    state = await store.state(ref)
    assert (state.unread_items, state.latest_sequence) == (3, 4)  # 4 - min(3, 1)

    await store.ack(ref, "b", 4)  # now a (3) is the minimum
    assert (await store.state(ref)).unread_items == 1
    result = await append(store, ref, [5, 6])
    assert (result.first_sequence, result.last_sequence) == (5, 6)
    with pytest.raises(CreditExhausted):
        await append(store, ref, [7])


async def test_unread_bytes_ceiling_is_reached_not_passed(store: Store) -> None:
    # Sizes are compact raw-UTF-8 JSON: 12345 -> 5 bytes, "é" -> 4 bytes.
    ref = await make_stream(store, max_unread_bytes=10, max_unread_items=None)
    await append(store, ref, [12345, 12345])  # exactly 10: reaching it is allowed
    with pytest.raises(CreditExhausted):
        await append(store, ref, [1])
    await store.ack(ref, "c", 1)  # frees 5 bytes
    state = await store.state(ref)
    assert (state.unread_bytes, state.total_bytes) == (5, 10)
    with pytest.raises(CreditExhausted):
        await append(store, ref, ["é", 12])  # 5 + 4 + 2 = 11: passes the ceiling
    assert (await append(store, ref, ["é", 1])).last_sequence == 4  # 5 + 4 + 1 = 10
    with pytest.raises(CreditExhausted):
        await append(store, ref, [0])
    state = await store.state(ref)
    assert (state.unread_bytes, state.unread_items, state.total_bytes) == (10, 3, 15)


async def test_total_ceilings_are_quota_and_acks_do_not_free_them(store: Store) -> None:
    ref = await make_stream(store, max_total_items=3, max_unread_items=10)
    await append(store, ref, [1, 2])
    with pytest.raises(QuotaExhausted):
        await append(store, ref, [3, 4])  # 4 > 3: the whole batch is refused
    assert (await append(store, ref, [3])).first_sequence == 3  # reaching it is allowed
    await store.ack(ref, "c", 3)
    with pytest.raises(QuotaExhausted):
        await append(store, ref, [4])
    state = await store.state(ref)
    assert (state.total_items, state.unread_items, state.latest_sequence) == (3, 0, 3)

    ref_b = await make_stream(store, max_total_bytes=6, max_unread_items=None)
    await append(store, ref_b, [123, 45])  # 5 bytes
    with pytest.raises(QuotaExhausted):
        await append(store, ref_b, [12])
    await append(store, ref_b, [1])  # 6 bytes: reached
    await store.ack(ref_b, "c", 3)
    with pytest.raises(QuotaExhausted):
        await append(store, ref_b, [1])
    assert (await store.state(ref_b)).total_bytes == 6


async def test_quota_is_checked_before_credit(store: Store) -> None:
    ref = await make_stream(store, max_total_items=2, max_unread_items=2)
    await append(store, ref, [1, 2])
    with pytest.raises(QuotaExhausted):  # both would refuse: the permanent one answers
        await append(store, ref, [3])


async def test_a_batch_that_does_not_fit_is_refused_whole(store: Store) -> None:
    ref = await make_stream(store, max_unread_items=5)
    await append(store, ref, [1, 2, 3])
    with pytest.raises(CreditExhausted):
        await append(store, ref, [4, 5, 6])
    assert (await store.state(ref)).latest_sequence == 3
    result = await append(store, ref, [4, 5])
    assert (result.first_sequence, result.last_sequence) == (4, 5)
    with pytest.raises(RecordTooLarge):
        encode_batch([1, "x" * 70_000])  # refused before anything reaches the store
    page = await store.read(ref, 0, 100)
    assert [r.payload for r in page.records] == ["1", "2", "3", "4", "5"]


async def test_a_stream_without_consumers_has_nothing_unread(store: Store) -> None:
    ref = await make_stream(store, consumers=[], max_unread_items=2, max_total_items=5)
    await append(store, ref, [1, 2, 3, 4])
    state = await store.state(ref)
    assert (state.unread_items, state.unread_bytes, state.consumers) == (0, 0, [])
    with pytest.raises(QuotaExhausted):
        await append(store, ref, [5, 6])


async def test_input_streams_have_the_workflow_consumer(store: Store) -> None:
    ref = await make_stream(store, direction="input", consumers=[], max_unread_items=1)
    await append(store, ref, ["hi"])
    with pytest.raises(CreditExhausted):
        await append(store, ref, ["again"])
    assert await store.ack(ref, "workflow", 1) == 1
    assert (await append(store, ref, ["again"])).first_sequence == 2


async def test_refused_appends_consume_no_sequence(store: Store) -> None:
    ref = await make_stream(store, max_unread_items=1)
    await append(store, ref, ["a"])
    for _ in range(3):
        with pytest.raises(CreditExhausted):
            await append(store, ref, ["b"])
    await store.ack(ref, "c", 1)
    assert (await append(store, ref, ["b"])).first_sequence == 2


async def test_ack_answers(store: Store) -> None:
    ref = await make_stream(store, consumers=["c"])
    await append(store, ref, [1, 2, 3])
    assert await store.ack(ref, "c", 2) == 2
    assert await store.ack(ref, "c", 2) == 2  # equal: no-op
    with pytest.raises(AckRegression):
        await store.ack(ref, "c", 1)
    with pytest.raises(AckInFuture):
        await store.ack(ref, "c", 4)
    with pytest.raises(ConsumerNotFound):
        await store.ack(ref, "nobody", 1)
    other = await make_stream(store, consumers=["elsewhere"])
    with pytest.raises(ConsumerNotFound):
        await store.ack(ref, "elsewhere", 1)
    state = await store.state(ref)
    assert [(c.consumer_id, c.acked_sequence) for c in state.consumers] == [("c", 2)]
    assert (await store.state(other)).consumers[0].acked_sequence == 0


async def test_ack_of_a_pruned_record_never_undercounts_unread_bytes(
    store: Store, pool: asyncpg.Pool
) -> None:
    ref = await make_stream(store, consumers=["a", "b", "d"], max_unread_items=None)
    await append(store, ref, [1, 22, 333, 4444, 55555, 666666])  # sizes 1..6, total 21
    # What retention does (maintenance's job): drop 1..4, move the boundary.
    await pool.execute(
        "DELETE FROM workflow_streams.records WHERE stream_pk = $1 AND sequence <= 4",
        ref.stream_pk,
    )
    await pool.execute(
        "UPDATE workflow_streams.streams SET earliest_sequence = 5, pruned_bytes = 10 "
        "WHERE stream_pk = $1",
        ref.stream_pk,
    )

    async def acked_bytes(consumer: str) -> int:
        value = await pool.fetchval(
            "SELECT acked_bytes FROM workflow_streams.consumers "
            "WHERE stream_pk = $1 AND consumer_id = $2",
            ref.stream_pk,
            consumer,
        )
        return int(value)

    await store.ack(ref, "a", 4)  # right below the first retained record: exact
    assert await acked_bytes("a") == 10
    await store.ack(ref, "b", 2)  # exact figure (3) is gone: keep the lower bound (0)
    assert await acked_bytes("b") == 0
    await store.ack(ref, "d", 5)  # retained: exact
    assert await acked_bytes("d") == 15
    state = await store.state(ref)
    assert (state.unread_items, state.unread_bytes) == (4, 21)  # min is b: 6 - 2, 21 - 0
    await store.ack(ref, "b", 4)
    state = await store.state(ref)
    assert (state.unread_items, state.unread_bytes) == (2, 11)
