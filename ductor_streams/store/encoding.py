"""Turns records into what the store keeps: compact JSON text, its byte size, a request hash.

A record's size is the byte length of its payload as compact JSON with raw UTF-8
(the API's definition of a record's size). msgspec (litestar's own codec) writes exactly that form.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

from ductor_streams.errors import InvalidBatch, InvalidIdempotencyKey, InvalidInput, RecordTooLarge

MAX_RECORD_BYTES = 65_536
MAX_BATCH_RECORDS = 1_000
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """One append request, ready for the append function."""

    payloads: list[str]
    sizes: list[int]
    objects: list[str | None]
    idempotency_key: str | None
    request_hash: str
    # The W3C traceparent of the appending request's span (tracing on and sampled): an
    # input stream's delivery rows keep it, and the dispatcher's signal continues it.
    trace: str | None = None

    @property
    def count(self) -> int:
        return len(self.payloads)

    @property
    def bytes(self) -> int:
        return sum(self.sizes)


def encode_payload(payload: Any) -> bytes:
    try:
        return _encoder.encode(payload)
    except (TypeError, ValueError, OverflowError, UnicodeEncodeError) as exc:
        raise InvalidInput(f"a payload is not encodable as JSON: {exc}") from None


def check_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    # Printable ASCII (0x20-0x7E) exactly, tested in C rather than a character at a time
    # (every batch of an activity's writer carries a key).
    if not 1 <= len(key) <= 255 or not (key.isascii() and key.isprintable()):
        raise InvalidIdempotencyKey()
    return key


def check_record_size(raw: bytes, index: int = 0) -> None:
    """RecordTooLarge (HTTP 413 ``record_too_large``) for a payload over the inline limit."""
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordTooLarge(
            f"record {index} is {len(raw)} bytes; inline records are at most "
            f"{MAX_RECORD_BYTES} bytes (use /objects)"
        )


def batch_of_encoded(raws: list[bytes], *, idempotency_key: str | None) -> EncodedBatch:
    """``encode_batch`` for payloads already encoded (and size-checked) by
    ``encode_payload``: the same texts, sizes and request hash, without encoding again."""
    if not 1 <= len(raws) <= MAX_BATCH_RECORDS:
        raise InvalidBatch(f"a batch holds 1 to {MAX_BATCH_RECORDS} records, not {len(raws)}")
    return assembled_batch(raws, check_idempotency_key(idempotency_key))


def assembled_batch(raws: list[bytes], key: str | None) -> EncodedBatch:
    """The batch of payloads already encoded and checked (count, sizes and key are the
    caller's): their texts, sizes and the request hash that idempotent replays compare
    (the same hash ``encode_batch`` computes)."""
    digest = hashlib.sha256()
    for raw in raws:
        digest.update(len(raw).to_bytes(4, "big"))
        digest.update(raw)
    return EncodedBatch(
        [raw.decode("utf-8") for raw in raws],
        [len(raw) for raw in raws],
        [None] * len(raws),
        key,
        digest.hexdigest(),
    )


def encode_batch(
    payloads: list[Any],
    *,
    idempotency_key: str | None = None,
    objects: list[dict[str, Any] | None] | None = None,
) -> EncodedBatch:
    """Validate and encode one request's records (1 to 1,000, each at most 64 KiB)."""
    if not 1 <= len(payloads) <= MAX_BATCH_RECORDS:
        raise InvalidBatch(f"a batch holds 1 to {MAX_BATCH_RECORDS} records, not {len(payloads)}")
    key = check_idempotency_key(idempotency_key)
    digest = hashlib.sha256()
    texts: list[str] = []
    sizes: list[int] = []
    for index, payload in enumerate(payloads):
        raw = encode_payload(payload)
        check_record_size(raw, index)
        digest.update(len(raw).to_bytes(4, "big"))
        digest.update(raw)
        texts.append(raw.decode("utf-8"))
        sizes.append(len(raw))
    object_texts: list[str | None] = [None] * len(texts)
    if objects is not None:
        object_texts = [None if o is None else _encoder.encode(o).decode() for o in objects]
        for text in object_texts:
            digest.update(b"\x00" if text is None else text.encode())
    return EncodedBatch(texts, sizes, object_texts, key, digest.hexdigest())
