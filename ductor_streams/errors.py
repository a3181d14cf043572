"""Domain errors: one class per condition, each with a stable machine ``code``.

The core raises these; each boundary maps them exactly once (HTTP problems in
``ductor_streams.http.codecs.problems``, Temporal ``ApplicationError`` in
``ductor_streams.activities``). ``status`` is the HTTP status the contract gives.
"""

from __future__ import annotations

from typing import Any, ClassVar


class StreamsError(Exception):
    """Internal error.

    Base of every domain error; the first line of a class's docstring is its problem
    title (this one is what a 500 shows).
    """

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500

    def __init__(self, detail: str | None = None, **extra: Any) -> None:
        self.detail = detail or self.title()
        self.extra = extra
        super().__init__(self.detail)

    @classmethod
    def title(cls) -> str:
        return (cls.__doc__ or cls.__name__).strip().splitlines()[0]


class InvalidInput(StreamsError):
    """The request is malformed."""

    code = "invalid_request"
    status = 400


class InvalidBody(StreamsError):
    """The request body is not what this endpoint takes."""

    code = "invalid_body"
    status = 400


class RequestTooLarge(StreamsError):
    """The request body is too large."""

    code = "request_too_large"
    status = 413


class HeadersTooLarge(StreamsError):
    """The request's headers are too large."""

    code = "request_header_too_large"
    status = 431


class MethodNotAllowed(StreamsError):
    """This method is not allowed on this path."""

    code = "method_not_allowed"
    status = 405

    def __init__(self, detail: str | None = None, *, allow: str = "") -> None:
        super().__init__(detail)
        # The path's methods, for the ``Allow`` header a 405 must carry (RFC 9110 15.5.6).
        self.allow = allow


class InvalidDefinition(StreamsError):
    """The stream definition is invalid."""

    code = "invalid_definition"
    status = 422


class ContentClassForbidden(StreamsError):
    """This content class may not be streamed."""

    code = "content_class_forbidden"
    status = 422


class PlacementMismatch(StreamsError):
    """The placement cannot be served by this deployment."""

    code = "placement_mismatch"
    status = 422


class DefinitionConflict(StreamsError):
    """A different definition already exists; definitions never change."""

    code = "definition_conflict"
    status = 409


class NotFound(StreamsError):
    """No such resource."""

    code = "not_found"
    status = 404


class Unauthenticated(StreamsError):
    """Missing, malformed, expired or wrongly signed bearer token."""

    code = "unauthenticated"
    status = 401


class Forbidden(StreamsError):
    """The principal may not do this."""

    code = "forbidden"
    status = 403


class EgressDenied(StreamsError):
    """The caller's region may not receive this stream's data."""

    code = "egress_denied"
    status = 403


class RecordTooLarge(StreamsError):
    """An inline record is larger than 65,536 bytes; use /objects."""

    code = "record_too_large"
    status = 413


class TooManyJsonValues(StreamsError):
    """An append body holds too many JSON values; send fewer or flatter records."""

    code = "too_many_json_values"
    status = 413


class InvalidBatch(StreamsError):
    """A batch holds 1 to 1,000 records."""

    code = "invalid_batch"
    status = 400


class InvalidIdempotencyKey(StreamsError):
    """An Idempotency-Key is 1-255 printable ASCII characters."""

    code = "invalid_idempotency_key"
    status = 400


class IdempotencyKeyReused(StreamsError):
    """This Idempotency-Key was used with a different body."""

    code = "idempotency_key_reused"
    status = 422


class StreamClosed(StreamsError):
    """The stream is closed."""

    code = "stream_closed"
    status = 409


class QuotaExhausted(StreamsError):
    """The stream's total ceiling would be passed."""

    code = "quota_exhausted"
    status = 409


class TenantQuotaExhausted(StreamsError):
    """The tenant has as many streams as it may; no stream is created."""

    code = "tenant_quota_exhausted"
    status = 409


class CreditExhausted(StreamsError):
    """The stream's unread ceiling would be passed; retry after consumers acknowledge."""

    code = "credit_exhausted"
    status = 429

    def __init__(self, detail: str | None = None, *, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = max(1, int(retry_after))


# Seconds a client is told to wait (``Retry-After``) when its tenant has as many live
# reads open as it may: one of them has to end first (a long-poll within seconds).
LIVE_READS_RETRY_AFTER_SECONDS = 5


class TooManyLiveReads(StreamsError):
    """The tenant has as many live reads (SSE, long-poll) open as this server allows."""

    code = "too_many_live_reads"
    status = 429

    def __init__(
        self, detail: str | None = None, *, retry_after: int = LIVE_READS_RETRY_AFTER_SECONDS
    ) -> None:
        super().__init__(detail)
        self.retry_after = max(1, int(retry_after))


class TooManyReads(StreamsError):
    """The tenant has too many catch-up reads in progress; retry after ``Retry-After``."""

    code = "too_many_reads"
    status = 429

    def __init__(self, detail: str | None = None, *, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = max(1, int(retry_after))


# Seconds a client is told to wait (``Retry-After``) while the database is unavailable:
# a restart or failover takes a few seconds, and clients back off further themselves.
DATABASE_RETRY_AFTER_SECONDS = 1


class DatabaseUnavailable(StreamsError):
    """The database is unavailable (restarting, in recovery or unreachable); retry later."""

    code = "database_unavailable"
    status = 503

    def __init__(
        self, detail: str | None = None, *, retry_after: int = DATABASE_RETRY_AFTER_SECONDS
    ) -> None:
        super().__init__(detail)
        self.retry_after = max(1, int(retry_after))


class InvalidHost(StreamsError):
    """The Host header is malformed or given more than once."""

    code = "invalid_host"
    status = 400


class InvalidCursor(StreamsError):
    """The cursor must be a non-negative integer."""

    code = "invalid_cursor"
    status = 400


class InvalidLimit(StreamsError):
    """The limit must be an integer from 1 to 1,000."""

    code = "invalid_limit"
    status = 400


class CursorInFuture(StreamsError):
    """The cursor is beyond the latest sequence."""

    code = "cursor_in_future"
    status = 400


class CursorExpired(StreamsError):
    """Retention removed records after this cursor; resync from earliest_sequence - 1."""

    code = "cursor_expired"
    status = 410

    def __init__(self, *, requested: int, earliest: int, latest: int) -> None:
        super().__init__(
            f"sequence {requested} was removed by retention; the earliest retained is "
            f"{earliest}: resume with cursor={earliest - 1} or resynchronise",
            requested_sequence=requested,
            earliest_sequence=earliest,
            latest_sequence=latest,
            resync_reason="retention",
        )


class InvalidFingerprint(StreamsError):
    """The fingerprint is not one a record's JSON carries."""

    code = "invalid_fingerprint"
    status = 400


class HistoryDiverged(StreamsError):
    """The record at the cursor is not the one the reader saw; resynchronise."""

    code = "history_diverged"
    status = 409

    def __init__(
        self,
        *,
        sequence: int,
        fingerprint: str,
        stored: str | None,
        earliest: int,
        latest: int,
    ) -> None:
        if stored is not None:
            what = f"the record stored at sequence {sequence} has fingerprint {stored}"
        else:
            what = f"the stream has no record at sequence {sequence} (latest is {latest})"
        super().__init__(
            f"{what}, not {fingerprint}: the stream's history changed after this reader "
            "saw it (a database failover that lost commits, or a restore). Records after "
            "the cursor may not be the ones it expects: re-read from cursor 0, or from "
            "the last record whose fingerprint still matches, and reconcile what was "
            "derived from the records since",
            sequence=sequence,
            fingerprint=fingerprint,
            stored_fingerprint=stored,
            earliest_sequence=earliest,
            latest_sequence=latest,
            resync_reason="history_diverged",
        )


class AckRegression(StreamsError):
    """Acknowledgements only advance."""

    code = "ack_regression"
    status = 409


class AckInFuture(StreamsError):
    """The acknowledged sequence is beyond the latest sequence."""

    code = "ack_in_future"
    status = 400


class ConsumerNotFound(StreamsError):
    """No such consumer on this stream."""

    code = "consumer_not_found"
    status = 404


class ObjectTooLarge(StreamsError):
    """An object is at most 33,554,432 bytes."""

    code = "object_too_large"
    status = 413


class ObjectEvidenceMismatch(StreamsError):
    """The object's bytes do not match the pinned size and SHA-256."""

    code = "object_evidence_mismatch"
    status = 422


class ObjectNotUploaded(StreamsError):
    """The object has not been uploaded."""

    code = "object_not_uploaded"
    status = 409


class ObjectAborted(StreamsError):
    """The object was aborted."""

    code = "object_aborted"
    status = 409


class ObjectExpired(StreamsError):
    """The object intent expired before commit."""

    code = "object_expired"
    status = 410


class ObjectCommitted(StreamsError):
    """The object is already committed; its bytes can no longer change."""

    code = "object_committed"
    status = 409


class ObjectPruned(StreamsError):
    """Retention removed the object's record, and with it the object."""

    code = "object_pruned"
    status = 410


class DeliveryNotRetryable(StreamsError):
    """Only a dead delivery can be retried."""

    code = "delivery_not_dead"
    status = 409


class InvalidFilter(StreamsError):
    """An operator filter is unknown or malformed."""

    code = "invalid_filter"
    status = 400


class InvalidPage(StreamsError):
    """The page token is not one this endpoint gave out."""

    code = "invalid_page"
    status = 400


# -- the Durable Streams endpoint (docs/durable-streams.md) ---------------------------


class InvalidOffset(StreamsError):
    """A Durable Streams offset is -1, now or an offset this server returned."""

    code = "invalid_offset"
    status = 400


class ExpiryUnsupported(StreamsError):
    """Streams do not expire here; Stream-TTL and Stream-Expires-At are refused."""

    code = "expiry_unsupported"
    status = 400


class ForkUnsupported(StreamsError):
    """Stream forks are not implemented."""

    code = "fork_unsupported"
    status = 501


class MediaTypeMismatch(StreamsError):
    """The body's Content-Type is not the stream's media type."""

    code = "media_type_mismatch"
    status = 409


class StreamSeqConflict(StreamsError):
    """Stream-Seq must be greater than the last one accepted on this stream."""

    code = "stream_seq_conflict"
    status = 409


class ProducerFenced(StreamsError):
    """A newer epoch of this producer has written; this one is fenced."""

    code = "producer_fenced"
    status = 403


class ProducerSeqGap(StreamsError):
    """Producer-Seq skips a sequence; send the expected one first."""

    code = "producer_seq_gap"
    status = 409


class TooManyProducers(StreamsError):
    """The stream has as many Durable Streams producers as it may; known ones still write."""

    code = "too_many_producers"
    status = 409


class InvalidProducer(StreamsError):
    """The producer headers are malformed (all three, integers, a new epoch at seq 0)."""

    code = "invalid_producer"
    status = 400


class ClientGone(Exception):
    """The client went away before its answer: nothing more is done for it.

    Not a domain error (there is nobody to answer): raised by a wait on the client's
    behalf when its connection closes (store/credit_wait.py, http/middleware/disconnect.py), and
    by a body read that the client abandoned. The HTTP fronts answer nothing.
    """
