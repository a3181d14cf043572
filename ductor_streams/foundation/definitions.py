"""Stream definitions: the immutable pins of a stream, with every default filled in.

Defaults and bounds (documented in docs/decisions.md, "Definitions"):
content_class ``json``; media_type ``application/json``; schema ``null``; consumers
``[]`` (input streams always get ``workflow``); credit 1,000 unread items / 16 MiB
unread bytes, no total ceilings, ``reject`` when unread credit is exhausted,
``block_timeout_ms`` 0; retention keeps everything; no redaction; placement at this
deployment's region (object regions: this region when it has an object store); any
principal of the tenant may read and write.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import PydanticCustomError

from ductor_streams.errors import ContentClassForbidden, InvalidDefinition, PlacementMismatch

STREAM_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._~:@-]{0,199}$"
CONSUMER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._~:@-]{0,127}$"
# Check IDs with ``fullmatch``, never ``match``: in Python ``$`` also matches before a
# final newline, so ``match`` would take "run-1\n" for "run-1". (The patterns keep ``$``
# for the OpenAPI document and pydantic, whose regex engines have no such exception.)
STREAM_ID_RE = re.compile(STREAM_ID_PATTERN)
RUN_ID_RE = re.compile(RUN_ID_PATTERN)
CONSUMER_ID_RE = re.compile(CONSUMER_ID_PATTERN)

CONTENT_CLASSES = ("json", "text", "tool_io", "model_output", "model_reasoning_summary", "event")
FORBIDDEN_CONTENT_CLASSES = frozenset({"raw_model_reasoning"})
WORKFLOW_CONSUMER = "workflow"

ConsumerId = Annotated[str, StringConstraints(pattern=CONSUMER_ID_PATTERN)]
Region = Annotated[str, StringConstraints(min_length=1, max_length=64)]
Principal = Annotated[str, StringConstraints(min_length=1, max_length=255)]
# A media type (RFC 9110 token "/" token, optional parameters), e.g. "text/plain;
# charset=utf-8": what a Durable Streams reader gets as Content-Type (docs/durable-streams.md).
MEDIA_TYPE_PATTERN = r"^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+(\s*;[ -~]*)?$"
JSON_MEDIA_TYPE = "application/json"
MediaType = Annotated[str, StringConstraints(pattern=MEDIA_TYPE_PATTERN, max_length=255)]
JsonPointer = Annotated[str, StringConstraints(pattern=r"^(/([^~]|~[01])*)*$", max_length=1024)]

# Upper bounds of the numbers of a definition (docs/decisions.md, "Definitions"). Every
# value must fit where the store computes with it: counts and bytes in bigint arithmetic
# (sums with sequences and totals), ages in Postgres date arithmetic (``now() - age``
# must stay a timestamp). 2**53 is also the largest integer a JSON client in JavaScript
# reads exactly. The SQL that reads stored definitions clamps to the same bounds
# (``workflow_streams.clamped_count``; ``stream_prune``), so a stream
# created before the bounds existed keeps working.
MAX_COUNT = 2**53
MAX_AGE_SECONDS = 100 * 365 * 24 * 3600  # 100 years: 3,153,600,000
MAX_BLOCK_TIMEOUT_MS = 300_000  # 5 minutes: an append request waits no longer

Ceiling = Annotated[int, Field(ge=0, le=MAX_COUNT)]

# Upper bounds of the lists of a definition (docs/decisions.md, "Definitions"): a stored
# definition is read on every request that looks its stream up, so none may be large.
MAX_CONSUMERS = 64
MAX_REDACTION_POINTERS = 100
MAX_REGIONS = 64  # each list of placement
MAX_PRINCIPALS = 1_000  # readers, writers
# The context ``definition_from_json`` validates a stored definition in.
_STORED = "stored"


def _at_most(bound: int) -> Any:
    """A list of at most ``bound`` items in a new definition (422 past it, as
    ``max_length`` answers). A stored definition is read whatever its length: one made
    before the bound keeps working."""

    def check(value: list[Any], info: ValidationInfo) -> list[Any]:
        if len(value) > bound and not (info.context or {}).get(_STORED):
            raise PydanticCustomError(
                "too_long",
                "List should have at most {max_length} items, not {actual_length}",
                {"max_length": bound, "actual_length": len(value)},
            )
        return value

    return AfterValidator(check)


def _items(bound: int) -> Any:
    """The bound as the OpenAPI document shows it."""
    return Field(json_schema_extra={"maxItems": bound})


Regions = Annotated[list[Region], _at_most(MAX_REGIONS), _items(MAX_REGIONS)]
Principals = Annotated[list[Principal], _at_most(MAX_PRINCIPALS), _items(MAX_PRINCIPALS)]


class _Pins(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Credit(_Pins):
    max_unread_items: Ceiling | None = 1000
    max_unread_bytes: Ceiling | None = 16 * 1024 * 1024
    max_total_items: Ceiling | None = None
    max_total_bytes: Ceiling | None = None
    on_unread_full: Literal["reject", "block"] = "reject"
    block_timeout_ms: Annotated[int, Field(ge=0, le=MAX_BLOCK_TIMEOUT_MS)] = 0


class Retention(_Pins):
    max_age_seconds: Annotated[int, Field(ge=1, le=MAX_AGE_SECONDS)] | None = None
    max_records: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None


class Redaction(_Pins):
    json_pointers: list[JsonPointer] = Field(
        default_factory=list, max_length=MAX_REDACTION_POINTERS
    )


class Placement(_Pins):
    metadata_home: Region | None = None
    metadata_replicas: Regions = Field(default_factory=list)
    object_regions: Regions | None = None
    client_egress_regions: Regions | None = None
    log_region: Region | None = None


class Authorization(_Pins):
    readers: Principals = Field(default_factory=lambda: ["*"])
    writers: Principals = Field(default_factory=lambda: ["*"])


class StreamDefinition(_Pins):
    """A stream's definition as stored: every field present, immutable."""

    stream_id: Annotated[str, StringConstraints(pattern=STREAM_ID_PATTERN)]
    direction: Literal["input", "output"]
    content_class: str = "json"
    # How the payloads are read as bytes over the Durable Streams endpoint: JSON values
    # (application/json), JSON strings of text (text/*), or base64 strings of bytes.
    media_type: MediaType = JSON_MEDIA_TYPE
    schema_: Annotated[str, StringConstraints(max_length=255)] | None = Field(
        default=None, alias="schema"
    )
    consumers: list[ConsumerId] = Field(default_factory=list, max_length=MAX_CONSUMERS)
    credit: Credit = Field(default_factory=Credit)
    retention: Retention = Field(default_factory=Retention)
    redaction: Redaction = Field(default_factory=Redaction)
    placement: Placement = Field(default_factory=Placement)
    authorization: Authorization = Field(default_factory=Authorization)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def may_read(self, principal: str) -> bool:
        return "*" in self.authorization.readers or principal in self.authorization.readers

    def may_write(self, principal: str) -> bool:
        return "*" in self.authorization.writers or principal in self.authorization.writers

    def allows_egress(self, region: str) -> bool:
        """Whether ``region`` may receive this stream's payloads or bytes."""
        return region in (self.placement.client_egress_regions or [])


def parse_definition(
    body: Any, *, region: str, object_store_regions: frozenset[str]
) -> StreamDefinition:
    """Validate a create-definition body and fill every default.

    Raises InvalidDefinition, ContentClassForbidden or PlacementMismatch.
    """
    if not isinstance(body, dict):
        raise InvalidDefinition("the definition must be a JSON object")
    content_class = body.get("content_class", "json")
    if isinstance(content_class, str) and content_class in FORBIDDEN_CONTENT_CLASSES:
        raise ContentClassForbidden(
            f"content class {content_class!r} (raw hidden model reasoning) may not be streamed"
        )
    try:
        parsed = StreamDefinition.model_validate(_whole_numbers(body))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "/".join(str(p) for p in first["loc"]) or "body"
        raise InvalidDefinition(f"{where}: {first['msg']}") from None
    if parsed.content_class not in CONTENT_CLASSES:
        raise InvalidDefinition(f"content_class: must be one of {', '.join(CONTENT_CLASSES)}")

    if parsed.redaction.json_pointers and not is_json_media_type(parsed.media_type):
        raise InvalidDefinition(
            "redaction: JSON pointers apply only to streams of media type application/json"
        )

    consumers = list(dict.fromkeys(parsed.consumers))
    if parsed.direction == "input" and WORKFLOW_CONSUMER not in consumers:
        consumers.insert(0, WORKFLOW_CONSUMER)

    placement = parsed.placement
    home = placement.metadata_home or region
    if home != region:
        raise PlacementMismatch(
            f"metadata_home {home!r} differs from this deployment's region {region!r}"
        )
    if placement.object_regions is None:
        object_regions = [region] if region in object_store_regions else []
    else:
        object_regions = list(placement.object_regions)
    missing = [r for r in object_regions if r not in object_store_regions]
    if missing:
        raise PlacementMismatch(f"no object store is configured for region(s) {missing}")
    filled_placement = Placement(
        metadata_home=home,
        metadata_replicas=list(placement.metadata_replicas),
        object_regions=object_regions,
        client_egress_regions=(
            list(placement.client_egress_regions)
            if placement.client_egress_regions is not None
            else [home]
        ),
        log_region=placement.log_region or home,
    )
    filled = parsed.model_copy(update={"consumers": consumers, "placement": filled_placement})
    if _holds_nul(filled.to_json_dict()):
        # Postgres text and jsonb cannot hold NUL: refuse it here, as bad input.
        raise InvalidDefinition("text in a definition may not contain NUL (\\u0000)")
    return filled


def media_type_essence(media_type: str) -> str:
    """The type/subtype of a media type, lower case, without parameters."""
    return media_type.split(";", 1)[0].strip().lower()


def is_json_media_type(media_type: str) -> bool:
    """Whether a stream of this media type holds JSON values (DS JSON mode)."""
    return media_type_essence(media_type) == JSON_MEDIA_TYPE


def _whole_numbers(body: dict[str, Any]) -> dict[str, Any]:
    """The body with each integral float of a numeric member (``5.0``) as its int.

    JSON Schema, which the OpenAPI document speaks, calls ``5.0`` an integer; the
    definition is then stored with ``5``. A float with a fraction stays a float and is
    refused by validation."""
    out = body
    for section, name, _ in _BOUNDS:
        part = body.get(section)
        value = part.get(name) if isinstance(part, dict) else None
        if isinstance(value, float) and value.is_integer():
            if out is body:
                out = dict(body)
            out[section] = {**out[section], name: int(value)}
    return out


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


# Where each bounded number sits in a stored definition, and its largest value.
_BOUNDS: tuple[tuple[str, str, int], ...] = (
    ("credit", "max_unread_items", MAX_COUNT),
    ("credit", "max_unread_bytes", MAX_COUNT),
    ("credit", "max_total_items", MAX_COUNT),
    ("credit", "max_total_bytes", MAX_COUNT),
    ("credit", "block_timeout_ms", MAX_BLOCK_TIMEOUT_MS),
    ("retention", "max_age_seconds", MAX_AGE_SECONDS),
    ("retention", "max_records", MAX_COUNT),
)


def definition_from_json(data: dict[str, Any]) -> StreamDefinition:
    """Rebuild a stored definition (already validated when it was created).

    A stream created before the bounds existed may hold a larger number: it is read as
    the bound, as the SQL that enforces it reads it, rather than failing every request
    that looks the stream up. A list longer than its bound (``MAX_PRINCIPALS`` and the
    others made after it) is read as it is, for the same reason."""
    return StreamDefinition.model_validate(_clamped(data), strict=False, context={_STORED: True})


def _clamped(data: dict[str, Any]) -> dict[str, Any]:
    clamped: dict[str, Any] | None = None
    for section, name, bound in _BOUNDS:
        part = data.get(section)
        value = part.get(name) if isinstance(part, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > bound:
            if clamped is None:
                clamped = {**data}
            clamped[section] = {**clamped[section], name: bound}
    return data if clamped is None else clamped
