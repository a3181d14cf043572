"""Append bodies that are cheap to send and dear to decode, against the real server: an
80 MiB body of nested empty arrays is refused before anything is decoded, and a missing
stream's append is answered 404 without reading its body: each answer arrives while
most of the body is still unsent. ``/healthz`` answers every probe meanwhile, one such
request or three at once; a full valid batch (1,000 records of 8 KiB), decoded in the
worker process, is stored exactly while it does. (How fast /healthz answers under such
load is a bench figure, not a test's.)"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.security.conftest import MakeWorld
from tests.support.healthz import healthz_probe

SIZE = 80 * 1024 * 1024
NESTED = b'{"records":[{"payload":[' + b"[]," * (SIZE // 3 - 20) + b"[]]}]}"
TOP_LEVEL_ARRAY = b"[" + b"[]," * (SIZE // 3 - 20) + b"[]]"
CHUNK = 1 << 20


@dataclass
class Answer:
    """An answer to a POST sent from a raw socket, and how much of the body had been
    handed to the kernel when its head arrived."""

    status: int
    headers: dict[str, str]
    body: bytes
    sent_at_answer: int

    def json(self) -> dict[str, object]:
        return dict(json.loads(self.body))


async def _post(http: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]) -> Answer:
    """POST ``body`` a MiB at a time while watching for the answer: a server that answers
    before reading the body (or the rest of it) is seen doing so, since the answer comes
    while most of the body is still unsent."""
    base = urlsplit(str(http.base_url))
    reader, writer = await asyncio.open_connection(base.hostname, base.port)
    head = f"POST {url} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write((head + "Content-Type: application/json\r\n\r\n").encode())
    sent = 0

    async def send() -> None:
        nonlocal sent
        for start in range(0, len(body), CHUNK):
            writer.write(body[start : start + CHUNK])
            await writer.drain()
            sent = min(start + CHUNK, len(body))

    sender = asyncio.create_task(send())
    try:
        raw_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        sent_at_answer = sent
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        fields = {k.lower(): v for k, v in fields.items()}
        content = await reader.readexactly(int(fields.get("content-length", "0")))
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()
    return Answer(status, fields, content, sent_at_answer)


def assert_problem(answer: Answer, status: int, code: str) -> None:
    assert answer.status == status, (answer.status, answer.body[:500])
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["code"] == code, answer.body[:500]


def assert_answered_early(answer: Answer) -> None:
    """The answer came while most of the body was still unsent: the server did not read
    (let alone decode) the whole body first. What was sent by then is at most what the
    server read plus what the sockets' buffers hold (a few MiB on loopback)."""
    assert answer.sent_at_answer < SIZE // 2, answer.sent_at_answer


def peak_mib(server: Any) -> float:
    """The server process's peak RSS so far (VmHWM), in MiB."""
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


# What refusing bodies of nested arrays may add to the server's peak RSS: the bodies
# themselves (80 MiB each) and a copy while they are counted. Decoding one would build
# ~28 million lists, over 1.5 GiB, and take seconds of the event loop.
PEAK_PER_BODY_MIB = 200


def assert_healthz_answered(times: list[float]) -> None:
    """Every probe of /healthz was answered 200 (within its 5 s timeout); the probe
    sends one every 100 ms, and the requests may all be answered within one period."""
    assert len(times) >= 1, times
    assert float("inf") not in times, times


@pytest.mark.timeout(120)
async def test_nested_empty_arrays_are_refused_before_decoding(
    server: Any, http: httpx.AsyncClient, make_world: MakeWorld
) -> None:
    world = await make_world(records=0)
    peak_before = peak_mib(server)
    with healthz_probe(str(http.base_url).rstrip("/")) as times:
        answer = await _post(http, world.url("/records"), NESTED, world.admin)
        assert_problem(answer, 413, "too_many_json_values")
        # A stream that does not exist: 404 without reading (let alone decoding) the body.
        missing = world.url("/records").replace(world.stream_id, world.fresh_stream_id())
        answer = await _post(http, missing, NESTED, world.admin)
        assert_problem(answer, 404, "not_found")
        assert_answered_early(answer)
        # Not an object at all: what the decoder would say, without decoding.
        answer = await _post(http, world.url("/records"), TOP_LEVEL_ARRAY, world.admin)
        assert_problem(answer, 400, "invalid_body")
    assert_healthz_answered(times)
    # Nothing was decoded: the peak grew by about a body, not by a decoded one.
    assert peak_mib(server) - peak_before < PEAK_PER_BODY_MIB
    records = await http.get(world.url("/records"), headers=world.admin)
    assert records.status_code == 200 and records.json()["records"] == []


@pytest.mark.timeout(120)
async def test_three_at_once_are_refused_undecoded_and_healthz_answers(
    server: Any, http: httpx.AsyncClient, make_world: MakeWorld
) -> None:
    world = await make_world(records=0)
    peak_before = peak_mib(server)
    missing = world.url("/records").replace(world.stream_id, world.fresh_stream_id())
    with healthz_probe(str(http.base_url).rstrip("/")) as times:
        answers = await asyncio.gather(
            _post(http, world.url("/records"), NESTED, world.admin),
            _post(http, world.url("/records"), NESTED, world.admin),
            _post(http, missing, NESTED, world.admin),
        )
    assert_problem(answers[0], 413, "too_many_json_values")
    assert_problem(answers[1], 413, "too_many_json_values")
    assert_problem(answers[2], 404, "not_found")
    assert_healthz_answered(times)
    assert peak_mib(server) - peak_before < 3 * PEAK_PER_BODY_MIB


@pytest.mark.timeout(180)
async def test_a_large_valid_batch_is_stored_exactly_while_healthz_answers(
    http: httpx.AsyncClient, make_world: MakeWorld
) -> None:
    """1,000 records of 8 KiB with escapes and whitespace (~8 MiB, decoded in the worker
    process): stored as ever. (A full batch of 64 KiB records is decoded the same way, but
    the store's statement then holds the loop ~0.1 s: see docs/security.md.)"""
    world = await make_world(records=0, credit={"max_unread_items": None, "max_unread_bytes": None})
    payloads = [{"i": i, "text": f"{i:05d}é" + "x" * 8_000, "n": 1.5} for i in range(1000)]
    raw = json.dumps({"records": [{"payload": p} for p in payloads]}, indent=1).encode()
    assert len(raw) > 4 * 1024 * 1024 and b"\\u00e9" in raw
    with healthz_probe(str(http.base_url).rstrip("/")) as times:
        answer = await _post(http, world.url("/records"), raw, world.admin)
        assert answer.status == 201, answer.body[:500]
        assert answer.json() == {"first_sequence": 1, "last_sequence": 1000}
    assert_healthz_answered(times)
    page = await http.get(world.url("/records?cursor=997&limit=3"), headers=world.admin)
    records = page.json()["records"]
    assert [r["payload"] for r in records] == payloads[997:]
    compact = [json.dumps(p, ensure_ascii=False, separators=(",", ":")) for p in payloads[997:]]
    assert [r["size"] for r in records] == [len(c.encode()) for c in compact]
