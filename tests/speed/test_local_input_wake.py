"""An append of this process to an input stream wakes this process's dispatcher as soon
as it has committed (``Store.input_appended``), without the LISTEN round trip; the wake
through Postgres still goes for every other process."""

from __future__ import annotations

import asyncpg

from ductor_streams.live.hub import NotificationHub
from ductor_streams.process.dispatcher import DUE_WAKES, _InputWakes
from ductor_streams.store import Store, encode_batch
from ductor_streams.store.models import StreamRef
from tests.support.credit import make_stream
from tests.support.live import eventually


class _Dispatcher:
    def __init__(self) -> None:
        self.wakes = 0
        self.streams: list[int | None] = []  # the stream each wake named

    def notify(self, stream_pk: int | None = None, latest: int | None = None) -> None:
        self.wakes += 1
        self.streams.append(stream_pk)


async def test_a_committed_input_append_is_announced_once(pool: asyncpg.Pool) -> None:
    store = Store(pool)
    seen: list[StreamRef] = []
    store.input_appended = lambda ref, _last: seen.append(ref)
    inp = await make_stream(store, direction="input", max_unread_items=None)
    out = await make_stream(store, max_unread_items=None)
    await store.append(inp, encode_batch([1, 2], idempotency_key="k"))
    await store.append(out, encode_batch([1], idempotency_key=None))
    assert seen == [inp]
    # Its delivery rows are committed.
    rows = await pool.fetchval(
        "SELECT count(*) FROM workflow_streams.input_deliveries WHERE stream_pk = $1",
        inp.stream_pk,
    )
    assert rows == 2
    # A replay committed nothing new: nothing to announce.
    again = await store.append(inp, encode_batch([1, 2], idempotency_key="k"))
    assert again.replayed and len(seen) == 1
    await store.append(inp, encode_batch([3], idempotency_key=None))
    assert seen == [inp, inp]


async def test_the_dispatcher_takes_local_appends_of_its_tenant_only(pool: asyncpg.Pool) -> None:
    store = Store(pool)
    dispatcher = _Dispatcher()
    wakes = _InputWakes(pool, dispatcher, "tenant-a")  # type: ignore[arg-type]
    ours = await make_stream(store, tenant="tenant-a", direction="input", max_unread_items=None)
    theirs = await make_stream(store, tenant="tenant-b", direction="input", max_unread_items=None)
    wakes.local(theirs, 1)
    assert dispatcher.wakes == 0
    wakes.local(ours, 1)
    assert dispatcher.wakes == 1
    # The stream is known to be an input stream now: its wakes need no lookup.
    wakes(ours.stream_pk)
    assert dispatcher.wakes == 2
    # Each names its stream (the dispatcher defers a wake for a stream it is delivering).
    assert dispatcher.streams == [ours.stream_pk, ours.stream_pk]


async def test_the_listen_echo_of_a_local_append_wakes_nobody(pool: asyncpg.Pool) -> None:
    store = Store(pool)
    dispatcher = _Dispatcher()
    wakes = _InputWakes(pool, dispatcher, "tenant-a")  # type: ignore[arg-type]
    ref = await make_stream(store, tenant="tenant-a", direction="input", max_unread_items=None)
    seen: list[int] = []
    store.input_appended = lambda r, last: (seen.append(last), wakes.local(r, last))
    first = await store.append(ref, encode_batch([1, 2, 3], idempotency_key=None))
    assert seen == [3] and first.last_sequence == 3 and dispatcher.wakes == 1
    # Its wake comes back through LISTEN: the claim it would set off has run already.
    wakes(ref.stream_pk, 3)
    wakes(ref.stream_pk, 2)  # an older one (coalesced, or late)
    assert dispatcher.wakes == 1
    # Past what was announced here (another process's append): a claim.
    wakes(ref.stream_pk, 4)
    assert dispatcher.wakes == 2
    # A wake that names no sequence (a close, an operator's retry, a reconnect): a claim.
    wakes(ref.stream_pk, None)
    wakes(0, None)
    assert dispatcher.wakes == 4
    # The next local append raises the mark; its own echo is dropped again.
    await store.append(ref, encode_batch([4, 5], idempotency_key=None))
    assert seen == [3, 5] and dispatcher.wakes == 5
    wakes(ref.stream_pk, 5)
    assert dispatcher.wakes == 5
    # The LISTEN wake read before the local append's own answer: it claims, and the
    # local wake that follows has nothing left to announce.
    wakes(ref.stream_pk, 7)
    assert dispatcher.wakes == 6
    wakes.local(ref, 7)
    wakes.local(ref, 6)
    assert dispatcher.wakes == 6
    wakes.local(ref, 8)
    assert dispatcher.wakes == 7


async def drained(hub: NotificationHub, pool: asyncpg.Pool) -> None:
    """Wait until every wake sent so far has reached the session's hub: a marker sent
    now comes after them on its one connection."""
    marker = 987_654_321  # a close wake of a stream that does not exist
    heard: list[int] = []
    undo = hub.subscribe_any(lambda pk, _latest: heard.append(pk))
    try:
        await pool.execute("SELECT pg_notify('workflow_streams', $1)", f"c{marker}")
        await eventually(lambda: marker in heard, what="the marker wake")
    finally:
        undo()


async def test_an_ack_or_a_close_of_an_input_stream_sets_off_no_claim(
    pool: asyncpg.Pool, hub: NotificationHub
) -> None:
    # The workflow helper acks as it goes idle, about once per input record: a claim on
    # each ack would find nothing due, and cost a claim per record.
    store = Store(pool)  # no local wakes: every wake comes through LISTEN
    dispatcher = _Dispatcher()
    wakes = _InputWakes(pool, dispatcher, "tenant-a")
    await drained(hub, pool)  # no wake of an earlier test's stream comes in late
    undo = hub.subscribe_any(wakes, kinds=DUE_WAKES)
    try:
        ref = await make_stream(
            store, tenant="tenant-a", direction="input", consumers=["wf"], max_unread_items=None
        )
        await store.append(ref, encode_batch([1, 2], idempotency_key=None))
        await eventually(lambda: dispatcher.wakes == 1, what="the append's wake")
        await store.ack(ref, "wf", 2)
        await store.close(ref)
        # A wake sent after both: once it is heard, theirs were heard (one connection).
        await pool.execute("SELECT pg_notify('workflow_streams', 'd0')")
        await eventually(lambda: None in dispatcher.streams, what="the marker wake")
        assert dispatcher.streams == [ref.stream_pk, None]
    finally:
        undo()
