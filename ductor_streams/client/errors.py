"""Errors the client raises: one per condition a caller may want to handle."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """The server answered with a problem (RFC 9457); ``code`` is its stable machine code."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.code: str = str(problem.get("code", "http_error"))
        self.detail: str = str(problem.get("detail", ""))
        super().__init__(f"{status} {self.code}: {self.detail}")


class CursorExpiredError(ApiError):
    """Retention removed records after the cursor (HTTP 410, or an SSE ``error`` event).

    Resume from ``earliest_sequence - 1`` to accept the loss, or resynchronise.
    """

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(status, problem)
        self.requested_sequence = int(problem["requested_sequence"])
        self.earliest_sequence = int(problem["earliest_sequence"])
        self.latest_sequence = int(problem["latest_sequence"])
        self.resync_reason = str(problem.get("resync_reason", "retention"))


class HistoryDivergedError(ApiError):
    """HTTP 409 ``history_diverged``: the stream's record at the cursor is not the one
    whose fingerprint was sent, so the stream's history changed after it was read (a
    database failover lost commits, or a restore). Records after the cursor may not be
    the ones expected: re-read from cursor 0 (or from the last record whose fingerprint
    still matches) and reconcile what was derived from the records since.
    """

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(status, problem)
        self.sequence = int(problem.get("sequence", 0))
        self.fingerprint = problem.get("fingerprint")
        self.stored_fingerprint = problem.get("stored_fingerprint")
        self.earliest_sequence = int(problem.get("earliest_sequence", 1))
        self.latest_sequence = int(problem.get("latest_sequence", 0))


class CreditExhaustedError(ApiError):
    """HTTP 429: consumers must acknowledge first; the retry budget ran out."""

    def __init__(self, status: int, problem: dict[str, Any], retry_after: float) -> None:
        super().__init__(status, problem)
        self.retry_after = retry_after


class ConnectionLostError(Exception):
    """The server stayed unreachable for longer than the reconnect budget."""


def error_from(status: int, problem: Any, retry_after: float | None = None) -> ApiError:
    """The typed error for a problem body."""
    if not isinstance(problem, dict):
        problem = {"code": "http_error", "detail": str(problem)[:200]}
    if problem.get("code") == "cursor_expired" and "earliest_sequence" in problem:
        return CursorExpiredError(status, problem)
    if problem.get("code") == "history_diverged":
        return HistoryDivergedError(status, problem)
    if status == 429:
        return CreditExhaustedError(status, problem, retry_after or 1.0)
    return ApiError(status, problem)
