"""Wakes that carry the records they announce, so a follower elsewhere needs no read.

A process whose commit appended a few small records to a stream announces them, once
the commit has returned, as one NOTIFY payload (store/wakes.py)::

    R<stream_pk>:<last sequence>:<first sequence>:<appended_at, epoch microseconds>:<payloads>

the payloads (compact JSON, exactly as stored) joined by U+001E, which compact JSON
never holds unescaped. A follower (live/stream_follower.py) fans them out as it does its own
process's fed commits: only when they follow on from what it delivered; anything else
is left to a read, as for a plain ``r<pk>:<latest>`` wake. So the payload is a
shortcut, never the only way a record arrives. Records with an object, and commits
whose records do not fit ``MAX_PAYLOAD_BYTES`` (NOTIFY takes under 8,000 bytes), are
announced the plain way. A process that does not know this kind reads its stream on
it, as on any wake that carries no sequence.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ductor_streams.store.models import Record

KIND = "R"
SEPARATOR = "\x1e"
# Postgres refuses NOTIFY payloads of 8,000 bytes and more.
MAX_PAYLOAD_BYTES = 7_900
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def record_wake(stream_pk: int, records: list[Record]) -> str | None:
    """The wake carrying ``records`` (consecutive, one transaction's, none with an
    object), or None when they cannot go in one."""
    if not records:
        return None
    first, last = records[0].sequence, records[-1].sequence
    if last - first + 1 != len(records):
        return None
    size = sum(r.size for r in records) + len(records) + 64
    if size > MAX_PAYLOAD_BYTES or any(r.object is not None for r in records):
        return None
    joined = SEPARATOR.join(r.payload for r in records)
    if joined.count(SEPARATOR) != len(records) - 1 or "\x00" in joined:
        return None
    appended_us = (records[0].appended_at - _EPOCH) // _MICROSECOND
    payload = f"{KIND}{stream_pk}:{last}:{first}:{appended_us}:{joined}"
    if len(payload.encode()) > MAX_PAYLOAD_BYTES:
        return None
    return payload


def parse_record_wake(payload: str) -> tuple[int, int, list[Record]] | None:
    """``(stream_pk, last sequence, records)`` of a record-carrying wake, or None."""
    if not payload.startswith(KIND):
        return None
    parts = payload[1:].split(":", 4)
    if len(parts) != 5:
        return None
    pk_text, last_text, first_text, appended_text, joined = parts
    try:
        stream_pk, last, first = int(pk_text), int(last_text), int(first_text)
        appended_at = _EPOCH + int(appended_text) * _MICROSECOND
    except (ValueError, OverflowError):
        return None
    texts = joined.split(SEPARATOR)
    if len(texts) != last - first + 1:
        return None
    records = [
        Record(sequence, text, len(text.encode()), appended_at, None)
        for sequence, text in zip(range(first, last + 1), texts, strict=True)
    ]
    return stream_pk, last, records
