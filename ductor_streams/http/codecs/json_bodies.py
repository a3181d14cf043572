"""Request bodies in, JSON responses out, with msgspec (litestar's own codec)."""

from __future__ import annotations

import functools
import typing
from datetime import datetime
from typing import Any

import msgspec
from litestar import Request, Response

from ductor_streams.errors import InvalidBody
from ductor_streams.foundation.redaction import redact_json_text
from ductor_streams.store import Page, PageText, Record
from ductor_streams.store.fingerprint import record_fingerprint, stored_micros

_encoder = msgspec.json.Encoder()


async def json_body(request: Request[Any, Any, Any], model: type[Any] = Any) -> Any:  # type: ignore[assignment]
    """Decode the body as JSON (optionally into a msgspec Struct), or InvalidBody."""
    return decode_json(await request.body(), model)


def decode_json(raw: bytes, model: type[Any] = Any) -> Any:  # type: ignore[assignment]
    """``raw`` as JSON (optionally into a msgspec Struct), or InvalidBody.

    An integer member also takes an integral number written with a fraction or an
    exponent (``15557.0``, ``1.5557e4``): JSON Schema, which the OpenAPI document speaks,
    calls those integers too (docs/api.md, "Numbers")."""
    try:
        return msgspec.json.decode(raw, type=model)
    except msgspec.ValidationError as exc:
        whole = _with_whole_numbers(raw, model)
        if whole is not None:
            return whole
        raise InvalidBody(f"the body does not fit: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidBody(f"the body is not JSON: {exc}") from None
    except RecursionError:
        # msgspec decodes untyped JSON recursively: absurd nesting is bad input, not a 500.
        raise InvalidBody("the body is nested too deeply") from None


@functools.cache
def _integer_fields(model: Any) -> frozenset[str]:
    """The names of a Struct's members typed ``int`` (or ``int | None``)."""
    if not (isinstance(model, type) and issubclass(model, msgspec.Struct)):
        return frozenset()
    names = set()
    for member in msgspec.structs.fields(model):
        kinds = typing.get_args(member.type) or (member.type,)
        if int in kinds:
            names.add(member.encode_name)
    return frozenset(names)


def whole_number(value: Any) -> Any:
    """An integral float (``5.0``) as the int it spells; any other value unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _with_whole_numbers(raw: bytes, model: Any) -> Any:
    """``raw`` decoded into ``model`` after its integer members' integral floats became
    ints; ``None`` when that changes nothing (the first error stands)."""
    fields = _integer_fields(model)
    if not fields:
        return None
    try:
        data = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    changed = {k: whole_number(data[k]) for k in fields if isinstance(data.get(k), float)}
    if not changed or any(isinstance(v, float) for v in changed.values()):
        return None
    try:
        return msgspec.convert({**data, **changed}, type=model, strict=True)
    except msgspec.ValidationError:
        return None


def encode_json(content: Any) -> bytes:
    return _encoder.encode(content)


def json_response(
    content: Any, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response[bytes]:
    return Response(
        content=_encoder.encode(content),
        status_code=status_code,
        media_type="application/json",
        headers=headers,
    )


def record_json(record: Record, redaction: list[str]) -> dict[str, Any]:
    """A record as the API shows it; the payload text is spliced in unparsed unless a
    redaction pointer must be applied."""
    return {
        "sequence": record.sequence,
        "payload": msgspec.Raw(redact_json_text(record.payload, redaction).encode()),
        "size": record.size,
        "appended_at": record.appended_at.isoformat(),
        "object": record.object,
        "fingerprint": record_fingerprint(record.sequence, record.appended_at, record.size),
    }


# The time's part of a record (its appended_at text and the start of its fingerprint,
# ``_time_part``) is spliced in whole: only the sequence and size differ between the
# records of one commit.
_RECORD = b'{"sequence":%d,"payload":%b,"size":%d,"appended_at":"%b%x"}'


def encode_record(record: Record, redaction: list[str]) -> bytes:
    """``record_json`` encoded. A record without redaction or object is written with one
    bytes format, the same bytes msgspec writes for its dict (tests/speed/test_read_text.py),
    without building the dict: the SSE backfill encodes every record this way."""
    if not redaction and record.object is None:
        return _RECORD % (
            record.sequence,
            record.payload.encode(),
            record.size,
            _time_part(record.appended_at),
            record.size,
        )
    return _encoder.encode(record_json(record, redaction))


# The last time written and its part: the records of one append share their appended_at
# (the statement's now()), and comparing is a fraction of what isoformat() costs.
_last_time: tuple[datetime | None, bytes] = (None, b"")


def _time_part(at: datetime) -> bytes:
    """``<appended_at text>","object":null,"fingerprint":"<its 16 hex digits>-``: the
    fingerprint as store.fingerprint.record_fingerprint writes it, up to the size."""
    global _last_time
    last, part = _last_time
    # The same instant in another zone would be written differently.
    if last is None or last != at or last.tzinfo is not at.tzinfo:
        part = b'%b","object":null,"fingerprint":"%016x-' % (
            at.isoformat().encode(),
            stored_micros(at),
        )
        _last_time = (at, part)
    return part


def page_json(page: Page, redaction: list[str]) -> dict[str, Any]:
    return {
        "records": [record_json(r, redaction) for r in page.records],
        "next_cursor": page.next_cursor,
        "earliest_sequence": page.earliest_sequence,
        "latest_sequence": page.latest_sequence,
        "closed": page.closed,
    }


PAGE_HEAD = b'{"records":['
_PAGE_TAIL = b'],"next_cursor":%d,"earliest_sequence":%d,"latest_sequence":%d,"closed":%b}'


def page_tail(next_cursor: int, earliest: int, latest: int, closed: bool) -> bytes:
    """What follows a page's records in its encoded ``page_json`` (after ``PAGE_HEAD``
    and the records joined with commas)."""
    return _PAGE_TAIL % (next_cursor, earliest, latest, b"true" if closed else b"false")


def page_text_json(page: PageText) -> bytes:
    """The encoded ``page_json`` of a page whose records Postgres wrote as JSON text
    (``store.read.read_page_text``): the same bytes, spliced instead of encoded."""
    return (
        PAGE_HEAD
        + page.records_json.encode()
        + page_tail(page.next_cursor, page.earliest_sequence, page.latest_sequence, page.closed)
    )
