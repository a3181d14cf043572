"""Object intents as the service sees them, and the validated prepare request."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from ductor_streams.errors import InvalidInput, ObjectTooLarge, RecordTooLarge
from ductor_streams.objects.blobstore import Pins
from ductor_streams.store.encoding import MAX_RECORD_BYTES, check_idempotency_key

MAX_OBJECT_BYTES = 33_554_432
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
# RFC 9110 media type: type "/" subtype *( ";" parameter ), printable ASCII only.
MEDIA_TYPE_PATTERN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+/[!#$%&'*+.^_`|~0-9A-Za-z-]+(;[ -~]*)?$"
_MEDIA_TYPE = re.compile(MEDIA_TYPE_PATTERN)
_encoder = msgspec.json.Encoder()

LIVE_STATES = ("prepared", "uploaded")


@dataclass(frozen=True, slots=True)
class PrepareRequest:
    """A prepare body, checked: what the intent will pin."""

    idempotency_key: str
    sha256: str
    size: int
    content_type: str
    schema: str | None
    region: str | None
    metadata: dict[str, Any]
    payload: str  # the metadata as compact JSON, exactly the record's payload

    @classmethod
    def parse(
        cls,
        *,
        idempotency_key: str,
        sha256: str,
        size: int,
        content_type: str,
        schema: str | None,
        region: str | None,
        metadata: dict[str, Any],
    ) -> PrepareRequest:
        """Validate one prepare request; errors are InvalidInput (any malformed field,
        checked first), then ObjectTooLarge or RecordTooLarge (the metadata becomes an
        inline record)."""
        key = check_idempotency_key(idempotency_key)
        assert key is not None
        if not _SHA256.fullmatch(sha256):
            raise InvalidInput("sha256 must be 64 hexadecimal digits")
        if isinstance(size, bool) or size < 0:
            raise InvalidInput("size must be a non-negative integer")
        if len(content_type) > 255 or not _MEDIA_TYPE.fullmatch(content_type):
            raise InvalidInput("content_type must be a media type such as application/pdf")
        if schema is not None and not 1 <= len(schema) <= 255:
            raise InvalidInput("schema must be 1 to 255 characters")
        if region is not None and not 1 <= len(region) <= 64:
            raise InvalidInput("region must be 1 to 64 characters")
        try:
            raw = _encoder.encode(metadata)
        except (TypeError, ValueError, OverflowError, UnicodeEncodeError) as exc:
            raise InvalidInput(f"metadata is not encodable as JSON: {exc}") from None
        # The limits come after every check of the request's shape: a request that is
        # malformed as well as too large is answered as malformed (400/422), as the
        # OpenAPI document's schema says; a well-formed one over a limit is 413.
        if size > MAX_OBJECT_BYTES:
            raise ObjectTooLarge(f"an object is at most {MAX_OBJECT_BYTES} bytes, not {size}")
        if len(raw) > MAX_RECORD_BYTES:
            raise RecordTooLarge(
                f"metadata is {len(raw)} bytes; it becomes the record's payload, "
                f"which is at most {MAX_RECORD_BYTES} bytes"
            )
        return cls(
            key, sha256.lower(), size, content_type, schema, region, metadata, raw.decode("utf-8")
        )


@dataclass(frozen=True, slots=True)
class ObjectIntent:
    """One object intent row. ``past_expiry`` is judged by the database clock."""

    object_id: uuid.UUID
    stream_pk: int
    idempotency_key: str
    sha256: str
    size: int
    content_type: str
    schema: str | None
    region: str
    payload: str
    storage_key: str
    state: str
    prepared_by: str
    prepared_scopes: list[str]
    expires_at: datetime
    past_expiry: bool
    stored_md5: str | None
    committed_sequence: int | None
    earliest_sequence: int | None = None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> ObjectIntent:
        return cls(
            object_id=row["object_id"],
            stream_pk=row["stream_pk"],
            idempotency_key=row["idempotency_key"],
            sha256=row["sha256"],
            size=row["size"],
            content_type=row["content_type"],
            schema=row["schema"],
            region=row["region"],
            payload=row["record_payload"],
            storage_key=row["storage_key"],
            state=row["state"],
            prepared_by=row["prepared_by"],
            prepared_scopes=list(row["prepared_scopes"]),
            expires_at=row["expires_at"],
            past_expiry=row["past_expiry"],
            stored_md5=row["stored_md5"],
            committed_sequence=row["committed_sequence"],
            earliest_sequence=row.get("earliest_sequence"),
        )

    @property
    def pins(self) -> Pins:
        return Pins(self.size, self.sha256)

    @property
    def effective_state(self) -> str:
        """The state as a client sees it: a live intent past its expiry is expired,
        whether or not the sweep has marked it yet."""
        if self.state in LIVE_STATES and self.past_expiry:
            return "expired"
        return self.state

    @property
    def reference(self) -> dict[str, Any]:
        """The record's ``object`` member."""
        return {
            "object_id": str(self.object_id),
            "sha256": self.sha256,
            "size": self.size,
            "content_type": self.content_type,
        }

    def same_pins(self, request: PrepareRequest, region: str) -> bool:
        return (
            self.sha256 == request.sha256
            and self.size == request.size
            and self.content_type == request.content_type
            and self.schema == request.schema
            and self.region == region
            and json.loads(self.payload) == request.metadata
        )
