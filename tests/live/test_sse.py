"""SSE subscribe against a real server subprocess, read with httpx-sse, on real Postgres."""

from __future__ import annotations

import asyncio
import json
import random
import re

import httpx
import pytest

from tests.support.live import (
    Collected,
    append,
    close,
    collect_sse,
    create_stream,
    eventually,
    listen_backends,
    stream_pk,
    stream_url,
)

# An SSE test that hangs (a response that never ends) fails here, well before the
# suite's 300 s: the slowest of these takes a few seconds.
pytestmark = pytest.mark.timeout(60)


async def fed_batches(c: httpx.AsyncClient) -> float:
    """The server's ``ductor_streams_live_fed_batches_total`` from /metrics."""
    text = (await c.get("/metrics")).text
    return float(re.search(r"^ductor_streams_live_fed_batches_total (\S+)$", text, re.M)[1])  # type: ignore[index]


async def test_backfill_then_live_exactly_once_then_resume(server, auth, run_id):
    h = auth()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "out", h)
        await append(c, run_id, "out", [{"n": i} for i in range(1, 51)], h)
        got = Collected()
        task = asyncio.create_task(
            collect_sse(
                server.url,
                stream_url(run_id, "out") + "/subscribe",
                h,
                params={"cursor": 10},
                until=100,
                into=got,
            )
        )
        await eventually(lambda: len(got.sequences) >= 40, what="the backfill")
        fed_before = await fed_batches(c)
        for i in range(51, 101):  # live, one request each
            await append(c, run_id, "out", [{"n": i}], h)
        await asyncio.wait_for(task, 30)
        # The server's own appends reached its subscriber without a read...
        assert await fed_batches(c) > fed_before
        # ...and look exactly as read records do (appended_at included).
        page = await c.get(stream_url(run_id, "out") + "/records?cursor=10&limit=90", headers=h)
        assert got.records == page.json()["records"]
    assert got.sequences == list(range(11, 101))
    assert got.ids == [str(s) for s in range(11, 101)]
    assert [r["payload"] for r in got.records] == [{"n": i} for i in range(11, 101)]
    first = got.records[0]
    assert set(first) == {"sequence", "payload", "size", "appended_at", "object", "fingerprint"}
    assert first["size"] == len(b'{"n":11}') and first["object"] is None

    # Resume: Last-Event-ID wins over ?cursor=.
    again = await collect_sse(
        server.url,
        stream_url(run_id, "out") + "/subscribe",
        {**h, "Last-Event-ID": "60"},
        params={"cursor": 5},
        until=100,
    )
    assert again.sequences == list(range(61, 101))


async def test_close_sends_end_with_last_sequence_and_ends_the_response(server, auth, run_id):
    h = auth()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "out", h)
        got = Collected()
        task = asyncio.create_task(
            collect_sse(server.url, stream_url(run_id, "out") + "/subscribe", h, into=got)
        )
        await asyncio.wait_for(got.connected.wait(), 10)
        await append(c, run_id, "out", [1, 2, 3], h)
        await append(c, run_id, "out", [4, 5], h)
        assert await close(c, run_id, "out", h) == 5
        done = await asyncio.wait_for(task, 30)  # returns only because the response ended
    assert done.sequences == [1, 2, 3, 4, 5]
    assert done.end == {"last_sequence": 5}
    # After close: a caught-up subscriber gets the end at once; another gets the rest first.
    caught_up = await collect_sse(
        server.url, stream_url(run_id, "out") + "/subscribe", h, params={"cursor": 5}
    )
    assert caught_up.sequences == [] and caught_up.end == {"last_sequence": 5}
    behind = await collect_sse(
        server.url, stream_url(run_id, "out") + "/subscribe", {**h, "Last-Event-ID": "2"}
    )
    assert behind.sequences == [3, 4, 5] and behind.end == {"last_sequence": 5}


async def test_cursor_problems_are_answered_before_the_stream_starts(
    server, auth, run_id, pool, tenant
):
    h = auth()
    url = stream_url(run_id, "out") + "/subscribe"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "out", h)
        await append(c, run_id, "out", list(range(10)), h)
        cases = [
            ({"cursor": "11"}, {}, 400, "cursor_in_future"),
            ({"cursor": "-1"}, {}, 400, "invalid_cursor"),
            ({"cursor": "abc"}, {}, 400, "invalid_cursor"),
            ({"cursor": "3"}, {"Last-Event-ID": "x"}, 400, "invalid_cursor"),
            ({"cursor": "3"}, {"Last-Event-ID": ""}, 400, "invalid_cursor"),
            ({}, {"Last-Event-ID": "99"}, 400, "cursor_in_future"),
        ]
        for params, extra, status, code in cases:
            r = await c.get(url, params=params, headers={**h, **extra})
            assert (r.status_code, r.json()["code"]) == (status, code), (params, extra)
            assert r.headers["content-type"].startswith("application/problem+json")
        r = await c.get(stream_url(run_id, "nope") + "/subscribe", headers=h)
        assert (r.status_code, r.json()["code"]) == (404, "not_found")
        r = await c.get(url, headers=auth(scopes=["streams:write"]))
        assert (r.status_code, r.json()["code"]) == (403, "forbidden")
        r = await c.get(url, headers=auth(region="elsewhere"))
        assert (r.status_code, r.json()["code"]) == (403, "egress_denied")

        # Retention removed 1..4 (simulated in SQL): a cursor below 4 is 410 with the bounds.
        pk = await stream_pk(pool, tenant, run_id, "out")
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "DELETE FROM workflow_streams.records WHERE stream_pk = $1 AND sequence < 5", pk
            )
            await conn.execute(
                "UPDATE workflow_streams.streams SET earliest_sequence = 5 WHERE stream_pk = $1",
                pk,
            )
        r = await c.get(url, params={"cursor": "2"}, headers=h)
        assert r.status_code == 410
        body = r.json()
        assert body["code"] == "cursor_expired"
        assert (body["requested_sequence"], body["earliest_sequence"], body["latest_sequence"]) == (
            3,
            5,
            10,
        )
        assert body["resync_reason"] == "retention"
    got = await collect_sse(server.url, url, h, params={"cursor": 4}, until=10)
    assert got.sequences == [5, 6, 7, 8, 9, 10]


async def test_retention_overtaking_a_subscriber_sends_error_then_ends(
    server, auth, run_id, pool, tenant
):
    h = auth()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "out", h)
        await append(c, run_id, "out", [1, 2, 3, 4, 5], h)
        got = Collected()
        task = asyncio.create_task(
            collect_sse(server.url, stream_url(run_id, "out") + "/subscribe", h, into=got)
        )
        await eventually(lambda: got.sequences == [1, 2, 3, 4, 5], what="the backfill")
        pk = await stream_pk(pool, tenant, run_id, "out")
        # In ONE transaction: 6..10 are appended and 6..8 pruned before anyone could see
        # them, so the subscriber (at 5) is overtaken by retention. The append's own wake
        # would carry 6..10 (records_wake), records this transaction then removes: it
        # asks for none (p_notify false) and announces the commit with a plain wake.
        async with pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT * FROM workflow_streams.append_requests($1, $2::integer[], $3::text[],"
                " $4::text[], $5::text[], $6::integer[], $7::jsonb[], false, NULL)",
                pk,
                [5],
                [None],
                [None],
                ["6", "7", "8", "9", "10"],
                [1, 1, 1, 1, 2],
                [None] * 5,
            )
            assert rows[0]["outcome"] == "appended" and rows[0]["last_sequence"] == 10
            await conn.execute(
                "DELETE FROM workflow_streams.records WHERE stream_pk = $1 AND sequence < 9", pk
            )
            await conn.execute(
                "UPDATE workflow_streams.streams SET earliest_sequence = 9 WHERE stream_pk = $1",
                pk,
            )
            await conn.execute("SELECT pg_notify('workflow_streams', $1)", f"r{pk}:10")
        done = await asyncio.wait_for(task, 30)  # the response ended after the error
    assert done.sequences == [1, 2, 3, 4, 5]
    assert done.error is not None and done.end is None
    assert done.error["code"] == "cursor_expired" and done.error["status"] == 410
    assert (
        done.error["requested_sequence"],
        done.error["earliest_sequence"],
        done.error["latest_sequence"],
        done.error["resync_reason"],
    ) == (6, 9, 10, "retention")


async def test_race_20_subscribers_join_at_random_moments_during_500_appends(server, auth, run_id):
    """Each receives exactly cursor+1..500 in order, however its start races the appends."""
    h = auth()
    total = 500
    rng = random.Random(20261130)
    latest = 0
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "race", h)

        async def producer() -> None:
            nonlocal latest
            while latest < total:
                n = min(rng.choice([1, 1, 1, 2, 3]), total - latest)
                _, latest = await append(
                    c, run_id, "race", list(range(latest + 1, latest + n + 1)), h
                )

        joined: dict[int, tuple[int, Collected]] = {}  # the unfinished: id(got) -> (cursor, got)

        async def subscriber(delay_steps: int) -> tuple[int, Collected]:
            # Join once the producer has reached a random point; pick a random cursor.
            await eventually(lambda: latest >= delay_steps, what="the producer")
            cursor = rng.randint(0, latest)
            got = Collected()
            joined[id(got)] = (cursor, got)
            await collect_sse(
                server.url,
                stream_url(run_id, "race") + "/subscribe",
                h,
                params={"cursor": cursor},
                until=total,
                into=got,
            )
            del joined[id(got)]
            return cursor, got

        async def produce_then_close() -> None:
            await producer()
            # Closed once everything is appended: a subscriber that joins at the end
            # (cursor 500, nothing to receive) gets `end` instead of waiting forever.
            await close(c, run_id, "race", h)

        producing = asyncio.create_task(produce_then_close())
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(subscriber(rng.randint(0, total - 1)) for _ in range(20))), 45
            )
        except TimeoutError:
            # Say which subscribers stalled and where, rather than only that one did.
            stalled = [
                (cursor, len(got.sequences), got.sequences[-1:], got.end, got.error)
                for cursor, got in joined.values()
            ]
            raise AssertionError(
                f"producer at {latest}; subscribers unfinished (cursor, received, last,"
                f" end, error): {stalled}"
            ) from None
        await producing
    for cursor, got in results:
        assert got.sequences == list(range(cursor + 1, total + 1)), cursor
        assert [r["payload"] for r in got.records] == list(range(cursor + 1, total + 1))


async def test_killed_listen_connection_loses_and_repeats_nothing(live_server, auth, run_id, pool):
    """On a server without the safety poll, so only the hub's reconnect can save it."""
    server = live_server
    h = auth()
    total = 300
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "kill", h)
        subs = [Collected() for _ in range(5)]
        tasks = [
            asyncio.create_task(
                collect_sse(server.url, stream_url(run_id, "kill") + "/subscribe", h, into=got)
            )
            for got in subs
        ]
        for got in subs:
            await asyncio.wait_for(got.connected.wait(), 10)
        before = await listen_backends(pool)
        assert before, "the server has a LISTEN connection"
        killed = 0
        for i in range(1, total + 1):
            await append(c, run_id, "kill", [i], h)
            if i in (50, 120, 200):
                for pid in await listen_backends(pool):
                    killed += bool(await pool.fetchval("SELECT pg_terminate_backend($1)", pid))
        assert await close(c, run_id, "kill", h) == total
        done = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert killed >= 3
        after = await listen_backends(pool)
        assert after and not set(after) & set(before), "the hub reconnected"
    for got in done:
        assert got.sequences == list(range(1, total + 1))
        assert got.end == {"last_sequence": total}


async def test_keepalive_comment_while_idle(live_server, auth, run_id):
    """The interval is configurable (0.2 s on this server; at most 15 s in production)."""
    h = auth()
    async with httpx.AsyncClient(base_url=live_server.url, timeout=30) as c:
        await create_stream(c, run_id, "idle", h)
        lines: list[str] = []
        async with c.stream("GET", stream_url(run_id, "idle") + "/subscribe", headers=h) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert (
                r.headers["cache-control"] == "no-store"
            )  # every API answer (http/codecs/headers.py)
            async for line in r.aiter_lines():
                lines.append(line)
                if lines.count(": keepalive") >= 3:
                    break
    assert set(lines) <= {": keepalive", ""}


async def test_a_subscriber_that_reads_nothing_does_not_delay_another(live_server, auth, run_id):
    """The idle reader's buffer (50 records on this server) overflows; the other reader
    gets everything meanwhile; the idle one then gets everything too, from Postgres."""
    h = auth()
    total, per_batch = 600, 10
    blob = "x" * 40_000
    url = stream_url(run_id, "slow") + "/subscribe"
    async with httpx.AsyncClient(base_url=live_server.url, timeout=60) as c:
        await create_stream(c, run_id, "slow", h)
        async with (
            httpx.AsyncClient(base_url=live_server.url, timeout=60) as idle_client,
            idle_client.stream("GET", url, headers=h) as idle,
        ):
            assert idle.status_code == 200  # connected, but reads nothing yet
            fast = Collected()
            fast_task = asyncio.create_task(
                collect_sse(live_server.url, url, h, into=fast, until=total)
            )
            await asyncio.wait_for(fast.connected.wait(), 10)
            lags: list[float] = []
            loop = asyncio.get_running_loop()
            for first in range(1, total + 1, per_batch):
                _, last = await append(
                    c,
                    run_id,
                    "slow",
                    [{"n": n, "blob": blob} for n in range(first, first + per_batch)],
                    h,
                )
                appended = loop.time()
                await eventually(
                    lambda last=last: bool(fast.sequences) and fast.sequences[-1] >= last,
                    timeout=20,
                    what=f"the fast reader at {last}",
                )
                lags.append(loop.time() - appended)
            await asyncio.wait_for(fast_task, 30)
            assert fast.sequences == list(range(1, total + 1))
            assert max(lags) < 5.0, max(lags)  # generous: the machine is shared

            # Now the idle reader starts reading: every record once, in order.
            from httpx_sse import EventSource

            sequences: list[int] = []
            async for event in EventSource(idle).aiter_sse():
                if event.event == "record":
                    sequences.append(json.loads(event.data)["sequence"])
                    if sequences[-1] >= total:
                        break
        assert sequences == list(range(1, total + 1))
    await eventually(
        lambda: "overflowed" in live_server.log_path.read_text(),
        timeout=10,
        what="the overflow (fallback to Postgres) to be logged",
    )


async def test_redaction_applies_per_subscriber_on_shared_batches(server, auth, run_id):
    """Two subscribers of one process share each batch; each sees its own redaction."""
    h = auth()
    plain = auth(scopes=["streams:read"])
    url = stream_url(run_id, "red") + "/subscribe"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "red", h, redaction={"json_pointers": ["/user/email"]})
        redacted, clear = Collected(), Collected()
        tasks = [
            asyncio.create_task(collect_sse(server.url, url, plain, into=redacted, until=2)),
            asyncio.create_task(collect_sse(server.url, url, h, into=clear, until=2)),
        ]
        await asyncio.wait_for(redacted.connected.wait(), 10)
        await asyncio.wait_for(clear.connected.wait(), 10)
        await append(c, run_id, "red", [{"user": {"email": "a@b.c", "n": 1}}, {"other": 2}], h)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert [r["payload"] for r in redacted.records] == [
        {"user": {"email": "[REDACTED]", "n": 1}},
        {"other": 2},
    ]
    assert [r["payload"] for r in clear.records] == [
        {"user": {"email": "a@b.c", "n": 1}},
        {"other": 2},
    ]
