"""compat/asyncio_tasks.py: a coroutine started at once in the caller's turn, then driven as a
task would drive it (results, errors and cancellation), and the appender sending its
statement from the submitting request's turn of the loop."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable

import pytest
import uvloop

from ductor_streams.compat.asyncio_tasks import start_now
from ductor_streams.store import Store, encode_batch
from ductor_streams.store.encoding import EncodedBatch
from tests.support.credit import make_stream


async def test_runs_at_once_up_to_its_first_wait_then_finishes_as_a_task() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[int] = loop.create_future()
    steps: list[str] = []

    async def job() -> None:
        steps.append("started")
        steps.append(f"got {await gate}")
        await asyncio.sleep(0)  # a bare yield on the way
        steps.append("finished")

    task = start_now(job())
    assert steps == ["started"]  # before start_now returned, with no turn of the loop
    assert not task.done()
    gate.set_result(7)
    await task
    assert steps == ["started", "got 7", "finished"]


async def test_an_awaited_error_reaches_the_coroutine_and_an_escaping_one_the_future() -> None:
    loop = asyncio.get_running_loop()
    first: asyncio.Future[None] = loop.create_future()
    second: asyncio.Future[None] = loop.create_future()
    caught: list[str] = []

    async def job() -> None:
        try:
            await first
        except KeyError as exc:
            caught.append(repr(exc))
        await second

    task = start_now(job())
    first.set_exception(KeyError("handled inside"))
    await asyncio.sleep(0)
    second.set_exception(ValueError("escapes"))
    with pytest.raises(ValueError, match="escapes"):
        await task
    assert caught == ["KeyError('handled inside')"]


async def test_a_coroutine_that_never_waits_gives_a_done_future() -> None:
    async def quick() -> None:
        return None

    async def broken() -> None:
        raise RuntimeError("at once")

    done = start_now(quick())
    assert done.done() and done.result() is None
    failed = start_now(broken())
    assert failed.done()
    with pytest.raises(RuntimeError, match="at once"):
        await failed


CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("current", default="caller's")


async def test_it_runs_in_one_copy_of_the_callers_context_from_first_step_to_last() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def job() -> None:
        seen.append(CURRENT.get())  # the caller's value, copied
        token = CURRENT.set("job's")  # a span made current in the first step...
        await gate
        seen.append(CURRENT.get())  # ...is still current after the wait...
        CURRENT.reset(token)  # ...and resets in the context it was set in
        seen.append(CURRENT.get())

    CURRENT.set("at start")
    task = start_now(job())
    assert CURRENT.get() == "at start"  # what the first step set stays in its copy
    gate.set_result(None)
    await task  # a reset in another context would raise ValueError here
    assert seen == ["at start", "job's", "at start"]
    assert CURRENT.get() == "at start"


async def test_cancelling_while_it_waits_cancels_the_awaited_future_inside_the_coroutine() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def job() -> None:
        try:
            await gate
        except asyncio.CancelledError:
            seen.append("cancelled inside")
            raise

    task = start_now(job())
    await asyncio.sleep(0)  # the task now waits on the gate
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled inside"]
    assert gate.cancelled()
    assert task.cancelled()


async def test_cancelling_after_the_awaited_future_is_done_throws_into_the_coroutine() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[int] = loop.create_future()
    seen: list[str] = []

    async def job() -> None:
        try:
            await gate
            seen.append("resumed without the cancellation")
        except asyncio.CancelledError:
            seen.append("cancelled inside")
            raise

    task = start_now(job())
    await asyncio.sleep(0)
    gate.set_result(1)  # done, and the task not yet woken for it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled inside"]
    assert gate.result() == 1


async def test_a_future_cancelled_by_someone_else_is_seen_as_a_task_would_see_it() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def job() -> None:
        try:
            await gate
        except asyncio.CancelledError:
            seen.append("gate cancelled")
        seen.append("went on")

    task = start_now(job())
    gate.cancel()
    await task
    assert seen == ["gate cancelled", "went on"]
    assert not task.cancelled()


LoopFactory = Callable[[], asyncio.AbstractEventLoop]


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_the_same_on_both_event_loops(loop_factory: LoopFactory) -> None:
    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        values: list[int] = []
        gates = [loop.create_future() for _ in range(3)]

        async def job() -> None:
            for gate in gates:
                values.append(await gate)

        task = start_now(job())
        for i, gate in enumerate(gates):
            loop.call_soon(gate.set_result, i)
            await asyncio.sleep(0)
        await task
        return values

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        assert runner.run(scenario()) == [0, 1, 2]


async def test_the_appender_sends_its_statement_in_the_submitting_turn(store: Store) -> None:
    """The first statement goes out from the request's own turn of the loop, not after
    the tasks queued before it (with ``create_task`` it would not have started yet)."""
    ref = await make_stream(store)
    appender = store.appender
    before = appender.statements
    pending = asyncio.ensure_future(store.append(ref, encode_batch([{"n": 1}])))
    await asyncio.sleep(0)  # exactly one turn: the append's task ran up to its wait
    assert appender.statements == before + 1
    result = await pending
    assert (result.first_sequence, result.last_sequence) == (1, 1)


async def test_a_statement_that_fails_before_it_is_sent_answers_and_the_stream_goes_on(
    store: Store,
) -> None:
    """The whole statement ends in its first step (its arguments are refused): its
    request gets the error, and the stream queue and the count of statements in flight are
    left as they were, so the next append goes through."""
    ref = await make_stream(store)
    raw_separator = EncodedBatch(['"a\x1eb"'], [5], [None], None, "h")
    with pytest.raises(ValueError, match="separator"):
        await store.appender.append(ref.stream_pk, raw_separator)
    assert store.appender._in_flight == 0
    result = await store.append(ref, encode_batch([{"n": 1}]))
    assert (result.first_sequence, result.last_sequence) == (1, 1)
