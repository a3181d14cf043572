"""An append body, from bytes to an ``EncodedBatch``, without stalling the event loop.

Decoding JSON is cheap per byte but dear per value: msgspec builds one Python object per
JSON value and never releases the GIL, so an 80 MiB body of nested empty arrays
(``{"records":[{"payload":[[],[],...]}]}``, ~28 million lists) held the event loop for
seconds, and running it in a thread does not help (the thread holds the GIL: the
loop's longest gap was the whole decode). Even a valid 80 MiB batch of strings takes
~0.2 s to decode and ~0.1 s to encode in one call. So the rule, checked in this order
once the caller is authenticated, authorized and the stream found (``append_answer``):

1. A body of at most ``INLINE_BYTES`` (256 KiB) is decoded inline, as always: its worst
   case (~87,000 empty arrays) costs under 20 ms, and small appends must stay fast.
2. A larger body is first *counted*, on the event loop in slices of ``SCAN_SLICE`` bytes
   with a yield after each (``bytes.count`` runs at C speed, ~1 ms per MiB per byte
   value): its first byte after whitespace must be ``{`` (else 400 ``invalid_body``, as
   the decoder would answer), and the number of JSON values it can hold, bounded from
   above as ``2 * ([ + {) + , + : + 1`` counting those bytes wherever they are (inside
   strings too: no parsing), must be at most ``MAX_JSON_VALUES`` (1,000,000), else 413
   ``too_many_json_values`` without decoding anything. This bounds the CPU time and the
   memory one request can make the decoder spend (1,000,000 values: ~0.2 s, ~100 MB).
3. A counted body of at most ``INLINE_SCANNED_BYTES`` with at most
   ``INLINE_SCANNED_VALUES`` values is decoded inline (worst case well under 50 ms).
4. Any other body is decoded and encoded by ``encode_append`` in a separate process
   (``http/codecs/append_worker.py``), which has its own GIL; the event loop only moves bytes.

Steps 1, 3 and 4 run the same function, ``encode_append``: the old inline decode and
``encode_batch``, so every request under the limit gets exactly the answer it got before
(the same stored bytes, sizes and idempotency digest, the same error codes in the same
order). Only bodies over ``MAX_JSON_VALUES`` are answered differently: 413
``too_many_json_values``, whatever else is wrong with them (docs/security.md).

Records are not refused as too large from their text before decoding: no count of the
text is a sound lower bound of a record's stored size. An object that repeats a name
keeps only its last value (``{"a":[[],[],...],"a":1}`` is stored as ``{"a":1}``), and a
number can shrink at will (``1.000...0`` is stored as ``1.0``). The values limit and the
worker process bound the work instead, without changing any answer under the limit.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import msgspec

from ductor_streams.errors import InvalidBody, TooManyJsonValues
from ductor_streams.http.codecs.append_worker import Body, encode_in_worker
from ductor_streams.http.codecs.json_bodies import decode_json
from ductor_streams.store.encoding import EncodedBatch, encode_batch

INLINE_BYTES = 256 * 1024
SCAN_SLICE = 1024 * 1024
MAX_JSON_VALUES = 1_000_000
INLINE_SCANNED_BYTES = 2 * 1024 * 1024
INLINE_SCANNED_VALUES = 50_000

# JSON's insignificant whitespace (RFC 8259), as msgspec skips it.
_WHITESPACE = re.compile(rb"[ \t\n\r]*")


class AppendRecord(msgspec.Struct, forbid_unknown_fields=True):
    payload: Any


class AppendBody(msgspec.Struct, forbid_unknown_fields=True):
    records: list[AppendRecord]


def encode_append(raw: bytes, idempotency_key: str | None) -> EncodedBatch:
    """The body's records, validated and encoded: the whole work in one call (inline for
    small bodies, in the worker process for large ones)."""
    body: AppendBody = decode_json(raw, AppendBody)
    return encode_batch([r.payload for r in body.records], idempotency_key=idempotency_key)


async def decode_append_body(raw: Body, idempotency_key: str | None) -> EncodedBatch:
    """``encode_append(raw, idempotency_key)``, holding the event loop for a few
    milliseconds at a time at most (the module docstring gives the rule)."""
    if len(raw) <= INLINE_BYTES:
        return encode_append(bytes(raw), idempotency_key)
    values = await json_values_bound(raw)
    if len(raw) <= INLINE_SCANNED_BYTES and values <= INLINE_SCANNED_VALUES:
        return encode_append(bytes(raw), idempotency_key)
    # Imported here: the worker module imports this one (it runs ``encode_append``).
    return await encode_in_worker(raw, idempotency_key)


async def json_values_bound(raw: Body, limit: int = MAX_JSON_VALUES) -> int:
    """An upper bound on the JSON values ``raw`` holds (InvalidBody if it cannot be an
    object, TooManyJsonValues past ``limit``), counted slice by slice with a yield after
    each so that no single hold is long."""
    start = 0
    while True:
        stop = min(start + SCAN_SLICE, len(raw))
        start = _WHITESPACE.match(raw, start, stop).end()  # type: ignore[union-attr]
        if start < stop or stop == len(raw):
            break
        await asyncio.sleep(0)
    if raw[start : start + 1] != b"{":
        raise InvalidBody("the body is not a JSON object")
    values = 1
    for begin in range(start, len(raw), SCAN_SLICE):
        piece = bytes(raw[begin : begin + SCAN_SLICE])
        # Every value but the first (a name counts: the decoder builds it too) follows a
        # ``[``, ``{``, ``,`` or ``:``. Arrays and objects count once more: they cost the
        # decoder several times what a scalar does (~0.2 us and ~70 bytes each).
        values += 2 * (piece.count(b"[") + piece.count(b"{"))
        values += piece.count(b",") + piece.count(b":")
        if values > limit:
            raise TooManyJsonValues(
                f"the body holds more than {limit:,} JSON values (counted as "
                "2 per '[' or '{' plus 1 per ',' or ':'); send fewer or flatter records"
            )
        await asyncio.sleep(0)
    return values
