"""DS bodies to records and back, by the stream's media type.

Records hold compact JSON text, so each media type has a stored form (the stream's
``media_type`` pin tells native readers which):
- ``application/json`` (DS JSON mode): one record per message; an array body is
  flattened one level. Reads splice the stored texts into ``[...]``, redacted.
- ``text/*``: the text as JSON strings of at most ``TEXT_CHUNK_CHARS`` characters each
  (under the inline limit however they escape). Reads concatenate the strings.
- anything else: the bytes as base64 JSON strings of ``BYTES_CHUNK`` bytes each.
  Reads decode and concatenate them.

One request is one atomic batch of records, so its limits are the native batch's: at
most 1,000 records (48,000,000 bytes of binary, 10,000,000 characters of text) and
65,536 bytes per JSON message; past them 413.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from ductor_streams.errors import InvalidBody, RequestTooLarge
from ductor_streams.foundation.definitions import is_json_media_type, media_type_essence
from ductor_streams.foundation.redaction import redact_json_text
from ductor_streams.http.codecs.append_body import (
    INLINE_BYTES,
    INLINE_SCANNED_BYTES,
    INLINE_SCANNED_VALUES,
    MAX_JSON_VALUES,
    SCAN_SLICE,
)
from ductor_streams.http.codecs.append_worker import encode_in_worker
from ductor_streams.store.encoding import (
    MAX_BATCH_RECORDS,
    EncodedBatch,
    assembled_batch,
    check_record_size,
    encode_payload,
)
from ductor_streams.store.models import Record

Mode = Literal["json", "text", "bytes"]

# 48,000 bytes are 64,000 base64 characters: with the quotes, each record < 65,536.
BYTES_CHUNK = 48_000
# A character escapes to at most 6 bytes (\u001f): 60,002 bytes with the quotes.
TEXT_CHUNK_CHARS = 10_000
MAX_BYTES_BODY = BYTES_CHUNK * MAX_BATCH_RECORDS
# A JSON body of 1,000 messages of 64 KiB, with room for whitespace.
MAX_JSON_BODY = 80 * 1024 * 1024
# Bytes of records built between two yields to the event loop.
_YIELD_BYTES = 4 * 1024 * 1024
DEFAULT_CREATE_TYPE = "application/octet-stream"


def mode_of(media_type: str) -> Mode:
    if is_json_media_type(media_type):
        return "json"
    if media_type_essence(media_type).startswith("text/"):
        return "text"
    return "bytes"


def max_body(mode: Mode) -> int:
    """The most bytes a request body of this mode can hold within its limits, so that a
    longer one is refused (413) before it is read: a text body of more than 4 bytes per
    character allowed cannot be within the character limit."""
    if mode == "json":
        return MAX_JSON_BODY
    if mode == "text":
        return 4 * TEXT_CHUNK_CHARS * MAX_BATCH_RECORDS
    return MAX_BYTES_BODY


def same_media_type(a: str, b: str) -> bool:
    """Whether two media types name the same type (case-insensitive, no parameters)."""
    return media_type_essence(a) == media_type_essence(b)


def check_text_charset(media_type: str) -> None:
    """InvalidBody unless ``media_type`` names no charset or UTF-8."""
    for parameter in media_type.split(";")[1:]:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            raise InvalidBody("text streams hold UTF-8 text only")


async def encode_body(
    mode: Mode, media_type: str, body: bytes, *, create: bool
) -> EncodedBatch | None:
    """The records of a DS body; None when it holds none (an empty body, or ``[]`` at
    create). InvalidBody (400) or RequestTooLarge / RecordTooLarge (413).

    As for native appends (http/codecs/append_body.py), no body holds the event loop for long:
    a large JSON body is decoded in the append worker process once its values are
    counted, and bytes and text are turned into records a few MiB at a time."""
    if not body:
        return None
    if mode == "json":
        batch = await _json_body(body, create=create)
        return batch if batch.count else None
    if mode == "text":
        check_text_charset(media_type)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidBody("the body is not UTF-8 text") from None
        if len(text) > TEXT_CHUNK_CHARS * MAX_BATCH_RECORDS:
            raise RequestTooLarge(f"a text append holds at most {TEXT_CHUNK_CHARS * 1000:,} chars")
        raws = []
        for i in range(0, len(text), TEXT_CHUNK_CHARS):
            raws.append(encode_payload(text[i : i + TEXT_CHUNK_CHARS]))
            if i and i % (100 * TEXT_CHUNK_CHARS) == 0:
                await asyncio.sleep(0)
        return await _batch(raws)
    if len(body) > MAX_BYTES_BODY:
        raise RequestTooLarge(f"a binary append holds at most {MAX_BYTES_BODY:,} bytes")
    raws = []
    for i in range(0, len(body), BYTES_CHUNK):
        raws.append(b'"' + base64.b64encode(body[i : i + BYTES_CHUNK]) + b'"')
        if i and i % (100 * BYTES_CHUNK) == 0:
            await asyncio.sleep(0)
    return await _batch(raws)


async def _batch(raws: list[bytes]) -> EncodedBatch:
    """``encoding.batch_of_encoded(raws)`` (the same texts, sizes and hash), yielding to
    the event loop every few MiB."""
    digest = hashlib.sha256()
    payloads: list[str] = []
    since = 0
    for raw in raws:
        digest.update(len(raw).to_bytes(4, "big"))
        digest.update(raw)
        payloads.append(raw.decode("utf-8"))
        since += len(raw)
        if since >= _YIELD_BYTES:
            since = 0
            await asyncio.sleep(0)
    return EncodedBatch(
        payloads, [len(r) for r in raws], [None] * len(raws), None, digest.hexdigest()
    )


async def _json_body(body: bytes, *, create: bool) -> EncodedBatch:
    if len(body) > MAX_JSON_BODY:
        raise RequestTooLarge()
    if len(body) <= INLINE_BYTES:
        return json_batch(body, create=create)
    values = await _values_bound(body)
    if len(body) <= INLINE_SCANNED_BYTES and values <= INLINE_SCANNED_VALUES:
        return json_batch(body, create=create)
    # Imported here: the worker module imports this one (its children run json_batch).
    return await encode_in_worker(body, None, "ds-create" if create else "ds-append")


async def _values_bound(body: bytes) -> int:
    """An upper bound on the JSON values of ``body`` (append_body.json_values_bound's
    count, for any JSON value), counted a slice at a time; RequestTooLarge past
    MAX_JSON_VALUES, before anything is decoded."""
    values = 1
    for start in range(0, len(body), SCAN_SLICE):
        piece = body[start : start + SCAN_SLICE]
        values += 2 * (piece.count(b"[") + piece.count(b"{"))
        values += piece.count(b",") + piece.count(b":")
        if values > MAX_JSON_VALUES:
            raise RequestTooLarge(f"the body holds more than {MAX_JSON_VALUES:,} JSON values")
        await asyncio.sleep(0)
    return values


def json_batch(body: bytes, *, create: bool) -> EncodedBatch:
    """The records of a DS JSON body, in one call (inline for small bodies, in the append
    worker process for large ones); no records for ``[]`` at create."""
    # A DS body has its own refusals (``[]`` is no records at create, 413 past the
    # count), checked by _json_messages; the assembly is the native path's.
    return assembled_batch(_json_messages(body, create=create), None)


def _json_messages(body: bytes, *, create: bool) -> list[bytes]:
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidBody(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidBody("the body is nested too deeply") from None
    messages = value if isinstance(value, list) else [value]
    if not messages:
        if create:
            return []
        raise InvalidBody("an append of [] holds no messages")
    if len(messages) > MAX_BATCH_RECORDS:
        raise RequestTooLarge(f"an append holds at most {MAX_BATCH_RECORDS} JSON messages")
    raws = []
    for index, message in enumerate(messages):
        raw = encode_payload(message)
        check_record_size(raw, index)
        raws.append(raw)
    return raws


def body_of(mode: Mode, records: Sequence[Record], redaction: list[str]) -> bytes:
    """The DS response body of these records."""
    if mode == "json":
        return b"[" + b",".join(json_texts(records, redaction)) + b"]"
    return b"".join(chunks_of(mode, records))


def body_start(mode: Mode, records: Sequence[Record], redaction: list[str]) -> bytes:
    """The start of a DS response body sent in pieces (``body_of`` is ``body_start``,
    then ``body_more`` of each later piece of records, then ``body_end``)."""
    if mode == "json":
        return b"[" + b",".join(json_texts(records, redaction))
    return b"".join(chunks_of(mode, records))


def body_more(mode: Mode, records: Sequence[Record], redaction: list[str]) -> bytes:
    """A later piece of a DS response body (see ``body_start``)."""
    if mode == "json":
        return b"," + b",".join(json_texts(records, redaction))
    return b"".join(chunks_of(mode, records))


def body_end(mode: Mode) -> bytes:
    """The end of a DS response body sent in pieces (see ``body_start``)."""
    return b"]" if mode == "json" else b""


def json_texts(records: Iterable[Record], redaction: list[str]) -> list[bytes]:
    if not redaction:
        return [r.payload.encode() for r in records]
    return [redact_json_text(r.payload, redaction).encode() for r in records]


def chunks_of(mode: Mode, records: Iterable[Record]) -> list[bytes]:
    """The bytes each record of a text or binary stream stands for. A record that is not
    of the stored form (a native append of other JSON) counts as its JSON text."""
    out = []
    for record in records:
        payload = record.payload
        if mode == "bytes" and len(payload) >= 2 and payload[0] == '"' and "\\" not in payload:
            try:
                out.append(base64.b64decode(payload[1:-1], validate=True))
                continue
            except binascii.Error:
                pass
        elif mode == "text" and payload.startswith('"'):
            value = msgspec.json.decode(payload)
            if isinstance(value, str):
                out.append(value.encode())
                continue
        out.append(payload.encode())
    return out
