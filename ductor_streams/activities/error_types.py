"""``ApplicationError.type`` values raised by the activities and matched by the workflow
helpers and workflow code. Defined once, here; the mapping is ``activities.application_errors``."""

from __future__ import annotations

NOT_FOUND = "ductor_streams.NotFound"
INVALID_REQUEST = "ductor_streams.InvalidRequest"
DEFINITION_CONFLICT = "ductor_streams.DefinitionConflict"
STREAM_CLOSED = "ductor_streams.StreamClosed"
QUOTA_EXHAUSTED = "ductor_streams.QuotaExhausted"
TENANT_QUOTA_EXHAUSTED = "ductor_streams.TenantQuotaExhausted"
CREDIT_EXHAUSTED = "ductor_streams.CreditExhausted"
IDEMPOTENCY_KEY_REUSED = "ductor_streams.IdempotencyKeyReused"
CURSOR_EXPIRED = "ductor_streams.CursorExpired"
HISTORY_DIVERGED = "ductor_streams.HistoryDiverged"
ACK_REJECTED = "ductor_streams.AckRejected"
OBJECT_REJECTED = "ductor_streams.ObjectRejected"
INTERNAL = "ductor_streams.Internal"
