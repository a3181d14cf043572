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

import base64
import binascii
from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from ductor_streams.definitions import is_json_media_type, media_type_essence
from ductor_streams.errors import InvalidBody, RequestTooLarge
from ductor_streams.http.append_body import MAX_JSON_VALUES
from ductor_streams.redaction import redact_json_text
from ductor_streams.store.encoding import (
    MAX_BATCH_RECORDS,
    EncodedBatch,
    batch_of_encoded,
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
# Bodies larger than this have their JSON values counted before they are decoded.
_COUNT_ABOVE = 256 * 1024
DEFAULT_CREATE_TYPE = "application/octet-stream"


def mode_of(media_type: str) -> Mode:
    if is_json_media_type(media_type):
        return "json"
    if media_type_essence(media_type).startswith("text/"):
        return "text"
    return "bytes"


def same_media_type(a: str, b: str) -> bool:
    """Whether two media types name the same type (case-insensitive, no parameters)."""
    return media_type_essence(a) == media_type_essence(b)


def _check_text_charset(media_type: str) -> None:
    for parameter in media_type.split(";")[1:]:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            raise InvalidBody("text streams hold UTF-8 text only")


def encode_body(mode: Mode, media_type: str, body: bytes, *, create: bool) -> EncodedBatch | None:
    """The records of a DS body; None when it holds none (an empty body, or ``[]`` at
    create). InvalidBody (400) or RequestTooLarge / RecordTooLarge (413)."""
    if not body:
        return None
    if mode == "json":
        raws = _json_messages(body, create=create)
        return batch_of_encoded(raws, idempotency_key=None) if raws else None
    if mode == "text":
        _check_text_charset(media_type)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidBody("the body is not UTF-8 text") from None
        if len(text) > TEXT_CHUNK_CHARS * MAX_BATCH_RECORDS:
            raise RequestTooLarge(f"a text append holds at most {TEXT_CHUNK_CHARS * 1000:,} chars")
        raws = [
            encode_payload(text[i : i + TEXT_CHUNK_CHARS])
            for i in range(0, len(text), TEXT_CHUNK_CHARS)
        ]
        return batch_of_encoded(raws, idempotency_key=None)
    if len(body) > MAX_BYTES_BODY:
        raise RequestTooLarge(f"a binary append holds at most {MAX_BYTES_BODY:,} bytes")
    raws = [
        b'"' + base64.b64encode(body[i : i + BYTES_CHUNK]) + b'"'
        for i in range(0, len(body), BYTES_CHUNK)
    ]
    return batch_of_encoded(raws, idempotency_key=None)


def _json_messages(body: bytes, *, create: bool) -> list[bytes]:
    if len(body) > MAX_JSON_BODY:
        raise RequestTooLarge()
    if len(body) > _COUNT_ABOVE:
        # Decoding costs per value (http/append_body.py): bound them before decoding.
        values = 1 + sum(body.count(c) for c in (b"[", b"{", b",", b":"))
        if values > MAX_JSON_VALUES:
            raise RequestTooLarge(f"the body holds more than {MAX_JSON_VALUES:,} JSON values")
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
