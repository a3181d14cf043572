"""The ONE mapping from domain errors to Temporal ``ApplicationError`` (the activity edge).

Every ApplicationError carries the domain ``code`` and any extra fields as its first
detail, so workflow code can tell ``stream_closed`` from ``quota_exhausted`` without
parsing messages. Retryable: credit exhaustion (after ``retry_after``) and internal
errors; everything else is the caller's mistake and fails the activity at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from ductor_streams import errors
from ductor_streams.activities import error_types

_TYPES: dict[type[errors.StreamsError], str] = {
    errors.NotFound: error_types.NOT_FOUND,
    errors.ConsumerNotFound: error_types.NOT_FOUND,
    errors.DefinitionConflict: error_types.DEFINITION_CONFLICT,
    errors.StreamClosed: error_types.STREAM_CLOSED,
    errors.QuotaExhausted: error_types.QUOTA_EXHAUSTED,
    errors.TenantQuotaExhausted: error_types.TENANT_QUOTA_EXHAUSTED,
    errors.CreditExhausted: error_types.CREDIT_EXHAUSTED,
    errors.IdempotencyKeyReused: error_types.IDEMPOTENCY_KEY_REUSED,
    errors.CursorExpired: error_types.CURSOR_EXPIRED,
    errors.HistoryDiverged: error_types.HISTORY_DIVERGED,
    errors.AckRegression: error_types.ACK_REJECTED,
    errors.AckInFuture: error_types.ACK_REJECTED,
    errors.ObjectNotUploaded: error_types.OBJECT_REJECTED,
    errors.ObjectAborted: error_types.OBJECT_REJECTED,
    errors.ObjectExpired: error_types.OBJECT_REJECTED,
    errors.ObjectEvidenceMismatch: error_types.OBJECT_REJECTED,
    errors.ObjectTooLarge: error_types.OBJECT_REJECTED,
    errors.ObjectCommitted: error_types.OBJECT_REJECTED,
    errors.ObjectPruned: error_types.OBJECT_REJECTED,
}


def to_application_error(exc: errors.StreamsError) -> ApplicationError:
    """The ApplicationError that stands for a domain error."""
    details = {"code": exc.code, **exc.extra}
    if isinstance(exc, errors.CreditExhausted):
        # Benign: backpressure is the system working, not failing (no WARN traceback).
        return ApplicationError(
            exc.detail,
            details,
            type=error_types.CREDIT_EXHAUSTED,
            next_retry_delay=timedelta(seconds=exc.retry_after),
            category=ApplicationErrorCategory.BENIGN,
        )
    kind = next((t for cls, t in _TYPES.items() if isinstance(exc, cls)), None)
    if kind is None:
        kind = error_types.INVALID_REQUEST if exc.status < 500 else error_types.INTERNAL
    return ApplicationError(
        exc.detail, details, type=kind, non_retryable=kind != error_types.INTERNAL
    )


@contextlib.contextmanager
def domain_errors() -> Iterator[None]:
    """Raise the ApplicationError for any domain error raised inside the block."""
    try:
        yield
    except errors.StreamsError as exc:
        raise to_application_error(exc) from exc
