"""When and how long the client waits before trying a call again."""

from __future__ import annotations

import random

import httpx

# Answers after which the same request may well succeed a moment later: the server (a
# database restart answers 503 database_unavailable with Retry-After) or a proxy in front
# of it (502, 504) could not serve it now. Every call is retried on these and on
# transport errors; an append also on 429 credit_exhausted.
RETRYABLE_STATUSES = frozenset({502, 503, 504})
# Retries back off exponentially from FIRST_BACKOFF to MAX_BACKOFF seconds, each wait
# drawn between half and all of the current step (jitter: clients that failed together
# do not all come back at the same instant), and never shorter than Retry-After.
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 5.0
# A Retry-After is stretched by up to this fraction, for the same reason.
RETRY_AFTER_JITTER = 0.2


def retry_wait(backoff: float, retry_after: float | None) -> float:
    """Seconds to wait before the next try: between half and all of ``backoff``, and at
    least the server's ``retry_after`` (stretched by up to RETRY_AFTER_JITTER)."""
    wait = random.uniform(backoff / 2, backoff)
    if retry_after is not None:
        wait = max(wait, retry_after * random.uniform(1.0, 1.0 + RETRY_AFTER_JITTER))
    return wait


def retry_after_of(response: httpx.Response) -> float | None:
    """The response's ``Retry-After`` in seconds (the delay form only), if it has one."""
    raw = response.headers.get("retry-after", "").strip()
    return float(raw) if raw.isdigit() else None
