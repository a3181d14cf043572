"""The fan-out's chunk writes (http/codecs/sse_response.py ``DirectWriter`` with a
``ChunkWriter``, compat/uvicorn_protocol.py): one framed chunk per batch and redaction,
written straight to each idle subscriber's transport.

Against a real server subprocess, with raw-socket subscribers that parse the HTTP/1.1
chunked framing themselves (the server frames these chunks, not uvicorn): 300
subscribers (more than one fan-out slice and more than the feed's bound, so the
follower's reads fan out) with two redaction views get every record once, in order,
each with its own view, and the body's framing ends exactly with the terminal chunk; a
subscriber that stops reading while megabytes arrive (flow control holds its writes back)
gets everything once and in order when it reads on. In memory: the chunk is framed once
per batch and redaction key, and a refused write leaves the batch to the generator.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from ductor_streams.compat.uvicorn_protocol import chunk_frame
from ductor_streams.http.codecs.sse_response import DirectWriter
from ductor_streams.live.events import LiveBatch
from ductor_streams.store.models import Record
from tests.support.live import append, close, create_stream, eventually, stream_url

pytestmark = pytest.mark.timeout(120)

_CHUNKS = re.compile(r"^ductor_streams_sse_chunk_writes_total (\S+)$", re.M)


async def chunk_writes(c: httpx.AsyncClient) -> float:
    """The server's ``ductor_streams_sse_chunk_writes_total``."""
    match = _CHUNKS.search((await c.get("/metrics")).text)
    assert match is not None, "no ductor_streams_sse_chunk_writes_total on /metrics"
    return float(match[1])


class RawSubscriber(asyncio.Protocol):
    """An SSE subscriber on a raw socket: parses the response head, the chunked body
    and the SSE events; keeps every record event's ``id`` and payload, and the ``end``."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.head: bytes | None = None
        self.raw = bytearray()  # body bytes not yet de-chunked
        self.sse = bytearray()  # de-chunked body bytes not yet parsed as events
        self.ids: list[int] = []
        self.payloads: list[Any] = []
        self.end: dict[str, Any] | None = None
        self.terminal_chunk = False
        self.connected = asyncio.get_running_loop().create_future()
        self.done = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.raw += data
        if self.head is None:
            head, sep, rest = bytes(self.raw).partition(b"\r\n\r\n")
            if not sep:
                return
            self.head = head
            self.raw = bytearray(rest)
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
            assert b"transfer-encoding: chunked" in head.lower(), head
            self.connected.set_result(None)
        self._dechunk()
        self._events()

    def _dechunk(self) -> None:
        while not self.terminal_chunk:
            line_end = self.raw.find(b"\r\n")
            if line_end < 0:
                return
            size = int(bytes(self.raw[:line_end]), 16)
            if len(self.raw) < line_end + 2 + size + 2:
                return
            start = line_end + 2
            assert self.raw[start + size : start + size + 2] == b"\r\n", "bad chunk framing"
            self.sse += self.raw[start : start + size]
            del self.raw[: start + size + 2]
            if size == 0:
                self.terminal_chunk = True
                assert not self.raw, f"bytes after the terminal chunk: {bytes(self.raw)!r}"
                if not self.done.done():
                    self.done.set_result(None)

    def _events(self) -> None:
        while True:
            cut = self.sse.find(b"\n\n")
            if cut < 0:
                return
            block, self.sse = bytes(self.sse[:cut]), self.sse[cut + 2 :]
            if block.startswith(b":"):
                continue  # keepalive
            fields = dict(line.split(b": ", 1) for line in block.split(b"\n"))
            if fields[b"event"] == b"record":
                record = json.loads(fields[b"data"])
                assert int(fields[b"id"]) == record["sequence"]
                self.ids.append(record["sequence"])
                self.payloads.append(record["payload"])
            elif fields[b"event"] == b"end":
                self.end = json.loads(fields[b"data"])

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"closed before the end: {exc}"))


async def subscribe_raw(
    port: int, path: str, headers: dict[str, str], *, rcvbuf: int | None = None
) -> RawSubscriber:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{lines}\r\n".encode()
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    _, protocol = await loop.create_connection(lambda: RawSubscriber(request), sock=sock)
    await asyncio.wait_for(protocol.connected, 30)
    return protocol


async def test_300_subscribers_with_two_redactions_get_every_record_once_in_order(
    server, auth, run_id
):
    full, plain = auth(), auth(scopes=["streams:read"])
    path = stream_url(run_id, "many") + "/subscribe"
    records = 60
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
        await create_stream(c, run_id, "many", full, redaction={"json_pointers": ["/email"]})
        subscribers = [
            await subscribe_raw(server.port, path, plain if i % 2 else full) for i in range(300)
        ]
        before = await chunk_writes(c)
        # One record a request, up to 4 in flight: fan-outs of one and of several.
        for first in range(1, records + 1, 4):
            await asyncio.gather(
                *(
                    append(c, run_id, "many", [{"email": f"u{n}@x.y", "n": n}], full)
                    for n in range(first, min(records, first + 3) + 1)
                )
            )
        last = await close(c, run_id, "many", full)
        assert last == records
        await asyncio.wait_for(asyncio.gather(*(s.done for s in subscribers)), 60)
        after = await chunk_writes(c)
    for i, s in enumerate(subscribers):
        assert s.ids == list(range(1, records + 1)), (i, s.ids)
        assert s.end == {"last_sequence": records}
        ns = [p["n"] for p in s.payloads]
        assert ns == sorted(ns) and len(set(ns)) == records
        expected_email = "[REDACTED]" if i % 2 else None
        for p in s.payloads:
            assert p["email"] == (expected_email or f"u{p['n']}@x.y"), (i, p)
        assert s.transport is not None
        s.transport.close()
    # The live records went out as the fan-out's own chunk writes (at least one per
    # subscriber: everything the subscribers got after connecting was live).
    assert after - before >= 300


async def test_a_subscriber_held_back_by_flow_control_gets_everything_once_in_order(
    server, auth, run_id
):
    h = auth()
    path = stream_url(run_id, "held") + "/subscribe"
    blob = "x" * 32_000
    records = 250  # 8 MB: more than the loopback send buffer can hold (4 MiB at most)
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
        await create_stream(c, run_id, "held", h)
        fast = await subscribe_raw(server.port, path, h)
        slow = await subscribe_raw(server.port, path, h, rcvbuf=4096)
        assert slow.transport is not None
        slow.transport.pause_reading()
        before = await chunk_writes(c)
        for n in range(1, records + 1):
            await append(c, run_id, "held", [{"n": n, "blob": blob}], h)
        await eventually(lambda: len(fast.ids) == records, timeout=60, what="the fast reader")
        after = await chunk_writes(c)
        # The slow reader's writes stopped going out directly once flow control held
        # them back (the rest wait in its buffer, or in Postgres after an overflow).
        assert after - before < 2 * records
        slow.transport.resume_reading()
        last = await close(c, run_id, "held", h)
        await asyncio.wait_for(asyncio.gather(fast.done, slow.done), 60)
    assert last == records
    for s in (fast, slow):
        assert s.ids == list(range(1, records + 1))
        assert [p["n"] for p in s.payloads] == list(range(1, records + 1))
        assert s.end == {"last_sequence": records}
        assert s.transport is not None
        s.transport.close()


# -- in memory ------------------------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def batch(first: int, last: int) -> LiveBatch:
    return LiveBatch(
        [Record(s, f'"{s}"', 3, NOW, None) for s in range(first, last + 1)], last, False
    )


class FakeChunks:
    """A ``ChunkWriter`` that takes writes until told to refuse."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.refuse = False

    def write(self, chunk: bytes) -> bool:
        if self.refuse:
            return False
        self.written.append(chunk)
        return True


async def no_send(message: Any) -> None:
    raise AssertionError("the chunk path must not call send")


def test_the_chunk_is_framed_once_per_batch_and_redaction_key():
    encoded: list[tuple[str, list[int]]] = []

    def encoder(view: str) -> Any:
        def encode(b: LiveBatch) -> bytes:
            encoded.append((view, [r.sequence for r in b.records]))
            return b"".join(b"%s:%d;" % (view.encode(), r.sequence) for r in b.records)

        return encode

    writers = []
    for view in ("full", "full", "redacted", "redacted", "full"):
        chunks = FakeChunks()
        writer = DirectWriter(encoder(view), max_bytes=1024, memo_key=(view,))
        writer.bind(no_send, chunks)  # type: ignore[arg-type]
        writers.append((writer, chunks))
    shared = batch(1, 2)
    assert all(writer(shared) for writer, _ in writers)
    assert encoded == [("full", [1, 2]), ("redacted", [1, 2])]
    full, redacted = chunk_frame(b"full:1;full:2;"), chunk_frame(b"redacted:1;redacted:2;")
    assert [c.written for _, c in writers] == [[full], [full], [redacted], [redacted], [full]]
    assert full == b"e\r\nfull:1;full:2;\r\n"  # uvicorn's framing of the same body


def test_a_refused_or_too_large_chunk_is_left_to_the_generator():
    chunks = FakeChunks()
    writer = DirectWriter(lambda b: b"y" * 600 * len(b.records), max_bytes=1024)
    assert writer(batch(1, 1)) is False  # not bound yet
    writer.bind(no_send, chunks)  # type: ignore[arg-type]
    assert writer(batch(1, 1)) is True
    chunks.refuse = True  # flow control, a closing connection, a complete response
    assert writer(batch(2, 2)) is False
    chunks.refuse = False
    assert writer(batch(3, 4)) is False  # 1,200 bytes: over one write
    assert chunks.written == [chunk_frame(b"y" * 600)]
    writer.cancel()
    assert writer(batch(5, 5)) is False
