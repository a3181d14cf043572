"""Request bodies in, JSON responses out, with msgspec (litestar's own codec)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response

from ductor_streams.errors import InvalidBody
from ductor_streams.redaction import redact_json_text
from ductor_streams.store import Page, Record

_encoder = msgspec.json.Encoder()


async def json_body(request: Request[Any, Any, Any], model: type[Any] = Any) -> Any:  # type: ignore[assignment]
    """Decode the body as JSON (optionally into a msgspec Struct), or InvalidBody."""
    return decode_json(await request.body(), model)


def decode_json(raw: bytes, model: type[Any] = Any) -> Any:  # type: ignore[assignment]
    """``raw`` as JSON (optionally into a msgspec Struct), or InvalidBody."""
    try:
        return msgspec.json.decode(raw, type=model)
    except msgspec.ValidationError as exc:
        raise InvalidBody(f"the body does not fit: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidBody(f"the body is not JSON: {exc}") from None
    except RecursionError:
        # msgspec decodes untyped JSON recursively: absurd nesting is bad input, not a 500.
        raise InvalidBody("the body is nested too deeply") from None


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
    }


def encode_record(record: Record, redaction: list[str]) -> bytes:
    return _encoder.encode(record_json(record, redaction))


def page_json(page: Page, redaction: list[str]) -> dict[str, Any]:
    return {
        "records": [record_json(r, redaction) for r in page.records],
        "next_cursor": page.next_cursor,
        "earliest_sequence": page.earliest_sequence,
        "latest_sequence": page.latest_sequence,
        "closed": page.closed,
    }
