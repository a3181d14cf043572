"""PUT (create) and POST (append, append-and-close, close) of the DS endpoint.

A plain append (no ``Stream-Seq``, producer headers or ``Stream-Closed``) is a native
append: the same group-commit path, credit, quotas and input delivery
(``Store.append``). Any writer coordination takes ``workflow_streams.ds_append``
instead: one statement per request, its checks decided under the stream's row lock in the
transaction that appends, so that no retry is accepted twice and no fenced producer
appends. A create with a body and/or ``Stream-Closed`` is one transaction too.
"""

from __future__ import annotations

import re

from ductor_streams.errors import (
    CreditExhausted,
    DefinitionConflict,
    ExpiryUnsupported,
    ForkUnsupported,
    InvalidBody,
    InvalidInput,
    InvalidProducer,
    MediaTypeMismatch,
    NotFound,
    ProducerFenced,
    ProducerSeqGap,
    QuotaExhausted,
    StreamClosed,
    StreamSeqConflict,
    TooManyProducers,
)
from ductor_streams.foundation import metrics
from ductor_streams.foundation.definitions import STREAM_ID_RE, parse_definition
from ductor_streams.http.access import resolve_stream
from ductor_streams.http.fronts.ds import media
from ductor_streams.http.fronts.ds.offsets import format_offset
from ductor_streams.http.fronts.ds.protocol import Refusal, Reply, Request, not_found, require_admin
from ductor_streams.http.fronts.records import read_body
from ductor_streams.http.middleware.disconnect import caller_gone
from ductor_streams.http.middleware.host import location_url
from ductor_streams.store import StreamKey, StreamRef, ds
from ductor_streams.store.ds import WriteOutcome, WriterHeaders
from ductor_streams.store.outcomes import DsWriteOutcome

# What a PUT's Content-Type must look like to be kept (else the protocol's default).
_CREATE_TYPE = re.compile(r"^[\w.+-]+/[\w.+-]+")
_MAX_SAFE_INTEGER = 2**53 - 1
# A protocol integer: ASCII digits without leading zeros ("007" and "7" would be one
# producer state under two spellings), at most 16 of them (2^53-1 has 16).
_DIGITS = re.compile(r"0|[1-9][0-9]{0,15}")
# Producer-Id is a key of ds_producers: a Postgres btree entry holds at most ~2,700
# bytes, and each character of a header (latin-1) is at most 2 bytes of UTF-8.
MAX_PRODUCER_ID = 1024
# Producers a stream keeps state for (ds_append refuses a new one past it).
MAX_PRODUCERS = 10_000


def _flag(request: Request, name: str) -> bool:
    """A protocol boolean header: present only when exactly ``true`` (any case)."""
    value = request.header(name)
    return value is not None and value.strip().lower() == "true"


async def _body(request: Request, mode: media.Mode) -> bytes:
    """The body, refused (413) past what its mode can hold before any more is read."""
    limit = media.max_body(mode)
    return bytes(
        await read_body(request.scope["headers"], request.receive, limit)  # type: ignore[arg-type]
    )


async def create(request: Request) -> Reply:
    """PUT: create an output stream (201), or confirm an existing one (200 / 409)."""
    principal = request.authenticate("streams:admin")
    if not STREAM_ID_RE.fullmatch(request.stream_id):
        raise not_found(request.stream_id)
    if request.header("stream-ttl") is not None or request.header("stream-expires-at") is not None:
        raise ExpiryUnsupported("streams never expire here; retention prunes records instead")
    if request.header("stream-forked-from") is not None:
        raise ForkUnsupported()
    for name in ("stream-fork-offset", "stream-fork-sub-offset"):
        if request.header(name) is not None:
            raise InvalidInput(f"{name} needs Stream-Forked-From")
    given = (request.header("content-type") or "").strip()
    media_type = given if _CREATE_TYPE.match(given) else media.DEFAULT_CREATE_TYPE
    closed = _flag(request, "stream-closed")
    settings = request.runtime.settings
    definition = parse_definition(
        {"stream_id": request.stream_id, "direction": "output", "media_type": media_type},
        region=settings.region,
        object_store_regions=settings.object_store_regions,
    )
    mode = media.mode_of(media_type)
    body = await _body(request, mode)
    batch = await media.encode_body(mode, media_type, body, create=True)
    store = request.runtime.store
    key = StreamKey(principal.tenant, request.run_id, request.stream_id)
    ref, created, _ = await ds.create(store.pool, store.directory, key, definition, batch, closed)
    head = await ds.head(store.pool, ref.stream_pk)
    if not created and (
        not media.same_media_type(ref.definition.media_type, media_type) or head.closed != closed
    ):
        raise DefinitionConflict(
            f"stream {request.stream_id!r} exists with another media type or closed state"
        )
    if created and batch is not None:
        metrics.count_append("output", batch.count, batch.bytes)
    headers = {
        "Content-Type": ref.definition.media_type,
        "Stream-Next-Offset": format_offset(head.latest_sequence),
        "Cache-Control": "no-store",
    }
    if created:
        # From DUCTOR_STREAMS_PUBLIC_URL, or the address the connection arrived at, never
        # the request's Host (http/middleware/host.py): the protocol's clients want an
        # absolute URL.
        headers["Location"] = location_url(settings, request.scope, request.path)
    if head.closed:
        headers["Stream-Closed"] = "true"
    return Reply(201 if created else 200, headers)


def _writer_headers(request: Request) -> WriterHeaders:
    producer_id = request.header("producer-id")
    epoch = request.header("producer-epoch")
    seq = request.header("producer-seq")
    given = [v for v in (producer_id, epoch, seq) if v is not None]
    if given and len(given) != 3:
        raise InvalidProducer("Producer-Id, Producer-Epoch and Producer-Seq go together")
    if producer_id is not None and epoch is not None and seq is not None:
        if not producer_id.strip():
            raise InvalidProducer("Producer-Id must not be empty")
        if len(producer_id) > MAX_PRODUCER_ID:
            raise InvalidProducer(f"Producer-Id holds at most {MAX_PRODUCER_ID} characters")
        numbers = []
        for name, value in (("Producer-Epoch", epoch), ("Producer-Seq", seq)):
            if not _DIGITS.fullmatch(value.strip()) or int(value) > _MAX_SAFE_INTEGER:
                raise InvalidProducer(
                    f"{name} must be an integer from 0 to 2^53-1, without leading zeros"
                )
            numbers.append(int(value))
        return WriterHeaders(
            close=_flag(request, "stream-closed"),
            stream_seq=_stream_seq(request),
            producer_id=producer_id,
            producer_epoch=numbers[0],
            producer_seq=numbers[1],
        )
    return WriterHeaders(close=_flag(request, "stream-closed"), stream_seq=_stream_seq(request))


def _stream_seq(request: Request) -> str | None:
    """``Stream-Seq``, which must not be empty: ``""`` sorts before every value, so an
    accepted empty one would say nothing (and one after it, anything at all)."""
    value = request.header("stream-seq")
    if value is not None and not value.strip():
        raise InvalidInput("Stream-Seq must not be empty")
    return value


async def _closed_refusal(request: Request, ref: StreamRef) -> Refusal:
    head = await ds.head(request.runtime.pool, ref.stream_pk)
    return Refusal(
        StreamClosed(),
        {"Stream-Closed": "true", "Stream-Next-Offset": format_offset(head.latest_sequence)},
    )


async def append(request: Request) -> Reply:
    """POST: append the body (204, or 200 for a producer's new data), close, or both."""
    # The native order (docs/security.md): token, run, scopes, the stream, its lists;
    # only then the writer headers and, last, the body.
    principal = request.authenticate("streams:write")
    if _flag(request, "stream-closed"):
        require_admin(principal)
    store = request.runtime.store
    ref = await resolve_stream(store, principal, request.run_id, request.stream_id, "write", "POST")
    writer = _writer_headers(request)
    mode = media.mode_of(ref.definition.media_type)
    body = await _body(request, mode)
    batch = None
    if not body:
        if not writer.close:
            raise InvalidBody("an append needs a body (or Stream-Closed: true to close)")
    else:
        content_type = request.header("content-type")
        if not content_type:
            raise InvalidInput("an append with a body needs a Content-Type")
        if not media.same_media_type(content_type, ref.definition.media_type):
            head = await ds.head(store.pool, ref.stream_pk)
            if head.closed:  # the protocol's precedence: closed first
                raise await _closed_refusal(request, ref)
            raise Refusal(
                MediaTypeMismatch(f"the stream's media type is {ref.definition.media_type}"), {}
            )
        if mode == "text":
            # The body is read as UTF-8: one that says it is another charset is refused,
            # never stored as whatever its bytes happen to spell in UTF-8.
            media.check_text_charset(content_type)
        media_type = ref.definition.media_type
        batch = await media.encode_body(mode, media_type, body, create=False)
    if writer.plain:
        assert batch is not None
        try:
            result = await store.append(ref, batch, caller_gone=caller_gone(request.receive))
        except StreamClosed:
            raise await _closed_refusal(request, ref) from None
        return Reply(204, {"Stream-Next-Offset": format_offset(result.last_sequence)})
    outcome = await ds.write(store.pool, ref.stream_pk, batch, writer)
    if outcome.outcome == DsWriteOutcome.APPENDED and batch is not None:
        metrics.count_append(ref.definition.direction, batch.count, batch.bytes)
    return _answer(ref, writer, outcome)


def _answer(ref: StreamRef, writer: WriterHeaders, outcome: WriteOutcome) -> Reply:
    name = outcome.outcome
    tail = {"Stream-Next-Offset": format_offset(outcome.latest_sequence)}
    if outcome.closed:
        tail["Stream-Closed"] = "true"
    producer = {}
    if writer.producer_id is not None:
        producer = {
            "Producer-Epoch": str(writer.producer_epoch),
            "Producer-Seq": str(outcome.producer_seq),
        }
    if name == DsWriteOutcome.APPENDED:
        status = 200 if writer.producer_id is not None and outcome.last_sequence else 204
        return Reply(status, {**tail, **producer})
    if name in (DsWriteOutcome.DUPLICATE, DsWriteOutcome.ALREADY_CLOSED):
        return Reply(204, {**tail, **producer})
    if name == DsWriteOutcome.STREAM_CLOSED:
        raise Refusal(StreamClosed(), {**tail, "Stream-Closed": "true"})
    if name == DsWriteOutcome.STALE_EPOCH:
        raise Refusal(
            ProducerFenced(f"producer epoch {outcome.producer_epoch} has written since"),
            {"Producer-Epoch": str(outcome.producer_epoch)},
        )
    if name == DsWriteOutcome.EPOCH_SEQ:
        raise InvalidProducer("a new Producer-Epoch starts at Producer-Seq 0")
    if name == DsWriteOutcome.SEQ_GAP:
        raise Refusal(
            ProducerSeqGap(f"expected Producer-Seq {outcome.producer_seq}"),
            {
                "Producer-Expected-Seq": str(outcome.producer_seq),
                "Producer-Received-Seq": str(writer.producer_seq),
            },
        )
    if name == DsWriteOutcome.TOO_MANY_PRODUCERS:
        raise TooManyProducers(
            f"the stream has {MAX_PRODUCERS:,} producers; a new Producer-Id is refused"
        )
    if name == DsWriteOutcome.STREAM_SEQ_CONFLICT:
        raise StreamSeqConflict()
    if name == DsWriteOutcome.CREDIT_EXHAUSTED:
        metrics.CREDIT_REJECTIONS.labels(reason="credit").inc()
        raise CreditExhausted()
    if name == DsWriteOutcome.QUOTA_EXHAUSTED:
        metrics.CREDIT_REJECTIONS.labels(reason="quota").inc()
        raise QuotaExhausted()
    if name == DsWriteOutcome.NOT_FOUND:
        raise NotFound("stream does not exist")
    raise RuntimeError(f"unexpected DS write outcome {name!r} for stream {ref.stream_pk}")
