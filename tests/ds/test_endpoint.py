"""The Durable Streams endpoint over the store, against a real server and Postgres:
native and DS views agree, credit, redaction, the 410, bytes, input delivery, and the
honest refusals."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import asyncpg
import httpx
import msgspec

from ductor_streams.maintenance.retention import prune_stream
from tests.conftest import TokenFactory
from tests.ds.conftest import Ds


async def _create_native(ds: Ds, stream: str, **definition: Any) -> dict[str, Any]:
    body = {"stream_id": stream, "direction": "output", **definition}
    r = await ds.http.post(ds.native("/streams"), json=body, headers=ds.headers)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def _append_native(ds: Ds, stream: str, payloads: list[Any]) -> dict[str, Any]:
    r = await ds.http.post(
        ds.native(f"/streams/{stream}/records"),
        json={"records": [{"payload": p} for p in payloads]},
        headers=ds.headers,
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


async def _read_native(ds: Ds, stream: str) -> list[dict[str, Any]]:
    r = await ds.http.get(ds.native(f"/streams/{stream}/records?limit=1000"), headers=ds.headers)
    assert r.status_code == 200, r.text
    return list(r.json()["records"])


PRODUCER_P = {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}


def _json(headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "Content-Type": "application/json"}


async def _stream_pk(pool: asyncpg.Pool, ds: Ds, tenant: str, stream: str) -> int:
    pk = await pool.fetchval(
        "SELECT stream_pk FROM workflow_streams.streams"
        " WHERE tenant = $1 AND run_id = $2 AND stream_id = $3",
        tenant,
        ds.run_id,
        stream,
    )
    assert pk is not None
    return int(pk)


async def test_native_append_reads_over_ds_record_by_record(ds: Ds) -> None:
    await _create_native(ds, "out")
    payloads: list[Any] = [{"b": 1, "a": [1, 2]}, "text", 3, None, {"nested": {"é": "ü"}}]
    await _append_native(ds, "out", payloads[:2])
    await _append_native(ds, "out", payloads[2:])

    r = await ds.http.get(ds.url("out") + "?offset=-1", headers=ds.headers)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.headers["stream-next-offset"] == "00000000000000000005"
    assert r.headers["stream-up-to-date"] == "true"
    assert msgspec.json.decode(r.content) == payloads
    # The stored texts are spliced in as stored: key order kept.
    assert r.content.startswith(b'[{"b":1,"a":[1,2]},"text",3,null,')

    # Each DS offset is the cursor before a record: from offset k, records k+1 on.
    for k in range(5):
        page = await ds.http.get(ds.url("out") + f"?offset={k:020d}", headers=ds.headers)
        assert msgspec.json.decode(page.content) == payloads[k:]


async def test_ds_append_reads_natively_record_by_record(ds: Ds) -> None:
    r = await ds.http.put(ds.url("made"), headers=_json(ds.headers), content=b'[{"x":1}]')
    assert r.status_code == 201
    assert r.headers["stream-next-offset"] == "00000000000000000001"
    r = await ds.http.post(ds.url("made"), headers=_json(ds.headers), content=b'[[1,2],{"y":"z"}]')
    assert r.status_code == 204
    assert r.headers["stream-next-offset"] == "00000000000000000003"
    r = await ds.http.post(ds.url("made"), headers=_json(ds.headers), content=b'"single"')
    assert r.status_code == 204

    records = await _read_native(ds, "made")
    assert [(rec["sequence"], rec["payload"]) for rec in records] == [
        (1, {"x": 1}),
        (2, [1, 2]),
        (3, {"y": "z"}),
        (4, "single"),
    ]
    state = await ds.http.get(ds.native("/streams/made"), headers=ds.headers)
    definition = state.json()["definition"]
    assert definition["media_type"] == "application/json"
    assert definition["direction"] == "output"


async def test_text_stream_is_json_strings_natively(ds: Ds) -> None:
    text = "héllo\r\nworld " * 2000  # 26,000 characters: three records of at most 10,000
    headers = {**ds.headers, "Content-Type": "text/plain; charset=utf-8"}
    assert (await ds.http.put(ds.url("txt"), headers=headers)).status_code == 201
    assert (await ds.http.post(ds.url("txt"), headers=headers, content=text)).status_code == 204
    records = await _read_native(ds, "txt")
    assert [len(r["payload"]) for r in records] == [10_000, 10_000, 6_000]
    assert "".join(r["payload"] for r in records) == text
    r = await ds.http.get(ds.url("txt") + "?offset=-1", headers=ds.headers)
    assert r.content.decode() == text
    assert r.headers["content-type"] == "text/plain; charset=utf-8"


async def test_binary_round_trip_of_10_mib_is_byte_exact(ds: Ds) -> None:
    data = os.urandom(10 * 1024 * 1024)
    headers = {**ds.headers, "Content-Type": "application/octet-stream"}
    assert (await ds.http.put(ds.url("bin"), headers=headers)).status_code == 201
    r = await ds.http.post(ds.url("bin"), headers=headers, content=data)
    assert r.status_code == 204, r.text
    # 48,000-byte chunks, base64 each.
    assert r.headers["stream-next-offset"] == f"{-(-len(data) // 48_000):020d}"

    received = bytearray()
    offset = "-1"
    while True:
        page = await ds.http.get(ds.url("bin") + f"?offset={offset}", headers=ds.headers)
        assert page.status_code == 200
        received += page.content
        offset = page.headers["stream-next-offset"]
        if page.headers.get("stream-up-to-date") == "true":
            break
    assert len(received) == len(data)
    assert hashlib.sha256(received).hexdigest() == hashlib.sha256(data).hexdigest()


async def test_credit_on_a_ds_append_is_429_with_retry_after(ds: Ds) -> None:
    credit = {"max_unread_items": 3}
    await _create_native(ds, "tight", consumers=["ui"], credit=credit)
    ok = await ds.http.post(ds.url("tight"), headers=_json(ds.headers), content=b"[1,2,3]")
    assert ok.status_code == 204
    # Both ways in: the group-commit path and the writer-checked one (a producer).
    for extra in ({}, PRODUCER_P):
        r = await ds.http.post(
            ds.url("tight"), headers={**_json(ds.headers), **extra}, content=b"[4]"
        )
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["code"] == "credit_exhausted"
    assert [rec["payload"] for rec in await _read_native(ds, "tight")] == [1, 2, 3]
    # The refused producer request did not advance its state: seq 0 is still new.
    ack = await ds.http.post(
        ds.native("/streams/tight/consumers/ui/ack"), json={"sequence": 3}, headers=ds.headers
    )
    assert ack.status_code == 200, ack.text
    r = await ds.http.post(
        ds.url("tight"),
        headers={
            **_json(ds.headers),
            "Producer-Id": "p",
            "Producer-Epoch": "0",
            "Producer-Seq": "0",
        },
        content=b"[4]",
    )
    assert r.status_code == 200 and r.headers["producer-seq"] == "0"


async def test_redaction_applies_to_ds_reads(ds: Ds, auth: TokenFactory) -> None:
    await _create_native(ds, "red", redaction={"json_pointers": ["/secret"]})
    await _append_native(ds, "red", [{"secret": "s3", "ok": 1}, {"ok": 2}])
    reader = auth(scopes=["streams:read"])
    r = await ds.http.get(ds.url("red") + "?offset=-1", headers=reader)
    assert msgspec.json.decode(r.content) == [{"secret": "[REDACTED]", "ok": 1}, {"ok": 2}]
    r = await ds.http.get(ds.url("red") + "?offset=-1&live=long-poll", headers=reader)
    assert msgspec.json.decode(r.content) == [{"secret": "[REDACTED]", "ok": 1}, {"ok": 2}]
    unredacted = auth(scopes=["streams:read", "streams:read_unredacted"])
    r = await ds.http.get(ds.url("red") + "?offset=-1", headers=unredacted)
    assert msgspec.json.decode(r.content) == [{"secret": "s3", "ok": 1}, {"ok": 2}]
    # SSE too.
    async with ds.http.stream("GET", ds.url("red") + "?offset=-1&live=sse", headers=reader) as sse:
        assert sse.headers["content-type"] == "text/event-stream"
        text = ""
        async for chunk in sse.aiter_text():
            text += chunk
            if "upToDate" in text:
                break
    assert 'data:[{"secret":"[REDACTED]","ok":1},{"ok":2}]' in text
    assert "s3" not in text


async def test_pruned_offset_is_410_with_our_fields(
    ds: Ds, pool: asyncpg.Pool, tenant: str
) -> None:
    await _create_native(ds, "short", retention={"max_records": 2})
    await _append_native(ds, "short", [1, 2, 3, 4, 5])
    await prune_stream(pool, await _stream_pk(pool, ds, tenant, "short"))
    for offset in ("00000000000000000000", "00000000000000000002"):
        r = await ds.http.get(ds.url("short") + f"?offset={offset}", headers=ds.headers)
        assert r.status_code == 410, r.text
        body = r.json()
        assert body["code"] == "cursor_expired"
        assert body["requested_sequence"] == int(offset) + 1
        assert body["earliest_sequence"] == 4
        assert body["latest_sequence"] == 5
        assert body["resync_reason"] == "retention"
    # -1 is the first retained record; offset 3 is retained too.
    r = await ds.http.get(ds.url("short") + "?offset=-1", headers=ds.headers)
    assert msgspec.json.decode(r.content) == [4, 5]
    r = await ds.http.get(ds.url("short") + "?offset=00000000000000000003", headers=ds.headers)
    assert msgspec.json.decode(r.content) == [4, 5]
    # Live modes answer the same 410 before anything is sent.
    for live in ("long-poll", "sse"):
        r = await ds.http.get(
            ds.url("short") + f"?offset=00000000000000000001&live={live}", headers=ds.headers
        )
        assert r.status_code == 410 and r.json()["earliest_sequence"] == 4


async def test_ds_post_to_an_input_stream_reaches_the_delivery_outbox(
    ds: Ds, pool: asyncpg.Pool, tenant: str
) -> None:
    body = {"stream_id": "inbox", "direction": "input"}
    r = await ds.http.post(ds.native("/streams"), json=body, headers=ds.headers)
    assert r.status_code == 201
    r = await ds.http.post(ds.url("inbox"), headers=_json(ds.headers), content=b'[{"q":1},{"q":2}]')
    assert r.status_code == 204
    producer = {"Producer-Id": "ui", "Producer-Epoch": "0", "Producer-Seq": "0"}
    r = await ds.http.post(
        ds.url("inbox"), headers={**_json(ds.headers), **producer}, content=b'{"q":3}'
    )
    assert r.status_code == 200
    # A producer's retry appends nothing and queues nothing.
    r = await ds.http.post(
        ds.url("inbox"), headers={**_json(ds.headers), **producer}, content=b'{"q":3}'
    )
    assert r.status_code == 204
    pk = await _stream_pk(pool, ds, tenant, "inbox")
    rows = await pool.fetch(
        "SELECT sequence, state FROM workflow_streams.input_deliveries"
        " WHERE stream_pk = $1 ORDER BY sequence",
        pk,
    )
    assert [(row["sequence"], row["state"]) for row in rows] == [
        (1, "pending"),
        (2, "pending"),
        (3, "pending"),
    ]


async def test_refusals_are_honest(ds: Ds, auth: TokenFactory) -> None:
    assert (await ds.http.put(ds.url("r"), headers=_json(ds.headers))).status_code == 201
    r = await ds.http.delete(ds.url("r"), headers=ds.headers)
    assert r.status_code == 405 and "PUT" in r.headers["allow"]
    for name, value in (("Stream-TTL", "60"), ("Stream-Expires-At", "2030-01-01T00:00:00Z")):
        r = await ds.http.put(ds.url("ttl"), headers={**_json(ds.headers), name: value})
        assert r.status_code == 400 and r.json()["code"] == "expiry_unsupported"
    r = await ds.http.put(ds.url("fork"), headers={**ds.headers, "Stream-Forked-From": "/r"})
    assert r.status_code == 501 and r.json()["code"] == "fork_unsupported"
    # Nothing of those was created.
    for stream in ("ttl", "fork"):
        assert (await ds.http.head(ds.url(stream), headers=ds.headers)).status_code == 404
    # Our access rules: no token 401, another run 404, a missing scope 403.
    assert (await ds.http.get(ds.url("r"))).status_code == 401
    other = auth(runs=["another-run"])
    assert (await ds.http.get(ds.url("r"), headers=other)).status_code == 404
    reader = auth(scopes=["streams:read"])
    r = await ds.http.post(ds.url("r"), headers=_json(reader), content=b"[1]")
    assert r.status_code == 403 and "producer-epoch" not in r.headers
    writer = auth(scopes=["streams:write"])
    r = await ds.http.post(
        ds.url("r"), headers={**_json(writer), "Stream-Closed": "true"}, content=b"[1]"
    )
    assert r.status_code == 403  # closing needs streams:admin
    assert (await ds.http.head(ds.url("r"), headers=ds.headers)).headers.get(
        "stream-closed"
    ) is None
    # A stream name outside our stream-ID pattern does not exist.
    assert (await ds.http.put(ds.url("Upper"), headers=ds.headers)).status_code == 404


async def test_catch_up_headers_etag_and_304(ds: Ds) -> None:
    assert (await ds.http.put(ds.url("c"), headers=_json(ds.headers), content=b"[1]")).is_success
    r = await ds.http.get(ds.url("c") + "?offset=-1", headers=ds.headers)
    assert r.headers["cache-control"] == "private, max-age=60, stale-while-revalidate=300"
    assert r.headers["vary"] == "Authorization"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cross-origin-resource-policy"] == "cross-origin"
    etag = r.headers["etag"]
    again = await ds.http.get(
        ds.url("c") + "?offset=-1", headers={**ds.headers, "If-None-Match": etag}
    )
    assert again.status_code == 304 and again.content == b""
    close = await ds.http.post(ds.url("c"), headers={**ds.headers, "Stream-Closed": "true"})
    assert close.status_code == 204 and close.headers["stream-closed"] == "true"
    closed = await ds.http.get(
        ds.url("c") + "?offset=-1", headers={**ds.headers, "If-None-Match": etag}
    )
    assert closed.status_code == 200 and closed.headers["etag"] != etag
    assert closed.headers["stream-closed"] == "true"
    head = await ds.http.head(ds.url("c"), headers=ds.headers)
    assert head.headers["cache-control"] == "no-store"
    assert head.headers["stream-next-offset"] == "00000000000000000001"
    now = await ds.http.get(ds.url("c") + "?offset=now", headers=ds.headers)
    assert now.content == b"[]" and now.headers["cache-control"] == "no-store"
    assert "etag" not in now.headers


async def test_long_poll_wakes_on_append_and_times_out_with_204(ds: Ds) -> None:
    assert (await ds.http.put(ds.url("lp"), headers=_json(ds.headers))).status_code == 201

    async def later() -> httpx.Response:
        return await ds.http.get(ds.url("lp") + "?offset=now&live=long-poll", headers=ds.headers)

    import asyncio

    waiting = asyncio.ensure_future(later())
    # Append as soon as the long-poll is registered: poll the follower's effect instead of
    # sleeping, by appending until the waiting request answers.
    sent = 0
    while not waiting.done():
        await ds.http.post(ds.url("lp"), headers=_json(ds.headers), content=b'{"n":1}')
        sent += 1
        await asyncio.wait({waiting}, timeout=0.05)
    r = waiting.result()
    assert r.status_code == 200
    assert r.headers["stream-cursor"].isdigit()
    assert msgspec.json.decode(r.content)[0] == {"n": 1}
    tail = f"{sent:020d}"
    idle = await ds.http.get(ds.url("lp") + f"?offset={tail}&live=long-poll", headers=ds.headers)
    assert idle.status_code == 204
    assert idle.headers["stream-up-to-date"] == "true"
    assert idle.headers["stream-next-offset"] == tail


class _SseReader:
    """SSE events of one response, read on demand."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_text()
        self._buffer = ""

    async def until(self, marker: str) -> list[tuple[str, str]]:
        """Events (name, joined data) up to the first whose data holds ``marker``, or to
        the end of the response."""
        events: list[tuple[str, str]] = []
        name, data = "message", []
        while True:
            while "\n" in self._buffer:
                line, self._buffer = self._buffer.split("\n", 1)
                if not line:
                    events.append((name, "\n".join(data)))
                    if marker in events[-1][1]:
                        return events
                    name, data = "message", []
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
            try:
                self._buffer += await self._chunks.__anext__()
            except StopAsyncIteration:
                return events


async def test_sse_frames_live_records_and_ends_at_close(ds: Ds) -> None:
    import asyncio
    import base64

    headers = {**ds.headers, "Content-Type": "application/octet-stream"}
    assert (await ds.http.put(ds.url("live"), headers=headers, content=b"\x00\x01")).is_success
    async with ds.http.stream(
        "GET", ds.url("live") + "?offset=-1&live=sse", headers=ds.headers
    ) as sse:
        assert sse.headers["content-type"] == "text/event-stream"
        assert sse.headers["stream-sse-data-encoding"] == "base64"
        assert sse.headers["cache-control"] == "no-cache"
        reader = _SseReader(sse)
        first = await reader.until("upToDate")
        assert first[0] == ("data", base64.b64encode(b"\x00\x01").decode())
        assert first[1][0] == "control"
        control = msgspec.json.decode(first[1][1])
        assert control["streamNextOffset"] == "00000000000000000001"
        assert control["upToDate"] is True and control["streamCursor"].isdigit()

        async def append_and_close() -> None:
            await ds.http.post(ds.url("live"), headers=headers, content=b"\xff" * 3)
            await ds.http.post(ds.url("live"), headers={**ds.headers, "Stream-Closed": "true"})

        writer = asyncio.ensure_future(append_and_close())
        rest = await reader.until("streamClosed")
        await writer
    data = [d for name, d in rest if name == "data"]
    controls = [msgspec.json.decode(d) for name, d in rest if name == "control"]
    assert b"".join(base64.b64decode(d) for d in data) == b"\xff" * 3
    assert controls[-1] == {
        "streamNextOffset": "00000000000000000002",
        "streamClosed": True,
        "upToDate": True,
    }
    # Every data event is followed by a control event.
    names = [name for name, _ in rest]
    assert all(names[i + 1] == "control" for i, n in enumerate(names) if n == "data")


async def test_large_json_bodies_are_decoded_off_the_event_loop(ds: Ds) -> None:
    """Bodies past 2 MiB go to the append worker process (as native ones do): the same
    records, the same refusals; past 1,000,000 JSON values 413 before any decoding."""
    assert (await ds.http.put(ds.url("big"), headers=_json(ds.headers))).status_code == 201
    messages = [{"i": i, "s": "x" * 3000} for i in range(1000)]  # ~3 MB
    body = msgspec.json.encode(messages)
    assert len(body) > 2 * 1024 * 1024
    r = await ds.http.post(ds.url("big"), headers=_json(ds.headers), content=body)
    assert r.status_code == 204, r.text
    assert r.headers["stream-next-offset"] == "00000000000000001000"
    records = await _read_native(ds, "big")
    assert [rec["payload"] for rec in records] == messages
    broken = body[:-1] + b"}"
    r = await ds.http.post(ds.url("big"), headers=_json(ds.headers), content=broken)
    assert r.status_code == 400 and r.json()["code"] == "invalid_body"
    too_many = b"[" + b",".join([b"0"] * 1_100_000) + b"]"
    r = await ds.http.post(ds.url("big"), headers=_json(ds.headers), content=too_many)
    assert r.status_code == 413 and r.json()["code"] == "request_too_large"
    r = await ds.http.post(
        ds.url("big"), headers=_json(ds.headers), content=msgspec.json.encode([0] * 1001)
    )
    assert r.status_code == 413
    r = await ds.http.post(
        ds.url("big"), headers=_json(ds.headers), content=msgspec.json.encode(["y" * 70_000])
    )
    assert r.status_code == 413 and r.json()["code"] == "record_too_large"
    head = await ds.http.head(ds.url("big"), headers=ds.headers)
    assert head.headers["stream-next-offset"] == "00000000000000001000"  # nothing more


async def test_create_with_body_and_close_is_one_transaction(ds: Ds) -> None:
    # A refused body creates nothing at all.
    bad = await ds.http.put(ds.url("once"), headers=_json(ds.headers), content=b"[1,")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_body"
    big = await ds.http.put(
        ds.url("once"), headers=_json(ds.headers), content=msgspec.json.encode(["z" * 70_000])
    )
    assert big.status_code == 413
    assert (await ds.http.head(ds.url("once"), headers=ds.headers)).status_code == 404
    # Records and the closed state arrive together.
    closed = {**_json(ds.headers), "Stream-Closed": "true"}
    r = await ds.http.put(ds.url("once"), headers=closed, content=b'[{"final":true},2]')
    assert r.status_code == 201
    assert r.headers["stream-closed"] == "true"
    assert r.headers["stream-next-offset"] == "00000000000000000002"
    state = (await ds.http.get(ds.native("/streams/once"), headers=ds.headers)).json()["state"]
    assert state["closed"] is True and state["latest_sequence"] == 2
    assert [rec["payload"] for rec in await _read_native(ds, "once")] == [{"final": True}, 2]
    # Again with the same closed state: 200; without it: 409.
    assert (await ds.http.put(ds.url("once"), headers=closed)).status_code == 200
    again = await ds.http.put(ds.url("once"), headers=_json(ds.headers))
    assert again.status_code == 409 and again.json()["code"] == "definition_conflict"
    other_type = {**ds.headers, "Content-Type": "text/plain", "Stream-Closed": "true"}
    assert (await ds.http.put(ds.url("once"), headers=other_type)).status_code == 409


async def test_a_refused_append_and_close_neither_appends_nor_closes(ds: Ds) -> None:
    await _create_native(ds, "full", consumers=["ui"], credit={"max_unread_items": 1})
    await _append_native(ds, "full", [1])
    closing = {**_json(ds.headers), "Stream-Closed": "true"}
    r = await ds.http.post(ds.url("full"), headers=closing, content=b"[2]")
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    head = await ds.http.head(ds.url("full"), headers=ds.headers)
    assert "stream-closed" not in head.headers
    assert head.headers["stream-next-offset"] == "00000000000000000001"
    # Close-only needs no credit.
    r = await ds.http.post(ds.url("full"), headers=closing)
    assert r.status_code == 204 and r.headers["stream-closed"] == "true"
