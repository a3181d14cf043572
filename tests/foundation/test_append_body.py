"""The append body's decode (http/codecs/append_body.py, http/codecs/append_worker.py) gives exactly
what the old inline decode gave, on every path (inline, counted then inline, in the
worker process), valid or not; and refuses bodies over the JSON values limit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from ductor_streams.errors import StreamsError
from ductor_streams.http.codecs import append_worker
from ductor_streams.http.codecs.append_body import (
    INLINE_BYTES,
    MAX_JSON_VALUES,
    decode_append_body,
    json_values_bound,
)
from ductor_streams.http.codecs.append_worker import close_workers, encode_in_worker
from ductor_streams.store.encoding import MAX_RECORD_BYTES, EncodedBatch, encode_batch


@pytest.fixture(scope="module", autouse=True)
async def _workers() -> AsyncIterator[None]:
    yield
    await close_workers()


class OldRecord(msgspec.Struct, forbid_unknown_fields=True):
    payload: Any


class OldBody(msgspec.Struct, forbid_unknown_fields=True):
    records: list[OldRecord]


def old_decode(raw: bytes, key: str | None) -> EncodedBatch | tuple[str, int]:
    """What an append did before: decode the whole body inline, then ``encode_batch``
    (the error as its code and status)."""
    try:
        try:
            body = msgspec.json.decode(raw, type=OldBody)
        except (msgspec.DecodeError, RecursionError):
            return ("invalid_body", 400)
        return encode_batch([r.payload for r in body.records], idempotency_key=key)
    except StreamsError as exc:
        return (exc.code, exc.status)


async def new_decode(raw: bytes | memoryview, key: str | None, *, worker: bool) -> Any:
    try:
        if worker:
            return await encode_in_worker(raw, key)
        return await decode_append_body(raw, key)
    except StreamsError as exc:
        return (exc.code, exc.status)


def body_of(payloads: list[Any], pad: int = 0) -> bytes:
    """The append body of ``payloads``, with ``pad`` spaces after every comma."""
    raw = json.dumps({"records": [{"payload": p} for p in payloads]}, ensure_ascii=False)
    return raw.replace(",", "," + " " * pad).encode()


PAYLOADS = {
    "unicode": ["é", "日本語", "😀 emoji", {"ключ": "значение"}],
    "floats": [1.5, -0.0, 1e300, 2.5e-300, 0.1 + 0.2, 123456789.125],
    "ints": [0, -1, 2**63 - 1, -(2**63), 10**25],
    "nested": [{"a": {"b": [1, {"c": [None, True, False]}]}, "z": []}, [[[]]], {}],
    "strings": ["", "x" * 1000, 'quote " backslash \\ tab \t newline \n', "\u0000\u001f"],
}


def padded(raw: bytes, at_least: int) -> bytes:
    """``raw`` with spaces after every comma, ``at_least`` bytes long or more."""
    pad = b" " * (at_least // raw.count(b",") + 1)
    return raw.replace(b",", b"," + pad)


@pytest.mark.parametrize("shape", sorted(PAYLOADS))
@pytest.mark.parametrize("worker", [False, True])
async def test_valid_batches_decode_exactly_as_before(shape: str, worker: bool) -> None:
    payloads = PAYLOADS[shape] * 40
    small = body_of(payloads)
    counted = padded(small, INLINE_BYTES)  # counted, then inline
    large = padded(small, 3 * 1024 * 1024)  # counted, then the worker
    for raw in (small, counted, large):
        expected = old_decode(raw, "key-1")
        assert isinstance(expected, EncodedBatch)
        assert await new_decode(raw, "key-1", worker=worker) == expected
        # A large body read by the records front is a view of a memory map.
        assert await new_decode(memoryview(raw), "key-1", worker=worker) == expected


@pytest.mark.parametrize("worker", [False, True])
async def test_escapes_are_stored_as_the_decoded_text(worker: bool) -> None:
    """``\\u00e9`` arrives escaped and is stored as raw UTF-8, as before; a float written
    ``1E2`` is stored as msgspec writes it."""
    record = b'{"payload":{"s":"caf\\u00e9 \\ud83d\\ude00 \\/","n":1E2,"m":-0,"k":1.0,"t":"'
    record += b"\\u00e9" * 50 + b'"}}'
    raw = b'{"records":[' + b",".join([record] * 1000) + b"]}"
    assert len(raw) > INLINE_BYTES
    batch = await new_decode(raw, None, worker=worker)
    assert isinstance(batch, EncodedBatch) and batch == old_decode(raw, None)
    expected = '{"s":"café 😀 /","n":100.0,"m":0,"k":1.0,"t":"' + "é" * 50 + '"}'
    assert batch.payloads[0] == expected and batch.sizes[0] == len(expected.encode())


BAD = {
    "invalid_utf8": (b'{"records":[{"payload":"\xff"}]}', "invalid_body"),
    "number_out_of_range": (b'{"records":[{"payload":1e400}]}', "invalid_body"),
    "huge_integer": (b'{"records":[{"payload":' + b"9" * 5000 + b"}]}", "invalid_body"),
    "trailing_comma": (b'{"records":[{"payload":[1,]}]}', "invalid_body"),
    "unknown_field": (b'{"records":[{"payload":1,"x":2}]}', "invalid_body"),
    "no_records": (b'{"records":[]}', "invalid_batch"),
    "too_many_records": (body_of([1] * 1001), "invalid_batch"),
    "not_an_object": (b"[1]", "invalid_body"),
    "garbage_after": (b'{"records":[{"payload":1}]}x', "invalid_body"),
    "too_deep": (b'{"records":[{"payload":' + b"[" * 5000 + b"]" * 5000 + b"}]}", "invalid_body"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("worker", [False, True])
async def test_bad_bodies_get_the_same_error_as_before(case: str, worker: bool) -> None:
    raw, code = BAD[case]
    padded = raw + b" " * (INLINE_BYTES + 1)  # whitespace after the body: the large path
    for body in (raw, padded):
        assert old_decode(body, None) == (code, 400)
        assert await new_decode(body, None, worker=worker) == (code, 400)


@pytest.mark.parametrize("worker", [False, True])
async def test_record_too_large_and_the_other_checks_in_their_old_order(worker: bool) -> None:
    fits = "x" * (MAX_RECORD_BYTES - 2)  # 65,536 bytes as JSON
    over = "x" * (MAX_RECORD_BYTES - 1)  # 65,537 bytes
    pad = 40  # past 256 KiB in all
    batch = await new_decode(body_of([fits] * 3, pad), None, worker=worker)
    assert isinstance(batch, EncodedBatch) and batch.sizes == [MAX_RECORD_BYTES] * 3
    assert await new_decode(body_of([fits] * 3 + [over], pad), None, worker=worker) == (
        "record_too_large",
        413,
    )
    # "é" is 2 bytes of UTF-8: 32,768 of them are 65,538 bytes with the quotes.
    assert await new_decode(body_of(["é" * 32_768] * 5), None, worker=worker) == (
        "record_too_large",
        413,
    )
    # Checked in encode_batch's order: the count, then the key, then each record's size.
    cases = [
        (body_of([over] * 1001), "k", "invalid_batch"),
        (body_of([fits] * 4 + [over]), "bad\nkey", "invalid_idempotency_key"),
        (body_of([1, over] + [fits] * 3), None, "record_too_large"),
    ]
    for raw, key, code in cases:
        expected = old_decode(raw, key)
        assert isinstance(expected, tuple) and expected[0] == code
        assert await new_decode(raw, key, worker=worker) == expected


async def test_the_values_bound_is_an_upper_bound_and_the_limit_refuses() -> None:
    def values(node: Any) -> int:  # what the decoder builds: every value and every name
        if isinstance(node, list):
            return 1 + sum(values(v) for v in node)
        if isinstance(node, dict):
            return 1 + sum(1 + values(v) for v in node.values())
        return 1

    for payloads in PAYLOADS.values():
        raw = padded(body_of(payloads * 100), INLINE_BYTES)
        assert await json_values_bound(raw) >= values(json.loads(raw))
    # Empty arrays: 3 bytes and 3 counted values each (2 for the bracket, 1 comma).
    n = MAX_JSON_VALUES // 3 - 10
    at_limit = b'{"records":[{"payload":[' + b",".join([b"[]"] * n) + b"]}]}"
    assert await json_values_bound(at_limit) <= MAX_JSON_VALUES
    over = b'{"records":[{"payload":[' + b",".join([b"[]"] * (n + 20)) + b"]}]}"
    assert await new_decode(over, None, worker=False) == ("too_many_json_values", 413)
    # Commas and colons inside strings count too: the text is not parsed.
    text = b'{"records":[{"payload":"' + b",:" * (MAX_JSON_VALUES // 2 + 1) + b'"}]}'
    assert await new_decode(text, None, worker=False) == ("too_many_json_values", 413)
    assert await new_decode(b" \n\t\r" * 100_000 + b"[" + b"[]," * 400_000, None, worker=False) == (
        "invalid_body",
        400,
    )


async def test_an_80_mib_body_of_empty_arrays_is_refused_within_milliseconds() -> None:
    size = 80 * 1024 * 1024
    raw = b'{"records":[{"payload":[' + b"[]," * (size // 3 - 20) + b"[]]}]}"
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await new_decode(raw, None, worker=False) == ("too_many_json_values", 413)
    assert loop.time() - started < 0.5
    array = b"[" + b"[]," * (size // 3 - 20) + b"[]]"
    started = loop.time()
    assert await new_decode(array, None, worker=False) == ("invalid_body", 400)
    assert loop.time() - started < 0.5


async def test_a_failed_worker_is_replaced() -> None:
    raw = body_of(["x" * 1000] * 300, pad=1000)
    expected = old_decode(raw, None)
    assert await encode_in_worker(raw, None) == expected
    pool = append_worker._pools[asyncio.get_running_loop()]
    for child in list(pool._idle):
        child.process.kill()
        await child.process.wait()
    assert await encode_in_worker(raw, None) == expected
