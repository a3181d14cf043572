"""Claims of a stream a wake named (``delivery_claim_stream``): they take only
those streams' heads, keep order exactly as a claim of every stream does, and the
dispatcher uses them for wakes that name streams, looking at every stream whenever
something else may be due."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from ductor_streams.delivery import Dispatcher, DispatcherConfig, outbox
from ductor_streams.delivery.dispatcher import NAMED_CLAIMS_AT_MOST
from ductor_streams.schema import QUERIES
from ductor_streams.store import Store, StreamRef
from tests.temporal.polling import eventually
from tests.temporal.support import append_inputs, settled
from tests.temporal.test_dispatcher import (
    PATIENT,
    RecordingWaitService,
    input_stream,
    one_stream,
    running,
    states,
)


async def _claim(
    pool: asyncpg.Pool,
    tenant: str,
    stream: int | None,
    *,
    owner: str = "named",
    max_streams: int = 10,
    per_stream: int = 10,
) -> dict[int, list[int]]:
    claimed = await outbox.claim(
        pool,
        owner=owner,
        tenant=tenant,
        lease_seconds=30,
        max_streams=max_streams,
        per_stream=per_stream,
        stream=stream,
    )
    return {pk: [d.event.sequence for d in ds] for pk, ds in claimed.items()}


async def test_a_named_claim_takes_the_named_streams_heads_only(
    store: Store, pool: asyncpg.Pool
) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    a, b, c = [await input_stream(store, tenant, f"run-{name}") for name in "abc"]
    other = await input_stream(store, f"{tenant}-other", "run-a")
    for ref in (a, b, c, other):
        await append_inputs(store, ref, [1, 2])
    # Another tenant's stream, named, is not this tenant's to claim.
    assert await _claim(pool, tenant, other.stream_pk) == {}
    assert await _claim(pool, tenant, a.stream_pk) == {a.stream_pk: [1, 2]}
    # Leased now: named again, it is not claimed twice.
    assert await _claim(pool, tenant, a.stream_pk) == {}
    assert await _claim(pool, tenant, b.stream_pk) == {b.stream_pk: [1, 2]}
    assert await _claim(pool, tenant, None) == {c.stream_pk: [1, 2]}


async def test_a_named_claim_never_passes_an_open_head(store: Store, pool: asyncpg.Pool) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-order")
    await append_inputs(store, ref, [1, 2, 3])
    # The head backs off: nothing behind it is claimable, named or not.
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET state = 'retrying',"
        " next_attempt_at = now() + interval '1 hour' WHERE stream_pk = $1 AND sequence = 1",
        ref.stream_pk,
    )
    assert await _claim(pool, tenant, ref.stream_pk) == {}
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET next_attempt_at = now()"
        " WHERE stream_pk = $1 AND sequence = 1",
        ref.stream_pk,
    )
    # A concurrent claim holds the head's row lock (its statement not yet committed):
    # the named claim skips the stream instead of taking sequence 2 behind it.
    async with pool.acquire() as holder:
        async with holder.transaction():
            await holder.execute(
                "SELECT 1 FROM workflow_streams.input_deliveries"
                " WHERE stream_pk = $1 AND sequence = 1 FOR UPDATE",
                ref.stream_pk,
            )
            assert await _claim(pool, tenant, ref.stream_pk) == {}
            assert await _claim(pool, tenant, None) == {}
    assert await _claim(pool, tenant, ref.stream_pk) == {ref.stream_pk: [1, 2, 3]}


async def test_concurrent_named_claims_lease_each_delivery_once(
    store: Store, pool: asyncpg.Pool
) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    refs = [await input_stream(store, tenant, f"run-{i}") for i in range(8)]
    for ref in refs:
        await append_inputs(store, ref, [1, 2, 3])
    pks = [ref.stream_pk for ref in refs]

    def claimer(owner: str, named: int | None) -> Awaitable[dict[int, list[int]]]:
        return _claim(pool, tenant, named, owner=owner, max_streams=3, per_stream=2)

    rounds = await asyncio.gather(
        *(claimer(f"o{i}-{pk}", pk) for i in range(3) for pk in pks),
        *(claimer(f"everywhere-{i}", None) for i in range(2)),
    )
    leased = [(pk, seq) for got in rounds for pk, seqs in got.items() for seq in seqs]
    # Every stream claimed once, its first two in order: no lease taken twice, no head
    # passed.
    assert sorted(leased) == sorted((pk, seq) for pk in pks for seq in (1, 2))
    assert all(seqs == [1, 2] for got in rounds for seqs in got.values())


async def test_the_dispatcher_claims_named_streams_on_their_wakes(
    store: Store, pool: asyncpg.Pool
) -> None:
    ref, wait, dispatcher = await one_stream(store, pool, "run-named")
    async with running(dispatcher):
        await settled(dispatcher)
        everywhere = dispatcher.claims_everywhere
        claims = dispatcher.claims
        for sequence in range(1, 6):
            await _one_record_delivered(store, pool, dispatcher, ref, sequence)
        assert dispatcher.claims - claims == 5
        assert dispatcher.claims_everywhere == everywhere  # each looked at its stream only
        # A wake that names nothing (a reconnect, a give-back) looks everywhere.
        dispatcher.notify()
        await eventually(
            _counter(dispatcher, everywhere=True), lambda n: n == everywhere + 1, what="it"
        )
    assert [c[2] for c in wait.calls] == [1, 2, 3, 4, 5]


async def test_the_due_time_of_a_claim_everywhere_holds_through_named_claims(
    store: Store, pool: asyncpg.Pool
) -> None:
    # A head backing off on stream a; records on stream b named meanwhile: a's retry
    # still goes out at its due time, not at the (30 s) idle poll.
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    a = await input_stream(store, tenant, "run-a")
    b = await input_stream(store, tenant, "run-b")
    await append_inputs(store, a, [1])
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET state = 'retrying',"
        " next_attempt_at = now() + interval '1.5 s' WHERE stream_pk = $1",
        a.stream_pk,
    )
    wait = RecordingWaitService()
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="one", config=PATIENT)
    async with running(dispatcher):
        await settled(dispatcher)
        for sequence in (1, 2, 3):
            await _one_record_delivered(store, pool, dispatcher, b, sequence)
        await eventually(lambda: states(pool, [a]), lambda s: s == ["delivered"], timeout=10)
    assert sorted((c[0], c[2]) for c in wait.calls) == [
        ("run-a", 1),
        ("run-b", 1),
        ("run-b", 2),
        ("run-b", 3),
    ]


async def _one_record_delivered(
    store: Store, pool: asyncpg.Pool, dispatcher: Dispatcher, ref: StreamRef, sequence: int
) -> None:
    """Append record ``sequence`` alone, wake the dispatcher naming its stream, and wait
    until every record of the stream so far is delivered."""
    await append_inputs(store, ref, [sequence])
    dispatcher.notify(ref.stream_pk)
    await eventually(
        lambda: states(pool, [ref]),
        lambda s: s == ["delivered"] * sequence,
        timeout=3,
        what=f"record {sequence} delivered",
    )


def _counter(dispatcher: Dispatcher, *, everywhere: bool = False) -> Callable[[], Awaitable[int]]:
    async def count() -> int:
        return dispatcher.claims_everywhere if everywhere else dispatcher.claims

    return count


async def test_a_record_committed_behind_a_claim_in_flight_is_claimed_when_its_stream_ends(
    store: Store, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Record 2 commits and wakes while the claim that takes record 1 is in flight: the
    # claim named next finds the stream's head leased here, so the claim when the
    # stream ends must take record 2, not the idle poll (30 s).
    ref, wait, dispatcher = await one_stream(store, pool, "run-behind")
    original = outbox.claim
    appended: list[int] = []

    async def claim_then_append(*args: Any, **kwargs: Any) -> Any:
        claimed = await original(*args, **kwargs)
        if claimed and not appended:
            appended.append(2)
            await append_inputs(store, ref, [2])
            dispatcher.notify(ref.stream_pk)
        return claimed

    monkeypatch.setattr(outbox, "claim", claim_then_append)
    async with running(dispatcher):
        await settled(dispatcher)
        everywhere = dispatcher.claims_everywhere
        await append_inputs(store, ref, [1])
        dispatcher.notify(ref.stream_pk)
        await eventually(lambda: states(pool, [ref]), lambda s: s == ["delivered"] * 2, timeout=3)
    assert [c[2] for c in wait.calls] == [1, 2]
    assert dispatcher.claims_everywhere == everywhere


def test_a_named_claim_is_the_claim_of_every_stream_but_for_how_it_finds_heads() -> None:
    # Two statements so that each keeps a generic plan; what they lock, re-check and
    # lease must stay the same.
    everywhere = QUERIES["delivery_claim"].rpartition(" heads AS (")[2]
    named = QUERIES["delivery_claim_stream"].rpartition(" heads AS (")[2]
    # ... and for its last UPDATE naming the stream as well (one shard: docs/scale.md).
    assert named == everywhere.replace(
        "JOIN workflow_streams.open_delivery_heads l", "JOIN named_head l"
    ).replace(
        " WHERE d.delivery_id = batch.delivery_id\n",
        " WHERE d.delivery_id = batch.delivery_id AND d.stream_pk = $6\n",
    )
    assert "JOIN named_head l" in named


async def test_streams_named_together_are_claimed_one_by_one_as_slots_free(
    store: Store, pool: asyncpg.Pool
) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    refs = [await input_stream(store, tenant, f"run-{i}") for i in range(3)]
    wait = RecordingWaitService(delay=0.05)  # each stream holds the one slot a while
    config = DispatcherConfig(idle_poll=30.0, lease_seconds=5.0, per_stream=7, max_streams=1)
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="one", config=config)
    async with running(dispatcher):
        await settled(dispatcher)
        everywhere = dispatcher.claims_everywhere
        for ref in refs:
            await append_inputs(store, ref, [1, 2])
        for ref in refs:
            dispatcher.notify(ref.stream_pk)
        await eventually(
            lambda: states(pool, refs), lambda s: s == ["delivered"] * 6, timeout=5, what="all"
        )
        assert dispatcher.claims_everywhere == everywhere
    assert sorted((c[0], c[2]) for c in wait.calls) == [
        (f"run-{i}", seq) for i in range(3) for seq in (1, 2)
    ]


async def test_more_streams_named_at_once_than_named_claims_take_are_claimed_together(
    store: Store, pool: asyncpg.Pool
) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    count = NAMED_CLAIMS_AT_MOST + 1
    refs = [await input_stream(store, tenant, f"run-{i}") for i in range(count)]
    wait = RecordingWaitService()
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="one", config=PATIENT)
    async with running(dispatcher):
        await settled(dispatcher)
        claims, everywhere = dispatcher.claims, dispatcher.claims_everywhere
        for ref in refs:
            await append_inputs(store, ref, [1])
        for ref in refs:  # no await between: all named before the next round
            dispatcher.notify(ref.stream_pk)
        await eventually(
            lambda: states(pool, refs), lambda s: s == ["delivered"] * count, timeout=5
        )
        # One claim of every stream took them all, not one named claim each.
        assert (dispatcher.claims - claims, dispatcher.claims_everywhere - everywhere) == (1, 1)
